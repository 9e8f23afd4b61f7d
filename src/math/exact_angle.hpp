// Internal: exact cos and sin of position * inv_freq, written once for host C++ and CUDA device
// code. The same IEEE double operations, in the same order, as the Highway kernels' CosSinLanes
// (src/cpu/apply-inl.h) perform lane by lane, so every path (Table, reference, scalar Highway
// targets, vector lanes, GPU) gives the same bits on every machine; no libm function of the
// reduced angle (sin, cos, sincos), whose last bit differs between C libraries.
#pragma once

#include <cmath>
#include <cstdint>

#include "hd.hpp"
#include "ieee.hpp"
#include "rotary/angle.hpp"

// Always inlined: a caller compiled for FMA hardware (src/angle.cpp's x86 path) then gets the
// instruction, where a call into this header's code would reach libm's fma.
#if defined(__CUDACC__)
#define ROTARY_ANGLE_INLINE __forceinline__
#elif defined(__GNUC__)
#define ROTARY_ANGLE_INLINE inline __attribute__((always_inline))
#else
#define ROTARY_ANGLE_INLINE inline
#endif

namespace rotary::detail {

/// The constants of the exact reduction and of the polynomials, shared by cos_sin_of_product and
/// the Highway lanes (src/cpu/apply-inl.h CosSinLanes), which must use the same values.
namespace angle_constants {
inline constexpr double kPio2Hi = 0x1.921fb54442d18p+0;  // π/2 = hi + mid + lo + O(2^-164)
inline constexpr double kPio2Mid = 0x1.1a62633145c07p-54;
inline constexpr double kPio2Lo = -0x1.f1976b7ed8fbcp-110;
inline constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;
/// The Taylor coefficients, each the double nearest ±1/n! (scalars: CUDA device code reads those):
/// sin r = r (1 + r^2 (-1/3! + r^2 (1/5! + ... + r^2 1/17!))), cos r = 1 + r^2 (-1/2! + ... + r^2 1/16!).
inline constexpr double kInvFact2 = 0.5, kInvFact3 = 1.0 / 6.0, kInvFact4 = 1.0 / 24.0, kInvFact5 = 1.0 / 120.0,
                        kInvFact6 = 1.0 / 720.0, kInvFact7 = 1.0 / 5040.0, kInvFact8 = 1.0 / 40320.0,
                        kInvFact9 = 1.0 / 362880.0, kInvFact10 = 1.0 / 3628800.0, kInvFact11 = 1.0 / 39916800.0,
                        kInvFact12 = 1.0 / 479001600.0, kInvFact13 = 1.0 / 6227020800.0,
                        kInvFact14 = 1.0 / 87178291200.0, kInvFact15 = 1.0 / 1307674368000.0,
                        kInvFact16 = 1.0 / 20922789888000.0, kInvFact17 = 1.0 / 355687428096000.0;
}  // namespace angle_constants

/// cos and sin of the real number position * inv_freq, for position in [0, 2^31) (whole or
/// fractional) and inv_freq in [0, 2^20]; cos_sin_of_product(angle, 1) is the cos and sin of one
/// double angle, |angle| < 2^51. Outside these ranges the result is unspecified, never undefined
/// behaviour (NaN in gives NaN out).
///
/// Numerics (CosSinLanes's, operation for operation): the product exactly as a double-double
/// (fma), k = the nearest quarter turn (ties to even), r = x - k π/2 against π/2 in three parts
/// (159 bits), absolute error below 2^-106; then Taylor polynomials of degree 17 (sin) and 16
/// (cos) on |r| <= π/4 + tiny in Horner's order (first omitted terms below 2^-62 relative), the
/// first-order correction for r's low part, the quadrant from k mod 4. Each result is within
/// 2^-51 relative + 2^-90 absolute of the exact value (tests/test_angle.cpp holds this against
/// MPFR). Deterministic: only +, -, *, fma, each rounded once, and exact integer steps, so the
/// same bits on every IEEE machine in the default floating-point environment (round to nearest,
/// subnormal doubles kept: no flush-to-zero). Pure; no allocation.
ROTARY_HD ROTARY_ANGLE_INLINE CosSin cos_sin_of_product(double position, double inv_freq) {
  using namespace ieee;
  using namespace angle_constants;
  const double x_hi = mul(position, inv_freq);
  const double x_lo = fma(position, inv_freq, -x_hi);  // the product's exact remainder
  const double k = round_half_even(mul(x_hi, kTwoOverPi));
  // x_hi - k pio2_hi in one fused operation is exact (both multiples of 2^-53, difference < 2);
  // the two large terms by exact TwoSums, the small ones in plain double, then renormalised.
  const double r0 = fma(-k, kPio2Hi, x_hi);
  const double k_mid = mul(k, kPio2Mid);
  const double k_mid_lo = fma(k, kPio2Mid, -k_mid);
  const Sum a = two_sum(r0, x_lo);
  const Sum b = two_sum(a.s, -k_mid);
  const double lo = fma(-k, kPio2Lo, sub(add(a.e, b.e), k_mid_lo));
  const Sum r = two_sum(b.s, lo);
  // sin r = r (1 - r^2/3! + ... - r^16/17!), cos r = 1 - r^2/2! + ... + r^16/16!, Horner in r^2.
  const double r2 = mul(r.s, r.s);
  double ps = kInvFact17;
  ps = fma(ps, r2, -kInvFact15);
  ps = fma(ps, r2, kInvFact13);
  ps = fma(ps, r2, -kInvFact11);
  ps = fma(ps, r2, kInvFact9);
  ps = fma(ps, r2, -kInvFact7);
  ps = fma(ps, r2, kInvFact5);
  ps = fma(ps, r2, -kInvFact3);
  double pc = kInvFact16;
  pc = fma(pc, r2, -kInvFact14);
  pc = fma(pc, r2, kInvFact12);
  pc = fma(pc, r2, -kInvFact10);
  pc = fma(pc, r2, kInvFact8);
  pc = fma(pc, r2, -kInvFact6);
  pc = fma(pc, r2, kInvFact4);
  pc = fma(pc, r2, -kInvFact2);
  pc = fma(pc, r2, 1.0);
  const double s = fma(mul(ps, r2), r.s, r.s);
  // r's low part, first order: sin(r + e) = sin r + e cos r, cos(r + e) = cos r - e sin r.
  const double sin_r = fma(r.e, pc, s);
  const double cos_r = fma(-r.e, s, pc);
  // Quadrant q = k mod 4, in double as the lanes compute it (NaN: no case matches).
  const double q = sub(k, mul(ieee::floor(mul(k, 0.25)), 4.0));
  const bool odd = q == 1.0 || q == 3.0;
  const double base_c = odd ? sin_r : cos_r;
  const double base_s = odd ? cos_r : sin_r;
  const bool negate_c = q == 1.0 || q == 2.0;
  const bool negate_s = q >= 2.0;
  return {negate_c ? -base_c : base_c, negate_s ? -base_s : base_s};
}

// The coefficients are the doubles nearest 1/n! (the compiler's divisions of exact integers).
static_assert(0x1.952c77030ad4ap-49 == 1.0 / 355687428096000.0 &&
              -0x1.ae7f3e733b81fp-41 == -1.0 / 1307674368000.0 &&
              0x1.6124613a86d09p-33 == 1.0 / 6227020800.0 &&
              -0x1.ae64567f544e4p-26 == -1.0 / 39916800.0 &&
              0x1.71de3a556c734p-19 == 1.0 / 362880.0 && -0x1.a01a01a01a01ap-13 == -1.0 / 5040.0 &&
              0x1.1111111111111p-7 == 1.0 / 120.0 && -0x1.5555555555555p-3 == -1.0 / 6.0);
static_assert(0x1.ae7f3e733b81fp-45 == 1.0 / 20922789888000.0 &&
              -0x1.93974a8c07c9dp-37 == -1.0 / 87178291200.0 &&
              0x1.1eed8eff8d898p-29 == 1.0 / 479001600.0 &&
              -0x1.27e4fb7789f5cp-22 == -1.0 / 3628800.0 &&
              0x1.a01a01a01a01ap-16 == 1.0 / 40320.0 && -0x1.6c16c16c16c17p-10 == -1.0 / 720.0 &&
              0x1.5555555555555p-5 == 1.0 / 24.0);

}  // namespace rotary::detail

#undef ROTARY_ANGLE_INLINE
