// rotary — exact angles: cos and sin of position * inv_freq without float32's error.
#pragma once

#include <cstdint>

namespace rotary {

struct CosSin {
  double cos = 1.0;
  double sin = 0.0;
};

/// cos and sin of the real number position * inv_freq, for 0 <= position < 2^31 and
/// 0 <= inv_freq <= 2^20 (the ranges the API accepts; outside them the result is unspecified).
///
/// Numerics: the product is formed exactly as a double-double (FMA), reduced modulo π/2 against a
/// 159-bit π/2 in double-double arithmetic (absolute error below 2^-106), and cos and sin of the
/// reduced angle r = r_hi + r_lo (|r| <= π/4) come from Taylor polynomials of degree 16 and 17 in
/// r_hi plus the first-order correction for r_lo. Each result is within 2^-51 relative (2 double
/// ulps) plus 2^-90 absolute of the exact value, so rounding it to float32 gives the correctly
/// rounded float or, within ~2^-27 float ulp of a rounding boundary, its neighbour (<= 1 ulp).
///
/// Reproducible: only +, -, *, fused multiply-add and exact integer steps, each rounded once to
/// nearest, no libm sin/cos. The results are the same bits on every machine, compiler and C
/// library, and the same as the vectorised on-the-fly angles of every CPU target (and of the CUDA
/// kernels): a Table built anywhere holds the values apply computes on the fly (NaNs, from
/// arguments outside the ranges, compare as NaN). Assumes the default floating-point environment
/// (round to nearest, no flush-to-zero of doubles).
/// Pure; thread-safe.
CosSin exact_cos_sin(int64_t position, double inv_freq);

/// cos and sin of the real number position * inv_freq for a fractional position (a double in
/// [0, 2^31)), formed and reduced exactly as above: the product of two doubles is exact as a
/// double-double. Equals exact_cos_sin(p, f) bit for bit for a whole number p.
CosSin exact_cos_sin_real(double position, double inv_freq);

/// cos and sin of one double angle, |angle| < 2^51, with the same reduction, accuracy and bits as
/// exact_cos_sin_real(angle, 1.0).
CosSin cos_sin_of(double angle);

}  // namespace rotary
