// The scalar reference kernel: the oracle every fast kernel is tested against.
// Written straight from the rotation formula; no vectorisation, no threads.
//
// Angles: from the one angle-row builder (kernel.hpp), evaluated pair by pair with
// rotary::exact_cos_sin_real: cos and sin times attention_factor, rounded once to float (exactly
// the values a Table holds; with a Table or the caller's tensors, their values), sin negated for
// the inverse. Channels: Schedule::channels, pair by pair. f32/f16/bf16: each output is
// detail::rotate_minus of the widened inputs (float32, one rounding, the larger product fused),
// then one rounding to 16 bits. f64: double arithmetic with double angles.
#include <cstring>
#include <type_traits>
#include <vector>

#include "../half.hpp"
#include "../kernel.hpp"
#include "../rotate.hpp"
#include "rotary/angle.hpp"

namespace rotary::detail {
namespace {

template <class T>
struct Storage;
template <>
struct Storage<float> {
  using Value = float;
  static float load(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
  static void store(void* p, int64_t i, float v) { static_cast<float*>(p)[i] = v; }
};
template <>
struct Storage<double> {
  using Value = double;
  static double load(const void* p, int64_t i) { return static_cast<const double*>(p)[i]; }
  static void store(void* p, int64_t i, double v) { static_cast<double*>(p)[i] = v; }
};
struct F16 {};
struct BF16 {};
template <>
struct Storage<F16> {
  using Value = float;
  static float load(const void* p, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, int64_t i, float v) { static_cast<uint16_t*>(p)[i] = f32_to_f16(v); }
};
template <>
struct Storage<BF16> {
  using Value = float;
  static float load(const void* p, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, int64_t i, float v) { static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); }
};

// The channels outside the rotated slice, copied bit for bit (NaN payloads included).
void copy_passthrough(const Plan& plan, const void* in, void* out, int64_t in_d, int64_t out_d) {
  const int64_t element_size = size_of(plan.dtype);
  const int64_t slice_end = plan.rotary_offset + plan.rotary_dim;
  for (int64_t j = 0; j < plan.head_dim; ++j) {
    if (j >= plan.rotary_offset && j < slice_end) continue;
    std::memcpy(static_cast<unsigned char*>(out) + j * out_d * element_size,
                static_cast<const unsigned char*>(in) + j * in_d * element_size,
                static_cast<size_t>(element_size));
  }
}

template <class T>
void rotate_head(const Plan& plan, const Operand& op, int64_t in_offset, int64_t out_offset,
                 const typename Storage<T>::Value* cos_row, const typename Storage<T>::Value* sin_row) {
  using Value = typename Storage<T>::Value;
  const int64_t element_size = size_of(plan.dtype);
  const Schedule& schedule = *plan.schedule;
  const int64_t pairs = plan.rotary_dim / 2;
  const int64_t in_d = op.in_strides[3];
  const int64_t out_d = op.out_strides[3];
  const void* in = static_cast<const unsigned char*>(op.in) + in_offset * element_size;
  void* out = static_cast<unsigned char*>(op.out) + out_offset * element_size;
  for (int64_t i = 0; i < pairs; ++i) {
    const auto [ia, ib] = schedule.channels(i);
    const Value a = Storage<T>::load(in, ia * in_d);
    const Value b = Storage<T>::load(in, ib * in_d);
    Value a_out, b_out;
    rotate_pair(a, b, cos_row[i], sin_row[i], a_out, b_out);
    Storage<T>::store(out, ia * out_d, a_out);
    Storage<T>::store(out, ib * out_d, b_out);
  }
  if (!op.in_place && plan.copy_tail) copy_passthrough(plan, in, out, in_d, out_d);
}

template <class T>
void run(const Plan& plan) {
  using Value = typename Storage<T>::Value;
  const auto pairs = static_cast<size_t>(plan.rotary_dim / 2);
  std::vector<float> c(pairs), s(pairs);
  std::vector<double> dc(pairs), ds(pairs), pair_position(pairs);
  const AngleScratch scratch{c.data(), s.data(), dc.data(), ds.data(), pair_position.data()};
  for (int64_t b = 0; b < plan.batch; ++b) {
    for (int64_t t = 0; t < plan.seq; ++t) {
      const int64_t token = b * plan.seq + t;
      for (int o = 0; o < plan.operand_count; ++o) {
        const Operand& op = plan.operands[o];
        // The token's row (built again per operand under xPos, which scales it in scratch).
        const Value* cos_row = nullptr;
        const Value* sin_row = nullptr;
        if constexpr (std::is_same_v<Value, double>) {
          DoubleRow row = double_angle_row(plan, token, t, scratch, /*vectorised=*/false);
          if (plan.schedule->xpos()) row = xpos_double_row(plan, token, t, row, op, scratch);
          cos_row = row.c;
          sin_row = row.s;
        } else {
          FloatRow row = float_angle_row(plan, token, t, scratch, /*vectorised=*/false);
          if (plan.schedule->xpos()) row = xpos_float_row(plan, token, t, row, op, scratch);
          cos_row = row.c;
          sin_row = row.s;
        }
        for (int64_t h = 0; h < op.heads; ++h) {
          const int64_t in_offset = b * op.in_strides[0] + t * op.in_strides[1] + h * op.in_strides[2];
          const int64_t out_offset = b * op.out_strides[0] + t * op.out_strides[1] + h * op.out_strides[2];
          rotate_head<T>(plan, op, in_offset, out_offset, cos_row, sin_row);
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
