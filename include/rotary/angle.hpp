// rotary — exact angles: cos and sin of position * inv_freq without float32's error.
#pragma once

#include <cstdint>

namespace rotary {

struct CosSin {
  double cos = 1.0;
  double sin = 0.0;
};

/// cos and sin of the real number position * inv_freq, for 0 <= position < 2^31 and
/// 0 < inv_freq <= 2^20 (the ranges the API accepts; outside them the result is unspecified).
///
/// Numerics: the product is formed exactly as a double-double (FMA), reduced modulo π/2 against a
/// 159-bit π/2 in double-double arithmetic (absolute error below 2^-70 for |angle| < 2^51), and
/// the reduced angle r = r_hi + r_lo goes through libm's sin/cos of r_hi plus the first-order
/// correction for r_lo. Each result is within about 1 double ulp of the exact value, so rounding it
/// to float32 gives the correctly rounded float or its neighbour (<= 0.5 + 2^-28 float ulp).
/// Pure; thread-safe.
CosSin exact_cos_sin(int64_t position, double inv_freq);

/// cos and sin of the real number position * inv_freq for a fractional position (a double in
/// [0, 2^31)), formed and reduced exactly as above: the product of two doubles is exact as a
/// double-double. Equals exact_cos_sin(p, f) for a whole number p.
CosSin exact_cos_sin_real(double position, double inv_freq);

/// cos and sin of one double angle, |angle| < 2^51, with the same reduction and accuracy.
CosSin cos_sin_of(double angle);

}  // namespace rotary
