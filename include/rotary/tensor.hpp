// rotary — non-owning views of activations and of token positions.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "rotary/positions.hpp"

namespace rotary {

/// Element types. f16 is IEEE binary16, bf16 is bfloat16, both passed as 16-bit storage.
/// fp8_e4m3 (OCP E4M3FN), fp8_e5m2 and i8 are cache dtypes only (rotary/fused.hpp: KV caches and
/// quantised q); apply and the other front ends refuse them.
enum class DType { f32, f64, f16, bf16, fp8_e4m3, fp8_e5m2, i8 };

/// A model dtype (f32, f64, f16, bf16): what apply rotates.
constexpr bool is_model_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16 || dtype == DType::bf16;
}
/// A quantised cache dtype (fp8_e4m3, fp8_e5m2, i8): stored with a scale (rotary/fused.hpp).
constexpr bool is_quantised_dtype(DType dtype) {
  return dtype == DType::fp8_e4m3 || dtype == DType::fp8_e5m2 || dtype == DType::i8;
}

std::string_view to_string(DType dtype);
/// Bytes per element (1 for a value that is not a DType).
constexpr int64_t size_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
    case DType::i8: return 1;
  }
  return 1;
}

/// The most bytes one view may span: validate (apply, permute_channels) rejects a non-empty view
/// whose elements reach, from the lowest to the highest byte, max_view_bytes or more, i.e.
///   (1 + sum over dims of |stride| * (extent - 1)) * size_of(dtype) >= 2^60.
/// No memory is that large; the bound keeps every offset the kernels and the aliasing checks
/// form, in elements or in bytes, far from int64 overflow.
inline constexpr int64_t max_view_bytes = int64_t{1} << 60;

/// A strided view of activations, logical shape [batch, seq, heads, head_dim], strides in elements
/// (any sign), so [b,s,h,d], [b,h,s,d], fused-QKV slices and transposed tensors need no copy.
/// Non-owning; the caller keeps the memory alive and sized for every index the strides reach.
///
/// Three states, as torch has them:
///   absent: data null and shape all 0, as `TensorView{}` (!is_set()): how apply's k, q_out and
///           k_out say "not given".
///   empty:  some extent 0 (is_empty()): no element, nothing read or written, data may be null and
///           the strides are anything (torch gives an empty tensor a null data pointer).
///   set and non-empty: data must not be null, and the view must span < max_view_bytes.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::array<int64_t, 4> shape{};    ///< [batch, seq, heads, head_dim]
  std::array<int64_t, 4> strides{};  ///< elements between neighbours along each dimension

  int64_t batch() const { return shape[0]; }
  int64_t seq() const { return shape[1]; }
  int64_t heads() const { return shape[2]; }
  int64_t head_dim() const { return shape[3]; }
  /// Number of elements: 0 when any extent is 0, whatever the others. Throws rotary::Error when
  /// the product leaves int64 (a view that validate accepts never does).
  int64_t elements() const;
  /// Some extent is 0: the view has no element (data may be null).
  bool is_empty() const { return shape[0] == 0 || shape[1] == 0 || shape[2] == 0 || shape[3] == 0; }
  /// Given at all: false only for an absent view, data null and shape all 0 (TensorView{}).
  bool is_set() const {
    return data != nullptr || (shape[0] | shape[1] | shape[2] | shape[3]) != 0;  // no memcmp: apply asks per call
  }

  /// Memory laid out [batch, seq, heads, head_dim], contiguous. Throws rotary::Error when a
  /// stride (a product of extents) leaves int64; a product with a zero extent is 0.
  static TensorView bshd(void* data, DType dtype, int64_t batch, int64_t seq, int64_t heads,
                         int64_t head_dim);
  /// Memory laid out [batch, heads, seq, head_dim], contiguous, seen as [batch, seq, heads, head_dim].
  /// Throws rotary::Error as bshd does.
  static TensorView bhsd(void* data, DType dtype, int64_t batch, int64_t heads, int64_t seq,
                         int64_t head_dim);
};

}  // namespace rotary
