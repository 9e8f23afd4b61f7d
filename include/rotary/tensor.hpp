// rotary — non-owning views of activations and of token positions.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

namespace rotary {

/// Element types. f16 is IEEE binary16, bf16 is bfloat16, both passed as 16-bit storage.
enum class DType { f32, f64, f16, bf16 };

std::string_view to_string(DType dtype);
/// Bytes per element.
int64_t size_of(DType dtype);

/// A strided view of activations, logical shape [batch, seq, heads, head_dim], strides in elements
/// (any sign), so [b,s,h,d], [b,h,s,d], fused-QKV slices and transposed tensors need no copy.
/// Non-owning; the caller keeps the memory alive and sized for every index the strides reach.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::array<int64_t, 4> shape{};    ///< [batch, seq, heads, head_dim]
  std::array<int64_t, 4> strides{};  ///< elements between neighbours along each dimension

  int64_t batch() const { return shape[0]; }
  int64_t seq() const { return shape[1]; }
  int64_t heads() const { return shape[2]; }
  int64_t head_dim() const { return shape[3]; }
  int64_t elements() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  bool is_set() const { return data != nullptr; }

  /// Memory laid out [batch, seq, heads, head_dim], contiguous.
  static TensorView bshd(void* data, DType dtype, int64_t batch, int64_t seq, int64_t heads,
                         int64_t head_dim);
  /// Memory laid out [batch, heads, seq, head_dim], contiguous, seen as [batch, seq, heads, head_dim].
  static TensorView bhsd(void* data, DType dtype, int64_t batch, int64_t heads, int64_t seq,
                         int64_t head_dim);
};

/// Which position each token has.
///   sequential: token s of every batch row is at offset + s (prefill, or decode with one offset)
///   per_token:  a [batch, seq] array, int32 or int64, row-major (KV-cache decode, batched decode at
///               different lengths, packed sequences)
/// Every position must lie in [0, 2^31). Non-owning: the array must outlive the call using it.
struct Positions {
  enum class Kind { sequential, per_token_i32, per_token_i64 };
  Kind kind = Kind::sequential;
  int64_t offset = 0;          ///< sequential only
  const void* data = nullptr;  ///< per_token only
  int64_t count = 0;           ///< per_token only: number of entries, must equal batch * seq

  static Positions sequential(int64_t offset = 0) { return Positions{.offset = offset}; }
  static Positions per_token(std::span<const int32_t> positions) {
    return Positions{.kind = Kind::per_token_i32, .data = positions.data(),
                     .count = static_cast<int64_t>(positions.size())};
  }
  static Positions per_token(std::span<const int64_t> positions) {
    return Positions{.kind = Kind::per_token_i64, .data = positions.data(),
                     .count = static_cast<int64_t>(positions.size())};
  }
  /// Position of token (b, s), where index = b * seq + s.
  int64_t at(int64_t index, int64_t s) const {
    switch (kind) {
      case Kind::per_token_i32: return static_cast<const int32_t*>(data)[index];
      case Kind::per_token_i64: return static_cast<const int64_t*>(data)[index];
      default: return offset + s;
    }
  }
};

}  // namespace rotary
