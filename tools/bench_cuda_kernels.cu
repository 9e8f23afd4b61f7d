// The unfused composition's neighbours of `rotary-dev bench --device cuda --cases rope_store,qk_norm_rope`:
// the kernels an engine runs beside a plain RoPE call when nothing is fused (vLLM's
// reshape_and_cache and its RMSNorm), written plainly here so the bench times fused against
// unfused on the device in one process. Not part of the library; their outputs are not checked
// bit for bit (the fused rows are, against the CPU).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "bench_cuda_kernels.hpp"

namespace rotary::cli {
namespace {

// One block per token: its k and v rows (vecs 16-byte words each) to its slot's rows of the
// caches; a negative slot skips the token.
__global__ void scatter_rows_kernel(const uint4* k, const uint4* v, uint4* k_cache, uint4* v_cache,
                                    const int64_t* slots, int64_t vecs) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  for (int64_t i = threadIdx.x; i < vecs; i += blockDim.x) {
    k_cache[slot * vecs + i] = k[t * vecs + i];
    v_cache[slot * vecs + i] = v[t * vecs + i];
  }
}

__device__ float widen(float x) { return x; }
__device__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ float widen(__half x) { return __half2float(x); }
template <class T>
__device__ T narrow(float x);
template <>
__device__ float narrow<float>(float x) { return x; }
template <>
__device__ __nv_bfloat16 narrow<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __half narrow<__half>(float x) { return __float2half_rn(x); }

// One warp per row of `dim` values, in place: transformers' LlamaRMSNorm (float32 mean of squares,
// rsqrt, the product rounded to T, times the weight, rounded again).
template <class T>
__global__ void rms_norm_kernel(T* x, const T* weight, int64_t rows, int dim, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp: a row belongs to one warp
  const int lane = static_cast<int>(threadIdx.x % 32);
  T* r = x + row * dim;
  float sum = 0.0f;
  for (int d = lane; d < dim; d += 32) {
    const float v = widen(r[d]);
    sum += v * v;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const float inv = rsqrtf(sum / static_cast<float>(dim) + eps);
  for (int d = lane; d < dim; d += 32) {
    const T y = narrow<T>(widen(r[d]) * inv);
    r[d] = narrow<T>(widen(y) * widen(weight[d]));
  }
}

// The same norm with 16-byte loads and stores (vLLM's vectorised RMSNorm reads its rows so): a row's
// 16-byte chunks go to a group of `group` lanes (32, or the chunk count when it divides 32: two bf16
// rows of 128 per warp, so no lane idles), lane l of a group taking chunks l, l + group, ... (rows of
// dim * sizeof(T) a multiple of 16 bytes, 16-byte aligned). The same arithmetic as rms_norm_kernel
// but for the order of the float sum (a baseline's timing, not checked bit for bit).
template <class T>
__global__ void rms_norm_vec_kernel(T* x, const T* weight, int64_t rows, int dim, float eps) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));
  union Chunk {
    uint4 bits;
    T v[kPer];
  };
  const int chunks = dim / kPer;
  const int group = chunks < 32 && 32 % chunks == 0 ? chunks : 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int64_t row = warp * (32 / group) + lane / group;
  if (row >= rows) return;  // the whole group: a row belongs to one group
  const int sub = lane % group;
  const unsigned mask = group == 32 ? 0xffffffffu : ((1u << group) - 1u) << (lane / group * group);
  uint4* r = reinterpret_cast<uint4*>(x + row * dim);
  const uint4* w = reinterpret_cast<const uint4*>(weight);
  float sum = 0.0f;
  for (int c = sub; c < chunks; c += group) {
    Chunk in;
    in.bits = r[c];
    for (int i = 0; i < kPer; ++i) {
      const float v = widen(in.v[i]);
      sum += v * v;
    }
  }
  for (int offset = group / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(mask, sum, offset);
  const float inv = rsqrtf(sum / static_cast<float>(dim) + eps);
  for (int c = sub; c < chunks; c += group) {
    Chunk in, wt, out;
    in.bits = r[c];
    wt.bits = w[c];
    for (int i = 0; i < kPer; ++i) out.v[i] = narrow<T>(widen(narrow<T>(widen(in.v[i]) * inv)) * widen(wt.v[i]));
    r[c] = out.bits;
  }
}

constexpr int kWarpsPerBlock = 8;

template <class T>
int rms_norm_as(void* x, const void* weight, int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const bool vectors = dim > 0 && (dim * static_cast<int64_t>(sizeof(T))) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(weight) % 16 == 0;
  if (vectors) {
    const int64_t chunks = dim * static_cast<int64_t>(sizeof(T)) / 16;
    const int64_t per_warp = chunks < 32 && 32 % chunks == 0 ? 32 / chunks : 1;  // rms_norm_vec_kernel's groups
    const auto vec_blocks = static_cast<unsigned>((rows + kWarpsPerBlock * per_warp - 1) / (kWarpsPerBlock * per_warp));
    rms_norm_vec_kernel<T><<<vec_blocks, kWarpsPerBlock * 32, 0, stream>>>(
        static_cast<T*>(x), static_cast<const T*>(weight), rows, static_cast<int>(dim), eps);
  } else {
    rms_norm_kernel<T><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(static_cast<T*>(x), static_cast<const T*>(weight),
                                                                    rows, static_cast<int>(dim), eps);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int bench_scatter_rows(const void* k, const void* v, void* k_cache, void* v_cache, const int64_t* slots,
                       int64_t tokens, int64_t row_bytes, cudaStream_t stream) {
  if (tokens == 0) return 0;
  scatter_rows_kernel<<<static_cast<unsigned>(tokens), 128, 0, stream>>>(
      static_cast<const uint4*>(k), static_cast<const uint4*>(v), static_cast<uint4*>(k_cache),
      static_cast<uint4*>(v_cache), slots, row_bytes / 16);
  return static_cast<int>(cudaGetLastError());
}

int bench_rms_norm(void* x, BenchElement element, const void* weight, int64_t rows, int64_t dim, float eps,
                   cudaStream_t stream) {
  if (rows == 0) return 0;
  switch (element) {
    case BenchElement::f32: return rms_norm_as<float>(x, weight, rows, dim, eps, stream);
    case BenchElement::bf16: return rms_norm_as<__nv_bfloat16>(x, weight, rows, dim, eps, stream);
    case BenchElement::f16: return rms_norm_as<__half>(x, weight, rows, dim, eps, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace rotary::cli
