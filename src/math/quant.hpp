// Internal: the cache dtypes' codes (fp8 e4m3, fp8 e5m2, int8) and their scale, written once as
// ROTARY_HD code for the CPU, the CUDA kernels and their host emulation (rotary/fused.hpp states
// the conventions). No libm, no rounding-mode dependence: the rounding to a code is integer and
// power-of-two arithmetic, exact on every machine; the scale is one IEEE float division or
// product (explicitly rounded on a device).
#pragma once

#include <cstdint>

#include "hd.hpp"

namespace rotary::detail {

/// An fp8 format: exponent bits, mantissa bits, bias, the largest finite value's code (magnitude
/// bits) and the NaN code written (magnitude bits; the sign bit is the value's).
struct Fp8Format {
  int mantissa_bits;
  int bias;
  int min_exponent;       ///< of the normal numbers: 1 - bias
  uint8_t max_code;       ///< magnitude of the largest finite value
  uint8_t nan_code;
  float max_value;
};
/// OCP E4M3FN: no infinity, S.1111.111 is NaN, max 448 = 0x7e.
/// E5M2: IEEE-like, 0x7c is inf, 0x7d-0x7f NaN, max 57344 = 0x7b.
/// As functions for device code (a namespace-scope constexpr object of class type is host-only
/// there), and as the constants kE4M3 / kE5M2 for host code.
ROTARY_HD constexpr Fp8Format e4m3_format() { return Fp8Format{3, 7, -6, 0x7e, 0x7f, 448.0f}; }
ROTARY_HD constexpr Fp8Format e5m2_format() { return Fp8Format{2, 15, -14, 0x7b, 0x7e, 57344.0f}; }
inline constexpr Fp8Format kE4M3 = e4m3_format();
inline constexpr Fp8Format kE5M2 = e5m2_format();

/// 2^e as a float, for e in [-149, 127] (exact).
ROTARY_HD inline float pow2f(int e) {
  if (e >= -126) return float_from_bits(static_cast<uint32_t>(e + 127) << 23);
  return float_from_bits(uint32_t{1} << (e + 149));
}

/// x (0 <= x < 2^23, a float) rounded to the nearest integer, ties to even, as an integer. Exact:
/// integer arithmetic on the float's bits.
ROTARY_HD inline uint32_t round_half_even(float x) {
  const uint32_t bits = float_bits(x);
  const int e = static_cast<int>((bits >> 23) & 0xff) - 127;
  if (e < -1) return 0;  // x < 0.5 (zeros and subnormals included)
  const uint32_t m = (bits & 0x7fffff) | 0x800000;  // x = m * 2^(e - 23)
  if (e >= 23) return m << (e - 23);
  const int shift = 23 - e;  // >= 1, <= 24
  const uint32_t whole = m >> shift;
  const uint32_t rest = m & ((uint32_t{1} << shift) - 1);
  const uint32_t half = uint32_t{1} << (shift - 1);
  // Up when above the half, or at it with whole odd: without a branch (the data decide it).
  return whole + ((static_cast<uint32_t>(rest > half) | (static_cast<uint32_t>(rest == half) & whole)) & 1u);
}

/// x (a float) as the fp8 code of `format`: nearest, ties to even, saturating to ±max (an infinity
/// too: CUDA's __NV_SATFINITE), NaN -> the format's NaN with x's sign. Without a data-dependent
/// branch (a cache row's loop vectorises): the magnitude saturated as bits (NaN and infinity above
/// max's bits), its code formed, NaN selected last.
ROTARY_HD inline uint8_t float_to_fp8(float x, const Fp8Format& f) {
  const uint32_t bits = float_bits(x);
  const uint32_t sign = (bits >> 24) & 0x80;
  const uint32_t magnitude = bits & 0x7fffffff;
  const uint32_t max_bits = float_bits(f.max_value);
  const uint32_t a = magnitude < max_bits ? magnitude : max_bits;  // ±max is a code: saturation
  // The quantum (code step) at a's binade; below the normal range, the subnormals' fixed one.
  int e = static_cast<int>(a >> 23) - 127;
  e = e < f.min_exponent ? f.min_exponent : e;
  // a / quantum < 2^(mantissa_bits + 1): exact (a power of two), then an exact integer rounding.
  const uint32_t n = round_half_even(float_from_bits(a) * pow2f(f.mantissa_bits - e));
  // Code magnitude: exponent field e + bias and mantissa n - 2^m, i.e. ((e + bias - 1) << m) + n;
  // at min_exponent (e + bias = 1) that is n itself, the subnormals (n < 2^m) and the first normal
  // binade (n from 2^m); n = 2^(m+1), rounded up to the next binade, carries into the exponent.
  uint32_t code = (static_cast<uint32_t>(e + f.bias - 1) << f.mantissa_bits) + n;
  code = code > f.max_code ? f.max_code : code;  // rounded up past the largest finite value
  code = magnitude > 0x7f800000u ? f.nan_code : code;
  return static_cast<uint8_t>(sign | code);
}

/// The fp8 code's value, exactly, as a float (NaN for NaN codes, ±inf for e5m2's infinities).
ROTARY_HD inline float fp8_to_float(uint8_t code, const Fp8Format& f) {
  const bool negative = (code & 0x80) != 0;
  const uint32_t magnitude = code & 0x7f;
  const uint32_t exponent_field = magnitude >> f.mantissa_bits;
  const uint32_t mantissa = magnitude & ((uint32_t{1} << f.mantissa_bits) - 1);
  float value;
  if (f.bias == 15 && exponent_field == 31) {
    value = mantissa == 0 ? float_from_bits(0x7f800000u) : float_from_bits(0x7fc00000u);
  } else if (f.bias == 7 && magnitude == 0x7f) {
    value = float_from_bits(0x7fc00000u);
  } else if (exponent_field == 0) {
    value = static_cast<float>(mantissa) * pow2f(f.min_exponent - f.mantissa_bits);
  } else {
    value = static_cast<float>(mantissa + (uint32_t{1} << f.mantissa_bits)) *
            pow2f(static_cast<int>(exponent_field) - f.bias - f.mantissa_bits);
  }
  return negative ? -value : value;
}

/// x as an int8 code: nearest, ties to even, saturating to ±127 (never -128), NaN -> 0 (CUDA's
/// cvt.rni.sat.s8.f32 gives 0 for NaN).
ROTARY_HD inline int8_t float_to_i8(float x) {
  if (!(x == x)) return 0;
  const bool negative = x < 0;
  const float a = negative ? -x : x;
  const uint32_t n = a >= 127.5f ? 127u : round_half_even(a);  // 127.5 rounds to 128 (even): saturates
  const int value = static_cast<int>(n > 127 ? 127 : n);
  return static_cast<int8_t>(negative ? -value : value);
}

/// The scale's direction (rotary::ScaleMode, as an integer the kernels carry).
enum class ScaleOp : int32_t { divide, multiply };

ROTARY_HD inline float div_rn(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(x, y);
#else
  return x / y;
#endif
}
ROTARY_HD inline float mul_rn(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(x, y);
#else
  return x * y;
#endif
}

/// The value to round to a code: fl32(x / s) (divide) or fl32(x * s) (multiply).
ROTARY_HD inline float scale_for_code(float x, float s, ScaleOp op) {
  return op == ScaleOp::divide ? div_rn(x, s) : mul_rn(x, s);
}
/// A code's value back in the data's units: fl32(v * s) (divide) or fl32(v / s) (multiply).
ROTARY_HD inline float scale_from_code(float v, float s, ScaleOp op) {
  return op == ScaleOp::divide ? mul_rn(v, s) : div_rn(v, s);
}

}  // namespace rotary::detail
