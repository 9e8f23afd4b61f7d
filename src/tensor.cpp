#include "rotary/tensor.hpp"

#include <initializer_list>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "rotary/error.hpp"

namespace rotary {
namespace {

// The product of `factors`, 0 when any is 0; throws when it leaves int64.
int64_t checked_product(const char* factory, const char* names, std::initializer_list<int64_t> factors) {
  for (int64_t f : factors) {
    if (f == 0) return 0;
  }
  int64_t product = 1;
  for (int64_t f : factors) {
    if (__builtin_mul_overflow(product, f, &product)) {
      throw Error(fmt::format("TensorView::{}: {}={} overflows int64", factory, names,
                              fmt::join(factors, "*")));
    }
  }
  return product;
}

}  // namespace

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::fp8_e5m2: return "fp8_e5m2";
    case DType::i8: return "i8";
  }
  return "?";
}

int64_t TensorView::elements() const {
  if (is_empty()) return 0;
  int64_t product = 1;
  for (int64_t extent : shape) {
    if (__builtin_mul_overflow(product, extent, &product)) {
      throw Error(fmt::format("shape [{}, {}, {}, {}] has more than 2^63 elements", shape[0],
                              shape[1], shape[2], shape[3]));
    }
  }
  return product;
}

TensorView TensorView::bshd(void* data, DType dtype, int64_t batch, int64_t seq, int64_t heads,
                            int64_t head_dim) {
  return TensorView{
      .data = data,
      .dtype = dtype,
      .shape = {batch, seq, heads, head_dim},
      .strides = {checked_product("bshd", "seq*heads*head_dim", {seq, heads, head_dim}),
                  checked_product("bshd", "heads*head_dim", {heads, head_dim}), head_dim, 1}};
}

TensorView TensorView::bhsd(void* data, DType dtype, int64_t batch, int64_t heads, int64_t seq,
                            int64_t head_dim) {
  return TensorView{
      .data = data,
      .dtype = dtype,
      .shape = {batch, seq, heads, head_dim},
      .strides = {checked_product("bhsd", "heads*seq*head_dim", {heads, seq, head_dim}), head_dim,
                  checked_product("bhsd", "seq*head_dim", {seq, head_dim}), 1}};
}

}  // namespace rotary
