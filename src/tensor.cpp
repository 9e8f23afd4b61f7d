#include "rotary/tensor.hpp"

namespace rotary {

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

int64_t size_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16:
    case DType::bf16: return 2;
  }
  return 1;
}

TensorView TensorView::bshd(void* data, DType dtype, int64_t batch, int64_t seq, int64_t heads,
                            int64_t head_dim) {
  return TensorView{.data = data,
                    .dtype = dtype,
                    .shape = {batch, seq, heads, head_dim},
                    .strides = {seq * heads * head_dim, heads * head_dim, head_dim, 1}};
}

TensorView TensorView::bhsd(void* data, DType dtype, int64_t batch, int64_t heads, int64_t seq,
                            int64_t head_dim) {
  return TensorView{.data = data,
                    .dtype = dtype,
                    .shape = {batch, seq, heads, head_dim},
                    .strides = {heads * seq * head_dim, head_dim, seq * head_dim, 1}};
}

}  // namespace rotary
