#include "rotary/pairing.hpp"

#include <cstring>

#include <fmt/format.h>

#include "memory.hpp"
#include "rotary/error.hpp"

namespace rotary {
namespace {

void check_pairing(Pairing pairing, const char* what) {
  if (pairing != Pairing::interleaved && pairing != Pairing::half) {
    throw Error(fmt::format("{}={} is not interleaved or half", what, static_cast<int>(pairing)));
  }
}

// Do [a, a + bytes) and [b, b + bytes) intersect? Unsigned differences: no pointer arithmetic
// past either buffer, no wrap-around.
bool buffers_overlap(const void* a, const void* b, int64_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return (x <= y ? y - x : x - y) < static_cast<uintptr_t>(bytes);
}

}  // namespace

std::vector<int64_t> pairing_permutation(int64_t head_dim, int64_t rotary_dim, Pairing from,
                                         Pairing to) {
  check_pairing(from, "from");
  check_pairing(to, "to");
  if (head_dim <= 0) throw Error(fmt::format("head_dim={} must be > 0", head_dim));
  const int64_t r = rotary_dim == 0 ? head_dim : rotary_dim;
  if (r <= 0 || r % 2 != 0 || r > head_dim) {
    throw Error(fmt::format("rotary_dim={} must be even, > 0 and <= head_dim={}", r, head_dim));
  }
  std::vector<int64_t> source(static_cast<size_t>(head_dim));
  for (int64_t j = 0; j < head_dim; ++j) source[static_cast<size_t>(j)] = j;
  if (from == to) return source;
  const int64_t half = r / 2;
  for (int64_t i = 0; i < half; ++i) {
    if (from == Pairing::interleaved) {  // -> half
      source[static_cast<size_t>(i)] = 2 * i;
      source[static_cast<size_t>(i + half)] = 2 * i + 1;
    } else {  // half -> interleaved
      source[static_cast<size_t>(2 * i)] = i;
      source[static_cast<size_t>(2 * i + 1)] = i + half;
    }
  }
  return source;
}

void permute_rows(const void* src, void* dst, const PermuteRowsArgs& args) {
  if (args.num_heads < 0) throw Error(fmt::format("num_heads={} must be >= 0", args.num_heads));
  if (args.row_bytes <= 0) throw Error(fmt::format("row_bytes={} must be > 0", args.row_bytes));
  const std::vector<int64_t> source =
      pairing_permutation(args.head_dim, args.rotary_dim, args.from, args.to);
  int64_t rows = 0;
  int64_t bytes = 0;
  if (__builtin_mul_overflow(args.num_heads, args.head_dim, &rows) ||
      __builtin_mul_overflow(rows, args.row_bytes, &bytes) || bytes >= max_view_bytes) {
    throw Error(fmt::format("num_heads={} * head_dim={} * row_bytes={} must be < 2^60 bytes "
                            "(max_view_bytes)",
                            args.num_heads, args.head_dim, args.row_bytes));
  }
  if (rows == 0) return;
  if (src == nullptr || dst == nullptr) throw Error("permute_rows: src or dst is null");
  if (buffers_overlap(src, dst, bytes)) {
    throw Error("permute_rows: src and dst overlap (the permutation needs a separate output)");
  }
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  for (int64_t h = 0; h < args.num_heads; ++h) {
    for (int64_t j = 0; j < args.head_dim; ++j) {
      const int64_t from_row = h * args.head_dim + source[static_cast<size_t>(j)];
      const int64_t to_row = h * args.head_dim + j;
      std::memcpy(out + to_row * args.row_bytes, in + from_row * args.row_bytes,
                  static_cast<size_t>(args.row_bytes));
    }
  }
}

void permute_channels(const TensorView& in, const TensorView& out, int64_t rotary_dim, Pairing from,
                      Pairing to) {
  if (!in.is_set() || !out.is_set()) {
    throw Error("permute_channels: in or out is not set (TensorView{}: data null, shape all 0)");
  }
  detail::check_view(in, "in");
  detail::check_view(out, "out");
  if (in.dtype != out.dtype) {
    throw Error(fmt::format("out.dtype={} differs from in.dtype={}", to_string(out.dtype),
                            to_string(in.dtype)));
  }
  if (in.shape != out.shape) {
    throw Error(fmt::format("out shape {} differs from in shape {}", detail::shape_text(out),
                            detail::shape_text(in)));
  }
  if (detail::self_overlaps(out)) throw Error("permute_channels: out strides make elements overlap");
  if (detail::may_overlap(in, out)) throw Error("permute_channels: in and out overlap");
  const std::vector<int64_t> source = pairing_permutation(in.head_dim(), rotary_dim, from, to);
  if (in.is_empty()) return;  // also never loops over the other, possibly huge, extents
  const int64_t es = size_of(in.dtype);
  const auto* src = static_cast<const unsigned char*>(in.data);
  auto* dst = static_cast<unsigned char*>(out.data);
  for (int64_t b = 0; b < in.batch(); ++b) {
    for (int64_t s = 0; s < in.seq(); ++s) {
      for (int64_t h = 0; h < in.heads(); ++h) {
        const int64_t in_base = b * in.strides[0] + s * in.strides[1] + h * in.strides[2];
        const int64_t out_base = b * out.strides[0] + s * out.strides[1] + h * out.strides[2];
        for (int64_t j = 0; j < in.head_dim(); ++j) {
          const int64_t from_index = in_base + source[static_cast<size_t>(j)] * in.strides[3];
          std::memcpy(dst + (out_base + j * out.strides[3]) * es, src + from_index * es,
                      static_cast<size_t>(es));
        }
      }
    }
  }
}

}  // namespace rotary
