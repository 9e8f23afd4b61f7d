// Test oracle for the cache dtypes, written independently of src/math/quant.hpp: fp8 codes decoded
// by their formula, a value encoded by searching every finite code for the nearest (ties: the even
// code), int8 by std::nearbyint in the default rounding mode. Slow and obvious on purpose.
#pragma once

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>

#include "math/half.hpp"
#include "rotary/fused.hpp"
#include "rotary/tensor.hpp"

namespace rotary::test {

/// The value of fp8 code `code` (e4m3: OCP E4M3FN; e5m2: IEEE-like), by the formula.
inline double oracle_fp8_value(uint8_t code, bool e4m3) {
  const int sign = (code & 0x80) ? -1 : 1;
  const int ebits = e4m3 ? 4 : 5;
  const int mbits = e4m3 ? 3 : 2;
  const int bias = e4m3 ? 7 : 15;
  const int e = (code >> mbits) & ((1 << ebits) - 1);
  const int m = code & ((1 << mbits) - 1);
  if (e4m3 && e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (!e4m3 && e == 31) return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(m, 1 - bias - mbits);
  return sign * std::ldexp((1 << mbits) + m, e - bias - mbits);
}

/// The code of x: the nearest finite code (ties: even code), saturating, NaN -> 0x7f/0x7e with x's sign.
inline uint8_t oracle_fp8_code(double x, bool e4m3) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | (e4m3 ? 0x7f : 0x7e);
  const double a = std::fabs(x);
  const uint8_t max_code = e4m3 ? 0x7e : 0x7b;
  if (a >= oracle_fp8_value(max_code, e4m3)) return sign | max_code;  // saturation (inf included)
  int best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 0x80; ++c) {
    const double v = oracle_fp8_value(static_cast<uint8_t>(c), e4m3);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(v - a);
    if (d < best_distance || (d == best_distance && (c & 1) == 0)) {
      best = c;
      best_distance = d;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

/// int8: nearest-even, saturating to ±127, NaN -> 0.
inline int8_t oracle_i8(double x) {
  if (std::isnan(x)) return 0;
  const double r = std::nearbyint(std::fmax(-127.0, std::fmin(127.0, x)));
  return static_cast<int8_t>(r);
}

/// x (a value of the data's dtype, as float) stored as `dtype` with scale s (quantised dtypes):
/// the composition's quantiser, written out: fl32(x / s) or fl32(x * s), then the code.
inline void oracle_store(DType dtype, void* base, int64_t i, float x, float s, ScaleMode mode) {
  const float scaled = mode == ScaleMode::divide ? x / s : x * s;
  switch (dtype) {
    case DType::f32: static_cast<float*>(base)[i] = x; break;
    case DType::f64: static_cast<double*>(base)[i] = x; break;
    case DType::f16: static_cast<uint16_t*>(base)[i] = detail::f32_to_f16(x); break;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = detail::f32_to_bf16(x); break;
    case DType::fp8_e4m3: static_cast<uint8_t*>(base)[i] = oracle_fp8_code(scaled, true); break;
    case DType::fp8_e5m2: static_cast<uint8_t*>(base)[i] = oracle_fp8_code(scaled, false); break;
    case DType::i8: static_cast<int8_t*>(base)[i] = oracle_i8(scaled); break;
  }
}

}  // namespace rotary::test
