// Internal: the rotation of one pair in float32, written once and used by every path (the scalar
// reference, the strided path, vector-kernel tails and targets without FMA) and by the CUDA kernels
// (ROTARY_HD). The Highway kernels perform the same operations lane by lane, so every path gives
// the same bits.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "hd.hpp"

namespace rotary::detail {

/// fmaf(x, y, z), correctly rounded, with neither hardware FMA nor libm (glibc's fmaf switches the
/// rounding mode on machines without FMA, and costs tens of nanoseconds).
/// x*y is exact in double (24 + 24 bits); x*y + z is rounded to odd in double (its exact error
/// from TwoSum decides the last bit), and rounding a round-to-odd double to float is correct
/// rounding because 53 >= 24 + 2 (Boldo and Melquiond, "Emulation of FMA and correctly rounded
/// sums: proved algorithms using rounding to odd", 2008). Needs -ffp-contract=off (set for the
/// library) so that nothing here is fused behind our back.
inline float fma_f32(float x, float y, float z) {
  const double p = static_cast<double>(x) * static_cast<double>(y);  // exact
  const double zd = z;
  const double s = p + zd;
  if (!std::isfinite(s)) return static_cast<float>(s);
  const double bb = s - p;
  const double e = (p - (s - bb)) + (zd - bb);  // s + e == p + z exactly (TwoSum)
  // Inexact with an even last bit: step one ulp toward the exact value, to the odd neighbour that
  // round-to-odd picks (away from zero when e has the sign of s). Written as selects: the data
  // decide it, so a branch would be mispredicted half the time. s == 0 implies e == 0 (a non-zero
  // sum of these doubles is far above the subnormal range).
  const auto bits = std::bit_cast<uint64_t>(s);
  const bool step = (e != 0) & ((bits & 1) == 0);
  const uint64_t delta = ((e > 0) == (s > 0)) ? uint64_t{1} : ~uint64_t{0};  // +1 or -1
  return static_cast<float>(std::bit_cast<double>(bits + (step ? delta : 0)));
}

/// x*m - w*n in float32 with one product fused: the larger one in magnitude. Only the smaller
/// product is rounded before the fused multiply-add, so for a pair (a, b) and table values
/// c = fl(g cos φ), s = fl(g sin φ) (each within half an ulp):
///   a' = rotate_minus(a, c, b, s)  = a c - b s      b' = rotate_minus(b, c, a, -s) = b c + a s
///   |a' - g(a cos φ - b sin φ)| <= u (2 (|a||C| + |b||S|) + min(|a||C|, |b||S|)) <= 2u g (|a| + |b|)
/// with u = 2^-24, C = g cos φ, S = g sin φ: the accuracy contract 2^-23 g (|a| + |b|) per pair.
/// (Rounding the larger product instead, as a plain fma(a, c, -fl(b s)) does, reaches 1.24 times
/// the contract when |b s| >> |a c|; rounding the smaller one costs at most the term above.)
/// Ties (|p| == |q|) fuse x*m. NaN compares false and fuses w*n, in the vector kernels too.
/// On a CUDA device the same operations as mul.rn / fma.rn: an explicit rounding mode keeps nvcc
/// and ptxas from contracting or reassociating them (nothing depends on -fmad).
ROTARY_HD inline float rotate_minus(float x, float m, float w, float n) {
#if defined(__CUDA_ARCH__)
  const float p = __fmul_rn(x, m);
  const float q = __fmul_rn(w, n);
  const bool fuse_xm = fabsf(p) >= fabsf(q);
  return __fmaf_rn(fuse_xm ? x : -w, fuse_xm ? m : n, fuse_xm ? -q : p);
#else
  const float p = x * m;
  const float q = w * n;
  const bool fuse_xm = std::fabs(p) >= std::fabs(q);
  // fuse_xm: fma(x, m, -q), else fma(-w, n, p); one fma on selected operands.
  return fma_f32(fuse_xm ? x : -w, fuse_xm ? m : n, fuse_xm ? -q : p);
#endif
}

/// One pair (a, b) rotated by angle values (c, s), sin already negated for the inverse:
///   float32: a' = a c - b s and b' = b c + a s, each by rotate_minus (f32, f16, bf16 storage)
///   double:  plain double arithmetic (f64 storage)
ROTARY_HD inline void rotate_pair(float a, float b, float c, float s, float& a_out, float& b_out) {
  a_out = rotate_minus(a, c, b, s);
  b_out = rotate_minus(b, c, a, -s);
}
ROTARY_HD inline void rotate_pair(double a, double b, double c, double s, double& a_out,
                                  double& b_out) {
#if defined(__CUDA_ARCH__)
  a_out = __dsub_rn(__dmul_rn(a, c), __dmul_rn(b, s));
  b_out = __dadd_rn(__dmul_rn(a, s), __dmul_rn(b, c));
#else
  a_out = a * c - b * s;
  b_out = a * s + b * c;
#endif
}

}  // namespace rotary::detail
