#include "memory.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>

namespace rotary::detail {
namespace {

constexpr int64_t kReachLimit = int64_t{1} << 60;

bool empty(const TensorView& v) {
  return v.shape[0] == 0 || v.shape[1] == 0 || v.shape[2] == 0 || v.shape[3] == 0;
}

struct Range {
  intptr_t lo;
  intptr_t hi;  // exclusive
};

Range byte_range(const TensorView& v) {
  const int64_t es = size_of(v.dtype);
  int64_t lo = 0;
  int64_t hi = 0;
  for (int d = 0; d < 4; ++d) {
    const int64_t span = v.strides[d] * (v.shape[d] - 1);
    (span < 0 ? lo : hi) += span;
  }
  const auto base = reinterpret_cast<intptr_t>(v.data);
  return {base + lo * es, base + (hi + 1) * es};
}

// Normalised view: strides made non-negative (moving the base), unit dims dropped.
struct Dims {
  int count = 0;
  std::array<int64_t, 4> stride{};
  std::array<int64_t, 4> extent{};
  int64_t base = 0;  // element offset of the lowest element relative to data
};

Dims normalise(const TensorView& v) {
  Dims out;
  for (int d = 0; d < 4; ++d) {
    if (v.shape[d] <= 1) continue;
    int64_t s = v.strides[d];
    if (s < 0) {
      out.base += s * (v.shape[d] - 1);
      s = -s;
    }
    out.stride[out.count] = s;
    out.extent[out.count] = v.shape[d];
    ++out.count;
  }
  return out;
}

// Does delta = sum_k d_k * stride[k] have a solution with lo[k] <= d_k <= hi[k]?
// Dimensions sorted by stride, largest first; at each the feasible d_k form an interval given the
// reach of the smaller ones (one or two values when strides are nested). `budget` caps the search.
bool representable(int64_t delta, const std::array<int64_t, 4>& stride,
                   const std::array<int64_t, 4>& lo, const std::array<int64_t, 4>& hi, int k,
                   int count, int64_t& budget) {
  if (--budget < 0) return true;  // give up: report a possible overlap
  if (k == count) return delta == 0;
  int64_t rest_min = 0;
  int64_t rest_max = 0;
  for (int m = k + 1; m < count; ++m) {
    rest_min += lo[m] * stride[m];
    rest_max += hi[m] * stride[m];
  }
  const int64_t s = stride[k];
  if (s == 0) return representable(delta, stride, lo, hi, k + 1, count, budget);
  auto floor_div = [](int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); };
  int64_t first = -floor_div(-(delta - rest_max), s);  // ceil
  int64_t last = floor_div(delta - rest_min, s);
  first = std::max(first, lo[k]);
  last = std::min(last, hi[k]);
  for (int64_t d = first; d <= last; ++d) {
    if (representable(delta - d * s, stride, lo, hi, k + 1, count, budget)) return true;
  }
  return false;
}

}  // namespace

bool reach_overflows(const TensorView& v) {
  int64_t total = 0;
  for (int d = 0; d < 4; ++d) {
    if (v.shape[d] <= 1) continue;
    const int64_t s = std::llabs(v.strides[d]);
    if (s != 0 && v.shape[d] - 1 > kReachLimit / s) return true;
    total += s * (v.shape[d] - 1);
    if (total > kReachLimit) return true;
  }
  return false;
}

bool self_overlaps(const TensorView& v) {
  if (empty(v)) return false;
  Dims dims = normalise(v);
  // Insertion sort of the (at most 4) dimensions by stride, ascending.
  std::array<int, 4> order{0, 1, 2, 3};
  for (int i = 1; i < dims.count; ++i) {
    for (int j = i; j > 0 && dims.stride[order[j]] < dims.stride[order[j - 1]]; --j) {
      std::swap(order[j], order[j - 1]);
    }
  }
  int64_t reach = 0;  // largest offset reachable with the smaller dimensions
  for (int i = 0; i < dims.count; ++i) {
    const int d = order[i];
    if (dims.stride[d] <= reach) return true;
    reach += dims.stride[d] * (dims.extent[d] - 1);
  }
  return false;
}

bool same_view(const TensorView& a, const TensorView& b) {
  return a.data == b.data && a.dtype == b.dtype && a.shape == b.shape && a.strides == b.strides;
}

bool may_overlap(const TensorView& a, const TensorView& b) {
  if (empty(a) || empty(b)) return false;
  const Range ra = byte_range(a);
  const Range rb = byte_range(b);
  if (ra.hi <= rb.lo || rb.hi <= ra.lo) return false;
  if (a.dtype != b.dtype || a.strides != b.strides) return true;
  const int64_t es = size_of(a.dtype);
  const intptr_t byte_delta = reinterpret_cast<intptr_t>(b.data) - reinterpret_cast<intptr_t>(a.data);
  if (byte_delta % es != 0) return true;
  // Element i of a meets element j of b when sum_k (i_k - j_k) stride_k = delta.
  const int64_t delta = byte_delta / es;
  std::array<int64_t, 4> stride{};
  std::array<int64_t, 4> lo{};
  std::array<int64_t, 4> hi{};
  std::array<int, 4> order{0, 1, 2, 3};
  std::sort(order.begin(), order.end(),
            [&](int x, int y) { return std::llabs(a.strides[x]) > std::llabs(a.strides[y]); });
  for (int i = 0; i < 4; ++i) {
    const int d = order[i];
    stride[i] = a.strides[d];
    lo[i] = -(b.shape[d] - 1);
    hi[i] = a.shape[d] - 1;
    if (stride[i] < 0) {  // flip sign so strides are non-negative
      stride[i] = -stride[i];
      std::swap(lo[i], hi[i]);
      lo[i] = -lo[i];
      hi[i] = -hi[i];
    }
  }
  int64_t budget = 4096;
  return representable(delta, stride, lo, hi, 0, 4, budget);
}

}  // namespace rotary::detail
