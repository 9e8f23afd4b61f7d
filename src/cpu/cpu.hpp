// Internal: the Highway CPU kernels (src/cpu/*.cc) and their dispatcher.
#pragma once

#include <cstdint>

#include "../kernel.hpp"

namespace rotary::detail {

/// One token's heads of one operand, head_dim contiguous (stride 1) in and out.
/// Angles are doubles laid out for the pairing, sign of sin already applied for inverse:
///   half:        c = [c_0 .. c_{h-1}],          s = [s_0 .. s_{h-1}]
///   interleaved: c = [c_0 s_0 c_1 s_1 ...],     s = [-s_0 c_0 -s_1 c_1 ...]   (r values each)
/// so that, in double, a' = a c - b s and b' = a s + b c: each product of a float input and a
/// float table value is exact in double, making the table path bit-identical to the reference.
struct RowArgs {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t heads = 0;
  int64_t in_head_stride = 0;   ///< elements between heads
  int64_t out_head_stride = 0;
  int64_t rotary_dim = 0;
  int64_t head_dim = 0;
  bool interleaved = false;
  bool copy_tail = false;  ///< copy channels rotary_dim..head_dim (out of place only)
  const double* c = nullptr;
  const double* s = nullptr;
};

/// Per dtype, dynamic dispatch to the best Highway target. Single-threaded.
void rotate_heads_f32(const RowArgs& args);
void rotate_heads_f16(const RowArgs& args);
void rotate_heads_bf16(const RowArgs& args);

/// cos and sin of position * inv_freq[i] times factor, i < pairs, in double, vectorised: exact
/// double-double product and reduction (FMA targets; others use rotary::exact_cos_sin), Taylor
/// polynomials on [-π/4, π/4]. Within about 2 double ulps of the exact value. Single-threaded.
void cos_sin_row(int64_t position, const double* inv_freq, int64_t pairs, double factor,
                 double* cos_out, double* sin_out);

/// The threaded CPU path: one OpenMP loop over (token, head-range) blocks. Results do not depend
/// on the thread count.
void cpu_apply(const Plan& plan);

}  // namespace rotary::detail
