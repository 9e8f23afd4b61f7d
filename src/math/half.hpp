// Internal: IEEE binary16 and bfloat16 <-> float32, round to nearest even, bit exact. Plain integer
// code (one float operation: the exact scaling of binary16 subnormals), the same on the host and on
// CUDA devices (ROTARY_HD).
#pragma once

#include <cmath>
#include <cstdint>

#include "hd.hpp"

namespace rotary::detail {

ROTARY_HD inline float bf16_to_f32(uint16_t h) { return float_from_bits(static_cast<uint32_t>(h) << 16); }

ROTARY_HD inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  // Both results formed and one selected, without a branch: loops over rows vectorise.
  const uint32_t nan = (u >> 16) | 0x40u;                       // quiet NaN, payload's top bits kept
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // nearest even; overflow -> inf
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

ROTARY_HD inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // zero or subnormal: mantissa * 2^-24, exact in float
#if defined(__CUDA_ARCH__)
    const float magnitude = __fmul_rn(static_cast<float>(mantissa), 0x1p-24f);
#else
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
#endif
    return float_from_bits(float_bits(magnitude) | sign);
  }
  if (exponent == 31) return float_from_bits(sign | 0x7f800000u | (mantissa << 13));
  return float_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

ROTARY_HD inline uint16_t f32_to_f16(float f) {
  uint32_t u = float_bits(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu));  // NaN
  if (u >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (u >= 0x38800000u) {  // normal binary16 range, >= 2^-14
    const uint32_t rounded = u + 0xfffu + ((u >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
  }
  // Below 2^-14: binary16 subnormal m * 2^-24; scaling by 2^24 is exact, rint rounds to even
  // (the device's rintf is cvt.rni, nearest even as well).
#if defined(__CUDA_ARCH__)
  const float scaled = __fmul_rn(float_from_bits(u), 0x1p24f);
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(rintf(scaled)));
#else
  const float scaled = float_from_bits(u) * 0x1p24f;
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::rint(scaled)));
#endif
}

/// Two floats to bf16 / binary16, packed in one word (lo in the low half): f32_to_bf16 and
/// f32_to_f16 of each, bit for bit. On a CUDA device one instruction for both (cvt.rn.bf16x2.f32 /
/// cvt.rn.f16x2.f32: IEEE round to nearest even, overflow to infinity, subnormals kept; a NaN
/// becomes the canonical 0x7fff, which is what the integer code makes of the canonical NaN a GPU's
/// arithmetic produces, and NaNs compare as NaN in any case).
ROTARY_HD inline uint32_t pack_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
#else
  return static_cast<uint32_t>(f32_to_bf16(lo)) | (static_cast<uint32_t>(f32_to_bf16(hi)) << 16);
#endif
}
ROTARY_HD inline uint32_t pack_f16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t packed;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
#else
  return static_cast<uint32_t>(f32_to_f16(lo)) | (static_cast<uint32_t>(f32_to_f16(hi)) << 16);
#endif
}
/// The binary16 value of bits h, exactly (f16_to_f32; on a device the exact conversion
/// instruction, cvt.f32.f16, in place of the integer code).
ROTARY_HD inline float f16_to_f32_exact(uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  return f16_to_f32(h);
#endif
}

}  // namespace rotary::detail
