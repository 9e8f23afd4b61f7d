// Internal: exact cos and sin of position * inv_freq, written once for host C++ and CUDA device
// code. The same IEEE double operations, in the same order, as the Highway kernels' CosSinLanes
// (src/cpu/apply-inl.h) perform lane by lane, so every path (Table, reference, scalar Highway
// targets, vector lanes, GPU) gives the same bits on every machine; no libm function of the
// reduced angle (sin, cos, sincos), whose last bit differs between C libraries.
#pragma once

#include <cmath>
#include <cstdint>

#include "hd.hpp"
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
namespace ieee {

// Each operation rounds once to nearest and is never fused with another. On the device through
// the explicit-rounding intrinsics (nvcc fuses a plain a * b + c by default, --fmad=true; ptxas
// never fuses .rn operations). On the host as written, which needs -ffp-contract=off wherever the
// target has FMA (the library's and the tests' flag; g++ fuses across statements by default, even
// in ISO mode, clang++ within one expression, which these one-operation functions never are).
ROTARY_HD ROTARY_ANGLE_INLINE double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
ROTARY_HD ROTARY_ANGLE_INLINE double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
ROTARY_HD ROTARY_ANGLE_INLINE double sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
/// a * b + c rounded once. The host's std::fma is correctly rounded in every conforming C library
/// (an instruction where the compiler targets FMA hardware, else a libm call that is exact).
ROTARY_HD ROTARY_ANGLE_INLINE double fma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

/// The nearest integer to x, ties to even, whatever the current rounding mode: as Highway's Round
/// (x86 round with an explicit rounding-control immediate, Arm frintn) and CUDA's rint (cvt.rni)
/// compute it. NaN, ±inf and |x| >= 2^52 (already whole) come back unchanged, the sign of zero
/// is kept (Round(-0.25) is -0). Plain arithmetic instead of std::nearbyint, which follows the
/// dynamic rounding mode and is a libm call on baseline x86-64.
ROTARY_HD ROTARY_ANGLE_INLINE double round_half_even(double x) {
  if (!(x > -0x1p52 && x < 0x1p52)) return x;
  const auto whole = static_cast<int64_t>(x);  // toward zero
  const auto t = static_cast<double>(whole);  // exact, |whole| < 2^52
  // Exact in every rounding mode: for |x| >= 1, |t| lies in [|x|/2, |x|] (Sterbenz); else t = 0.
  const double fraction = sub(x, t);
  const bool odd = (whole & 1) != 0;
  double n = t;
  if (fraction > 0.5 || (fraction == 0.5 && odd)) n = add(t, 1.0);  // exact: |t| + 1 <= 2^52
  if (fraction < -0.5 || (fraction == -0.5 && odd)) n = sub(t, 1.0);
#if defined(__CUDA_ARCH__)
  return copysign(n, x);
#else
  return std::copysign(n, x);
#endif
}

/// The largest integer <= x (exact in every rounding mode, NaN stays NaN).
ROTARY_HD ROTARY_ANGLE_INLINE double floor(double x) {
#if defined(__CUDA_ARCH__)
  return ::floor(x);
#else
  return std::floor(x);
#endif
}

/// Knuth's TwoSum: s + e == a + b exactly, no ordering requirement.
struct Sum {
  double s;
  double e;
};
ROTARY_HD ROTARY_ANGLE_INLINE Sum two_sum(double a, double b) {
  const double s = add(a, b);
  const double bb = sub(s, a);
  return {s, add(sub(a, sub(s, bb)), sub(b, bb))};
}

}  // namespace ieee

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
  constexpr double kPio2Hi = 0x1.921fb54442d18p+0;  // π/2 = hi + mid + lo + O(2^-164)
  constexpr double kPio2Mid = 0x1.1a62633145c07p-54;
  constexpr double kPio2Lo = -0x1.f1976b7ed8fbcp-110;
  constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;
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
  double ps = 0x1.952c77030ad4ap-49;  // 1/17!
  ps = fma(ps, r2, -0x1.ae7f3e733b81fp-41);  // -1/15!
  ps = fma(ps, r2, 0x1.6124613a86d09p-33);   // 1/13!
  ps = fma(ps, r2, -0x1.ae64567f544e4p-26);  // -1/11!
  ps = fma(ps, r2, 0x1.71de3a556c734p-19);   // 1/9!
  ps = fma(ps, r2, -0x1.a01a01a01a01ap-13);  // -1/7!
  ps = fma(ps, r2, 0x1.1111111111111p-7);    // 1/5!
  ps = fma(ps, r2, -0x1.5555555555555p-3);   // -1/3!
  double pc = 0x1.ae7f3e733b81fp-45;  // 1/16!
  pc = fma(pc, r2, -0x1.93974a8c07c9dp-37);  // -1/14!
  pc = fma(pc, r2, 0x1.1eed8eff8d898p-29);   // 1/12!
  pc = fma(pc, r2, -0x1.27e4fb7789f5cp-22);  // -1/10!
  pc = fma(pc, r2, 0x1.a01a01a01a01ap-16);   // 1/8!
  pc = fma(pc, r2, -0x1.6c16c16c16c17p-10);  // -1/6!
  pc = fma(pc, r2, 0x1.5555555555555p-5);    // 1/4!
  pc = fma(pc, r2, -0.5);
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

// The coefficients are the doubles nearest 1/n!, as CosSinLanes writes them.
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
