// Internal: IEEE double operations that each round once to nearest and are never fused, written
// once for host C++ and CUDA device code (the numerics of exact_angle.hpp and xpos.hpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "hd.hpp"

// Always inlined: a caller compiled for FMA hardware (src/angle.cpp's x86 path) then gets the
// instruction, where a call into this header's code would reach libm's fma.
#if defined(__CUDACC__)
#define ROTARY_IEEE_INLINE __forceinline__
#elif defined(__GNUC__)
#define ROTARY_IEEE_INLINE inline __attribute__((always_inline))
#else
#define ROTARY_IEEE_INLINE inline
#endif

namespace rotary::detail {
namespace ieee {

// Each operation rounds once to nearest and is never fused with another. On the device through
// the explicit-rounding intrinsics (nvcc fuses a plain a * b + c by default, --fmad=true; ptxas
// never fuses .rn operations). On the host as written, which needs -ffp-contract=off wherever the
// target has FMA (the library's and the tests' flag; g++ fuses across statements by default, even
// in ISO mode, clang++ within one expression, which these one-operation functions never are).
ROTARY_HD ROTARY_IEEE_INLINE double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
ROTARY_HD ROTARY_IEEE_INLINE double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
ROTARY_HD ROTARY_IEEE_INLINE double sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
/// a * b in float, rounded once and never fused (transformers' float32 pipeline, AngleMode::hf_float32).
ROTARY_HD ROTARY_IEEE_INLINE float mulf(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
/// a * b + c rounded once. The host's std::fma is correctly rounded in every conforming C library
/// (an instruction where the compiler targets FMA hardware, else a libm call that is exact).
ROTARY_HD ROTARY_IEEE_INLINE double fma(double a, double b, double c) {
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
ROTARY_HD ROTARY_IEEE_INLINE double round_half_even(double x) {
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
ROTARY_HD ROTARY_IEEE_INLINE double floor(double x) {
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
ROTARY_HD ROTARY_IEEE_INLINE Sum two_sum(double a, double b) {
  const double s = add(a, b);
  const double bb = sub(s, a);
  return {s, add(sub(a, sub(s, bb)), sub(b, bb))};
}

}  // namespace ieee

}  // namespace rotary::detail
