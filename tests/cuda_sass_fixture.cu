// The SASS check's self-test (tests/CMakeLists.txt: cuda_sass_rejects_scalar_kernel): a rotation
// written the way the fast kernels must not be — one 16-bit element per load and store, a 64-bit
// division per element, an array indexed at run time (local memory) — named like a fast kernel, so
// that tests/cuda_sass_check.cmake finds it and must name each rule it breaks.
#include <cstdint>

__global__ void fast_rope_kernel_scalar_fixture(const uint16_t* in, uint16_t* out, const float* cos, int64_t n,
                                                int64_t seq, int pick) {
  float window[16];
  for (int i = 0; i < 16; ++i) window[i] = cos[i];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = i % seq;  // int64 modulo: a subroutine call
    const float x = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
    const float y = __fmul_rn(x, window[(s + pick) & 15]);  // run-time index: local memory
    out[i] = static_cast<uint16_t>(__float_as_uint(y) >> 16);
  }
}
