// Internal: code written once for the host and for CUDA devices. ROTARY_HD marks a function that
// nvcc compiles for both sides (__host__ __device__); under a plain C++ compiler it is empty, so the
// same headers serve the CPU reference, the CPU kernels' scalar paths, the CUDA kernels and their
// host emulation (src/cuda/rope_body.hpp). Inside such a function, `#if defined(__CUDA_ARCH__)`
// selects the device branch (explicitly rounded intrinsics, no libm); the #else branch is the
// host's code.
#pragma once

#include <bit>
#include <cstdint>

#if !defined(ROTARY_HD)
#if defined(__CUDACC__)
#define ROTARY_HD __host__ __device__
#else
#define ROTARY_HD
#endif
#endif

// Fully unrolls the loop that follows in device code (so that arrays indexed by its counter stay in
// registers); nothing on the host.
#if !defined(ROTARY_UNROLL)
#if defined(__CUDA_ARCH__)
#define ROTARY_UNROLL _Pragma("unroll")
#else
#define ROTARY_UNROLL
#endif
#endif

namespace rotary::detail {

// std::bit_cast is a host function to nvcc (device code may call it only with
// --expt-relaxed-constexpr): the same reinterpretation on both sides.
ROTARY_HD inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<uint32_t>(f);
#endif
}
ROTARY_HD inline float float_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

}  // namespace rotary::detail
