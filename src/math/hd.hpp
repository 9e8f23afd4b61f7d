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

// ROTARY_DASSERT(condition): an invariant that validation guarantees, so a false one is rotary's
// bug, never the caller's (callers get rotary::Error). Checked on the host where
// ROTARY_DEBUG_ASSERTS is defined (the sanitizer build: ROTARY_SANITIZE), reporting the condition,
// file and line and aborting; nothing elsewhere, and nothing in device code.
#if defined(ROTARY_DEBUG_ASSERTS) && !defined(__CUDA_ARCH__)
#include <cstdio>
#include <cstdlib>
#define ROTARY_DASSERT(condition) \
  ((condition) ? static_cast<void>(0) : ::rotary::detail::debug_assert_failed(#condition, __FILE__, __LINE__))
namespace rotary::detail {
[[noreturn]] inline void debug_assert_failed(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "rotary: internal invariant broken: %s (%s:%d)\n", condition, file, line);
  std::abort();
}
}  // namespace rotary::detail
#else
#define ROTARY_DASSERT(condition) static_cast<void>(0)
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
