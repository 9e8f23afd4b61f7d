// The scalar reference kernel: the oracle every fast kernel is tested against.
// Written straight from the rotation formula; no vectorisation, no threads.
#include <cstring>
#include <vector>

#include "../half.hpp"
#include "../kernel.hpp"
#include "rotary/angle.hpp"

namespace rotary::detail {
namespace {

// Storage <-> arithmetic. f32/f16/bf16 compute in float32 precision semantics: the double result
// below is rounded to float (one rounding), then f16/bf16 round once more from that float, so a
// 16-bit result is exactly the f32 result rounded once.
template <class T>
struct Storage;
template <>
struct Storage<float> {
  static double load(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
  static void store(void* p, int64_t i, double v) { static_cast<float*>(p)[i] = static_cast<float>(v); }
};
template <>
struct Storage<double> {
  static double load(const void* p, int64_t i) { return static_cast<const double*>(p)[i]; }
  static void store(void* p, int64_t i, double v) { static_cast<double*>(p)[i] = v; }
};
struct F16 {};
struct BF16 {};
template <>
struct Storage<F16> {
  static double load(const void* p, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, int64_t i, double v) {
    static_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v));
  }
};
template <>
struct Storage<BF16> {
  static double load(const void* p, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, int64_t i, double v) {
    static_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v));
  }
};

template <class T>
void rotate_head(const Plan& plan, const Operand& op, int64_t in_offset, int64_t out_offset,
                 const double* cos_row, const double* sin_row, int64_t element_size) {
  const int64_t pairs = plan.rotary_dim / 2;
  const int64_t in_d = op.in_strides[3];
  const int64_t out_d = op.out_strides[3];
  const auto* in_bytes = static_cast<const unsigned char*>(op.in);
  auto* out_bytes = static_cast<unsigned char*>(op.out);
  const void* in = in_bytes + in_offset * element_size;
  void* out = out_bytes + out_offset * element_size;
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t ia = plan.pairing == Pairing::interleaved ? 2 * i : i;
    const int64_t ib = plan.pairing == Pairing::interleaved ? 2 * i + 1 : i + pairs;
    const double a = Storage<T>::load(in, ia * in_d);
    const double b = Storage<T>::load(in, ib * in_d);
    const double c = cos_row[i];
    const double s = sin_row[i];
    Storage<T>::store(out, ia * out_d, a * c - b * s);
    Storage<T>::store(out, ib * out_d, a * s + b * c);
  }
  if (!op.in_place && plan.copy_tail) {
    for (int64_t j = plan.rotary_dim; j < plan.head_dim; ++j) {
      std::memcpy(static_cast<unsigned char*>(out) + j * out_d * element_size,
                  static_cast<const unsigned char*>(in) + j * in_d * element_size,
                  static_cast<size_t>(element_size));
    }
  }
}

template <class T>
void run(const Plan& plan) {
  const int64_t pairs = plan.rotary_dim / 2;
  const int64_t element_size = size_of(plan.dtype);
  std::vector<double> cos_row(static_cast<size_t>(pairs));
  std::vector<double> sin_row(static_cast<size_t>(pairs));
  const Schedule& schedule = *plan.schedule;
  const double sign = plan.inverse ? -1.0 : 1.0;
  for (int64_t b = 0; b < plan.batch; ++b) {
    for (int64_t s = 0; s < plan.seq; ++s) {
      const int64_t position = plan.positions.at(b * plan.seq + s, s);
      if (plan.table != nullptr) {
        const int64_t row = *plan.table->row_of(position);
        const float* c = plan.table->cos_row(row);
        const float* sn = plan.table->sin_row(row);
        for (int64_t i = 0; i < pairs; ++i) {
          cos_row[i] = c[i];
          sin_row[i] = sign * sn[i];
        }
      } else {
        for (int64_t i = 0; i < pairs; ++i) {
          const CosSin cs = exact_cos_sin(position, schedule.inv_freq[static_cast<size_t>(i)]);
          cos_row[i] = cs.cos * schedule.attention_factor;
          sin_row[i] = sign * cs.sin * schedule.attention_factor;
        }
      }
      for (int o = 0; o < plan.operand_count; ++o) {
        const Operand& op = plan.operands[o];
        for (int64_t h = 0; h < op.heads; ++h) {
          const int64_t in_offset =
              b * op.in_strides[0] + s * op.in_strides[1] + h * op.in_strides[2];
          const int64_t out_offset =
              b * op.out_strides[0] + s * op.out_strides[1] + h * op.out_strides[2];
          rotate_head<T>(plan, op, in_offset, out_offset, cos_row.data(), sin_row.data(),
                         element_size);
        }
      }
    }
  }
}

}  // namespace

void reference_apply(const Plan& plan) {
  switch (plan.dtype) {
    case DType::f32: run<float>(plan); break;
    case DType::f64: run<double>(plan); break;
    case DType::f16: run<F16>(plan); break;
    case DType::bf16: run<BF16>(plan); break;
  }
}

}  // namespace rotary::detail
