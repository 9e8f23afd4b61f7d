// Internal: xPos scales (Sun et al. 2022, "A Length-Extrapolatable Transformer"), written once for
// host C++ and CUDA device code, like exact_angle.hpp: the same IEEE double operations in the same
// order on every path (reference, CPU kernels, CUDA kernels and their emulation), no libm function
// (exp's last bit differs between C libraries and the GPU's).
//
// Pair j of a token at position p (its stream's) scales by σ = e^t for a query and e^-t for a key,
// t = ln ζ_j * ((p - c) / γ), ζ_j = (2j + 0.4 r) / (1.4 r) (Schedule::xpos_log_zeta), c the centre,
// γ the scale base; the angle row's float value v (cos or sin times the attention factor, as a
// Table holds it) becomes float(v * σ): rounded once more.
#pragma once

#include <cmath>
#include <cstdint>

#include "ieee.hpp"

#if defined(__CUDACC__)
#define ROTARY_XPOS_INLINE __forceinline__
#elif defined(__GNUC__)
#define ROTARY_XPOS_INLINE inline __attribute__((always_inline))
#else
#define ROTARY_XPOS_INLINE inline
#endif

namespace rotary::detail {

/// e^x for |x| <= 700, within 2 double ulps: x = k ln 2 + r (Cody and Waite: ln 2 in two parts,
/// the first with trailing zero bits so that k times it is exact, |r| <= ln 2 / 2 + tiny), e^r by
/// its Taylor series to r^13 (truncation below 2^-56 relative), times 2^k exactly.
ROTARY_HD ROTARY_XPOS_INLINE double xpos_exp(double x) {
  const double k = ieee::round_half_even(ieee::mul(x, 0x1.71547652b82fep0));  // x / ln 2
  const double r = ieee::sub(ieee::sub(x, ieee::mul(k, 0x1.62e42feep-1)), ieee::mul(k, 0x1.a39ef35793c76p-33));
  // 1/n! for n = 13 .. 2, each the double nearest (compile-time divisions of exact integers).
  constexpr double inverse_factorial[12] = {
      1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
      1.0 / 362880.0,     1.0 / 40320.0,     1.0 / 5040.0,     1.0 / 720.0,
      1.0 / 120.0,        1.0 / 24.0,        1.0 / 6.0,        0.5};
  double sum = inverse_factorial[0];
  for (int n = 1; n < 12; ++n) sum = ieee::add(ieee::mul(sum, r), inverse_factorial[n]);
  sum = ieee::add(ieee::mul(sum, r), 1.0);
  sum = ieee::add(ieee::mul(sum, r), 1.0);
#if defined(__CUDA_ARCH__)
  return ::ldexp(sum, static_cast<int>(k));  // exact: a change of exponent
#else
  return std::ldexp(sum, static_cast<int>(k));
#endif
}

/// ln ζ_j for pair j of a rotated slice of width r (j < r/2), ζ_j = (2j + 0.4 r)/(1.4 r) =
/// (10j + 2r)/(7r), within about 2 double ulps and without libm, so that the host (Schedule::
/// xpos_log_zeta) and the device compute the same bits: ζ = m 2^-e with m in [0.75, 1.5)
/// (e in {0, 1, 2}, as ζ in [2/7, 1)); f = m - 1 = (N 2^e - D)/D from exact integers, rounded once;
/// ln m = 2 atanh(s), s = f/(2 + f) in [-1/7, 1/5], by its series to s^25; minus e ln 2 in two parts.
ROTARY_HD ROTARY_XPOS_INLINE double xpos_log_zeta_of(int64_t j, int64_t r) {
  const int64_t n = 10 * j + 2 * r;
  const int64_t d = 7 * r;
  int e = 0;
  while (e < 2 && 4 * (n << e) < 3 * d) ++e;  // m = ζ 2^e >= 0.75
#if defined(__CUDA_ARCH__)
  const double f = __ddiv_rn(static_cast<double>((n << e) - d), static_cast<double>(d));
  const double s = __ddiv_rn(f, ieee::add(2.0, f));
#else
  const double f = static_cast<double>((n << e) - d) / static_cast<double>(d);
  const double s = f / ieee::add(2.0, f);
#endif
  const double s2 = ieee::mul(s, s);
  double series = 1.0 / 25.0;
  for (int k = 11; k >= 0; --k) series = ieee::add(ieee::mul(series, s2), 1.0 / static_cast<double>(2 * k + 1));
  const double ln_m = ieee::mul(ieee::mul(2.0, s), series);
  const auto ed = static_cast<double>(e);
  return ieee::sub(ieee::sub(ln_m, ieee::mul(ed, 0x1.a39ef35793c76p-33)), ieee::mul(ed, 0x1.62e42feep-1));
}

/// σ of a pair with ln ζ = log_zeta at `position`: e^t for a query, e^-t for a key (key true),
/// t = log_zeta * ((position - center) / scale_base).
ROTARY_HD ROTARY_XPOS_INLINE double xpos_scale(double log_zeta, double position, double center,
                                                double scale_base, bool key) {
#if defined(__CUDA_ARCH__)
  const double distance = __ddiv_rn(ieee::sub(position, center), scale_base);
#else
  const double distance = ieee::sub(position, center) / scale_base;
#endif
  const double t = ieee::mul(log_zeta, distance);
  return xpos_exp(key ? -t : t);
}

/// An angle row's float value times σ, rounded once to float.
ROTARY_HD ROTARY_XPOS_INLINE float xpos_scaled(float value, double sigma) {
  return static_cast<float>(ieee::mul(static_cast<double>(value), sigma));
}

}  // namespace rotary::detail

#undef ROTARY_XPOS_INLINE
