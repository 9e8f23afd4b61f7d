#include "memory.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "rotary/error.hpp"

namespace rotary::detail {
namespace {

bool known(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16 || dtype == DType::bf16;
}

// |x| without overflow, INT64_MIN included.
uint64_t magnitude(int64_t x) {
  return x < 0 ? uint64_t{0} - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
}

// Byte addresses as 128-bit integers: a view within max_view_bytes of any pointer value, even a
// bogus one near the top of the address space, neither wraps nor overflows.
using Address = __int128;

struct Range {
  Address lo;
  Address hi;  // exclusive
};

// Requires: non-empty and within max_view_bytes (so every product below is < 2^60).
Range byte_range(const TensorView& v) {
  const int64_t es = size_of(v.dtype);
  int64_t lo = 0;
  int64_t hi = 0;
  for (int d = 0; d < 4; ++d) {
    if (v.shape[d] <= 1) continue;
    const int64_t span = v.strides[d] * (v.shape[d] - 1);
    (span < 0 ? lo : hi) += span;
  }
  const auto base = static_cast<Address>(reinterpret_cast<uintptr_t>(v.data));
  return {base + Address{lo} * es, base + Address{hi + 1} * es};
}

// Normalised view: strides made non-negative (moving the base), unit dims dropped.
struct Dims {
  int count = 0;
  std::array<int64_t, 4> stride{};
  std::array<int64_t, 4> extent{};
  int64_t base = 0;  // element offset of the lowest element relative to data
};

// Requires: within max_view_bytes.
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
// Bounds (callers): |delta| and every |lo[k] * stride[k]|, |hi[k] * stride[k]| and their sums are
// below 2^61, so nothing here overflows.
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

// Elements of a non-empty row-major dense view (strides [s1*n1, n2*n3, n3, 1] for shape [n0, n1, n2, n3]),
// or 0 when the view is empty, not dense, or its element count overflows. Such a view reaches exactly
// its element count and no two of its elements overlap: the validation of a call's usual tensors
// (every decode and prefill view a framework hands over) answers from this alone.
int64_t dense_elements(const TensorView& v) {
  int64_t inner = 0;
  int64_t outer = 0;
  int64_t all = 0;
  if (v.strides[3] != 1 || v.strides[2] != v.shape[3] || v.shape[0] <= 0 || v.shape[1] <= 0 ||
      v.shape[2] <= 0 || v.shape[3] <= 0 || __builtin_mul_overflow(v.shape[2], v.shape[3], &inner) ||
      v.strides[1] != inner || __builtin_mul_overflow(inner, v.shape[1], &outer) || v.strides[0] != outer ||
      __builtin_mul_overflow(outer, v.shape[0], &all)) {
    return 0;
  }
  return all;
}

// exceeds_max_view_bytes of a dense view of n elements: its reach is n (the general sum, term by term).
bool dense_exceeds(int64_t n, DType dtype) {
  uint64_t bytes = 0;
  return __builtin_mul_overflow(static_cast<uint64_t>(n), static_cast<uint64_t>(size_of(dtype)), &bytes) ||
         bytes >= static_cast<uint64_t>(max_view_bytes);
}

}  // namespace

std::string shape_text(const TensorView& v) {
  return fmt::format("[{}, {}, {}, {}]", v.shape[0], v.shape[1], v.shape[2], v.shape[3]);
}

void check_view(const TensorView& v, const char* name) {
  // A dense view of a known dtype with data passes every check below but the span's (the usual case).
  if (known(v.dtype) && v.data != nullptr) {
    if (const int64_t n = dense_elements(v); n > 0 && !dense_exceeds(n, v.dtype)) return;
  }
  if (!known(v.dtype)) {
    if (is_quantised_dtype(v.dtype)) {
      throw Error(fmt::format("{}.dtype={} is a cache dtype (rope_store, rerotate_cache: rotary/fused.hpp); "
                              "this takes f32, f64, f16 or bf16", name, to_string(v.dtype)));
    }
    throw Error(fmt::format("{}.dtype={} is not f32, f64, f16 or bf16", name, static_cast<int>(v.dtype)));
  }
  static constexpr const char* dim_names[4] = {"batch", "seq", "heads", "head_dim"};
  for (int d = 0; d < 4; ++d) {
    if (v.shape[d] < 0) {
      throw Error(fmt::format("{}.{}={} must be >= 0", name, dim_names[d], v.shape[d]));
    }
  }
  if (v.data == nullptr && !v.is_empty()) {
    throw Error(fmt::format("{}.data is null but {} shape {} is not empty", name, name, shape_text(v)));
  }
  if (exceeds_max_view_bytes(v)) {
    throw Error(fmt::format("{} strides [{}, {}, {}, {}] with shape {} span 2^60 bytes or more "
                            "(max_view_bytes)",
                            name, v.strides[0], v.strides[1], v.strides[2], v.strides[3],
                            shape_text(v)));
  }
}

bool exceeds_max_view_bytes(const TensorView& v) {
  if (const int64_t n = dense_elements(v); n > 0) return dense_exceeds(n, v.dtype);
  if (v.is_empty()) return false;
  uint64_t reach = 1;  // elements from the lowest to the highest, inclusive
  for (int d = 0; d < 4; ++d) {
    if (v.shape[d] < 0) return true;
    uint64_t term = 0;
    if (__builtin_mul_overflow(magnitude(v.strides[d]), static_cast<uint64_t>(v.shape[d] - 1), &term) ||
        __builtin_add_overflow(reach, term, &reach)) {
      return true;
    }
  }
  uint64_t bytes = 0;
  return __builtin_mul_overflow(reach, static_cast<uint64_t>(size_of(v.dtype)), &bytes) ||
         bytes >= static_cast<uint64_t>(max_view_bytes);
}

bool self_overlaps(const TensorView& v) {
  if (v.is_empty()) return false;
  if (exceeds_max_view_bytes(v)) return true;
  return self_overlaps_checked(v);
}

bool self_overlaps_checked(const TensorView& v) {
  if (dense_elements(v) > 0) return false;
  if (v.is_empty()) return false;
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

namespace {

// A view as rows: its dimensions 0 and 1 (batch, seq) one arithmetic progression of `rows` row
// starts `pitch` bytes apart, and dimensions 2 and 3 (heads, channels) within bytes [lo, hi) of each
// row start. False when dimensions 0 and 1 do not form one progression (a batch stride that is not
// seq times the seq stride), or a row's bytes reach the next row.
struct Rows {
  Address first = 0;  // the lowest byte of the first row
  int64_t rows = 1;
  int64_t pitch = 0;  // bytes, > 0 when rows > 1
  int64_t width = 0;  // bytes each row's elements span
};

// Requires: non-empty and within max_view_bytes.
bool as_rows(const TensorView& v, Rows& out) {
  const int64_t es = size_of(v.dtype);
  int64_t rows = 1;
  int64_t pitch = 0;
  int64_t base = 0;  // elements from data to the first row's start (a negative outer stride moves it)
  for (int d = 1; d >= 0; --d) {
    if (v.shape[d] <= 1) continue;
    const int64_t stride = v.strides[d] < 0 ? -v.strides[d] : v.strides[d];
    if (v.strides[d] < 0) base += v.strides[d] * (v.shape[d] - 1);
    if (rows == 1) {
      pitch = stride;
    } else if (stride != pitch * rows) {
      return false;
    }
    rows *= v.shape[d];
  }
  int64_t lo = 0;
  int64_t hi = 0;
  for (int d = 2; d < 4; ++d) {
    if (v.shape[d] <= 1) continue;
    const int64_t span = v.strides[d] * (v.shape[d] - 1);
    (span < 0 ? lo : hi) += span;
  }
  out.rows = rows;
  out.pitch = pitch * es;
  out.width = (hi - lo + 1) * es;
  out.first = static_cast<Address>(reinterpret_cast<uintptr_t>(v.data)) + Address{base + lo} * es;
  return rows == 1 || (out.pitch > 0 && out.width <= out.pitch);
}

// Whether two views are disjoint as rows of one pitch: fused QKV's q, k and v column slices of the
// same token rows, whatever their head counts and widths. Row n of a covers [A + nP, A + nP + wa),
// row m of b [B + mP, B + mP + wb); they meet iff -wb < (B - A) + (m - n) P < wa, and with wa, wb
// <= P at most two values of k = m - n do.
bool disjoint_rows(const TensorView& a, const TensorView& b) {
  Rows ra;
  Rows rb;
  if (!as_rows(a, ra) || !as_rows(b, rb)) return false;
  const int64_t pitch = ra.rows > 1 ? ra.pitch : rb.pitch;
  if ((ra.rows > 1 && ra.pitch != pitch) || (rb.rows > 1 && rb.pitch != pitch)) return false;
  const Address delta = rb.first - ra.first;
  if (pitch == 0) return delta <= -Address{rb.width} || delta >= Address{ra.width};  // one row each
  if (ra.width > pitch || rb.width > pitch) return false;
  // The smallest k with delta + k P > -wb: k0 = floor((-wb - delta) / P) + 1.
  const Address num = -Address{rb.width} - delta;
  Address k0 = num / pitch;
  if (num % pitch != 0 && num < 0) --k0;
  ++k0;
  for (Address k = k0; k <= k0 + 1; ++k) {
    if (k < -Address{ra.rows - 1} || k > Address{rb.rows - 1}) continue;
    const Address x = delta + k * pitch;
    if (x > -Address{rb.width} && x < Address{ra.width}) return false;
  }
  return true;
}

}  // namespace

constexpr __int128 kAll = __int128{1} << 100;  // beyond any address and span

ByteSpan byte_span(const TensorView& view) {
  if (view.is_empty() || exceeds_max_view_bytes(view)) return ByteSpan{-kAll, kAll};
  const Range r = byte_range(view);
  return ByteSpan{r.lo, r.hi};
}

ByteSpan byte_span_checked(const TensorView& view) {
  if (view.is_empty()) return ByteSpan{2 * kAll, 2 * kAll};  // meets nothing: lo is above every hi
  const Range r = byte_range(view);
  return ByteSpan{r.lo, r.hi};
}

TensorView bytes_view(const void* data, int64_t count, int64_t element_bytes) {
  int64_t bytes = 0;
  if (data == nullptr || count <= 0 || element_bytes <= 0) return TensorView{.dtype = DType::i8};  // empty
  if (__builtin_mul_overflow(count, element_bytes, &bytes) || bytes > max_view_bytes) bytes = max_view_bytes;
  return TensorView{.data = const_cast<void*>(data), .dtype = DType::i8, .shape = {1, 1, 1, bytes},
                    .strides = {bytes, bytes, bytes, 1}};
}

bool may_overlap(const TensorView& a, const TensorView& b) {
  if (a.is_empty() || b.is_empty()) return false;
  if (exceeds_max_view_bytes(a) || exceeds_max_view_bytes(b)) return true;
  return may_overlap_checked(a, b);
}

bool may_overlap_checked(const TensorView& a, const TensorView& b) {
  const int64_t na = dense_elements(a);
  const int64_t nb = dense_elements(b);
  if (na > 0 && nb > 0) {  // byte_range of a dense view: [data, data + n * size)
    const auto lo_a = static_cast<Address>(reinterpret_cast<uintptr_t>(a.data));
    const auto lo_b = static_cast<Address>(reinterpret_cast<uintptr_t>(b.data));
    if (lo_a + Address{na} * size_of(a.dtype) <= lo_b || lo_b + Address{nb} * size_of(b.dtype) <= lo_a) {
      return false;
    }
  }
  if (a.is_empty() || b.is_empty()) return false;
  const Range ra = byte_range(a);
  const Range rb = byte_range(b);
  if (ra.hi <= rb.lo || rb.hi <= ra.lo) return false;
  if (a.dtype != b.dtype || a.strides != b.strides) return !disjoint_rows(a, b);
  const int64_t es = size_of(a.dtype);
  // The ranges intersect and each spans < 2^60 bytes: |byte_delta| < 2^61.
  const auto byte_delta = static_cast<int64_t>(static_cast<Address>(reinterpret_cast<uintptr_t>(b.data)) -
                                               static_cast<Address>(reinterpret_cast<uintptr_t>(a.data)));
  if (byte_delta % es != 0) return true;
  // Element i of a meets element j of b when sum_k (i_k - j_k) stride_k = delta, with
  // -(b.shape[k] - 1) <= i_k - j_k <= a.shape[k] - 1. A dimension of extent 1 in both adds nothing,
  // whatever its stride (which the span bound leaves unconstrained); any other stride is bounded.
  const int64_t delta = byte_delta / es;
  std::array<int64_t, 4> stride{};
  std::array<int64_t, 4> lo{};
  std::array<int64_t, 4> hi{};
  for (int d = 0; d < 4; ++d) {
    if (a.shape[d] == 1 && b.shape[d] == 1) continue;
    stride[d] = a.strides[d];
    lo[d] = -(b.shape[d] - 1);
    hi[d] = a.shape[d] - 1;
    if (stride[d] < 0) {  // flip sign so strides are non-negative
      stride[d] = -stride[d];
      std::swap(lo[d], hi[d]);
      lo[d] = -lo[d];
      hi[d] = -hi[d];
    }
  }
  std::array<int, 4> order{0, 1, 2, 3};
  std::sort(order.begin(), order.end(), [&](int x, int y) { return stride[x] > stride[y]; });
  std::array<int64_t, 4> sorted_stride{};
  std::array<int64_t, 4> sorted_lo{};
  std::array<int64_t, 4> sorted_hi{};
  for (int i = 0; i < 4; ++i) {
    sorted_stride[i] = stride[order[i]];
    sorted_lo[i] = lo[order[i]];
    sorted_hi[i] = hi[order[i]];
  }
  int64_t budget = 4096;
  return representable(delta, sorted_stride, sorted_lo, sorted_hi, 0, 4, budget);
}

}  // namespace rotary::detail
