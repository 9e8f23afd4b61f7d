// The fused operations' CUDA kernels (rotary/fused.hpp, rotary::cuda::rope_store, qk_norm_rope,
// rerotate_cache): the ROTARY_HD per-token body of src/fused/body.hpp on the device, split as
// tests/test_fused_emulation.cpp plays it on the host: one block per token (blocks looping over
// tokens), the block's threads filling the token's angle row in shared memory (fused_angles with
// thread/threads), thread 0 the all-heads norms, then one item (a head of q, k, v or k_pass) per
// warp: its first thread the item's norm factor, its 32 threads the item's pairs and channels lane
// by lane. Every element is written by one thread alone, so the order is free and the bits are the
// CPU's. rope_store calls that apply's fast kernels would take, with caches of the data's dtype or
// quantised ones (MLA's k_pass too), and qk_norm_rope's norm before the rotation per head, go to the fast kernel
// instead (fast_store_body.hpp: 16-byte vectors, several tokens and heads per block; launch_fused
// chooses, fast_store_refusal says why not). Both write the same bits. Compiled as apply.cu is
// (-fmad=false, no fast math). The host side (validation, kernel arguments) is src/cuda/api.cpp's.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>

#include "../fused/body.hpp"
#include "fast_store_body.hpp"
#include "launch.hpp"
#include "rotary/cuda.hpp"

namespace rotary::detail::cuda {
namespace {

static_assert(kSlotOutOfRange == rotary::cuda::slot_out_of_range && kSlotDuplicate == rotary::cuda::slot_duplicate &&
              kScaleInvalid == rotary::cuda::scale_invalid);

// As apply.cu's parameter_frequency: hf_float32 reads transformers' float32 frequencies, held here
// as each float's exact double.
double fused_frequency(const KernelArgs& args, int64_t j) {
  if (args.angle_source != KernelAngleSource::hf_float32) return args.inv_freq[j];
  return static_cast<double>(args.inv_freq_hf32 != nullptr ? args.inv_freq_hf32[j] : static_cast<float>(args.inv_freq[j]));
}

constexpr int kFusedThreads = 256;
constexpr int kFusedSmallPairs = 128;

// Everything a launch reads, by value in the kernel parameters (as apply.cu's Params): the args and
// the per-pair arrays, whose host pointers in args are cleared.
template <class Args, int kPairs>
struct FusedParams {
  Args args;
  bool has_pair_stream;
  double inv_freq[kPairs];
  int pair_stream[kPairs];
};
static_assert(sizeof(FusedParams<FusedKernelArgs, static_cast<int>(rotary::cuda::max_pairs)>) <= 32764,
              "CUDA limits kernel parameters to 32764 bytes");
static_assert(sizeof(FusedParams<RerotateKernelArgs, static_cast<int>(rotary::cuda::max_pairs)>) <= 32764,
              "CUDA limits kernel parameters to 32764 bytes");

template <class T, int kPairs>
__global__ void __launch_bounds__(kFusedThreads)
    fused_kernel(const __grid_constant__ FusedParams<FusedKernelArgs, kPairs> params) {
  using Value = typename Storage<T>::Value;
  extern __shared__ __align__(16) unsigned char shared_memory[];
  __shared__ float token_r[2];
  const FusedKernelArgs& f = params.args;
  const PairArrays pairs{.inv_freq = params.inv_freq, .pair_stream = params.has_pair_stream ? params.pair_stream : nullptr};
  auto* cells = reinterpret_cast<AngleCell<Value>*>(shared_memory);
  const int thread = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const int64_t items = fused_items(f);
  // Scales in device memory, checked by every block alike: one not finite and > 0 and no block writes
  // anything (as the host refuses such a call), the first block flagging it.
  __shared__ bool scales_ok;
  if (thread == 0) {
    scales_ok = fused_scales_usable(f);
    if (!scales_ok && blockIdx.x == 0 && f.rope.error != nullptr) atomicOr(f.rope.error, kScaleInvalid);
  }
  __syncthreads();
  if (!scales_ok) return;
  for (int64_t token = blockIdx.x; token < f.rope.tokens; token += gridDim.x) {
    fused_angles<Value>(f, pairs, token, thread, threads, cells);
    __syncthreads();
    const bool usable = token_error(f.rope, token) == 0;  // else fused_angles reported it
    const int64_t slot = raw_token_slot(f, token);
    if (thread == 0 && f.rope.error != nullptr && f.slots != nullptr && slot_beyond_caches(f, slot)) {
      atomicOr(f.rope.error, kSlotOutOfRange);  // its cache writes are skipped (token_slot)
    }
    // The opt-in duplicate check (the same for every block: all threads reach the barrier): a slot
    // another token shares is written by neither, and flagged.
    const bool shared_slot = f.check_duplicates && f.slots != nullptr &&
                             __syncthreads_or(slot_shared(f.slots, f.slots_i64, f.rope.tokens, token, slot, thread, threads)) != 0;
    if (shared_slot && thread == 0 && f.rope.error != nullptr) atomicOr(f.rope.error, kSlotDuplicate);
    if (usable && thread == 0) fused_token_norms<T>(f, pairs, cells, token, token_r);
    __syncthreads();
    if (usable) {
      // A warp per item: its first thread forms the item's norm factor (in channel order, as the
      // CPU), then the warp's threads take the item's pairs and channels lane by lane (neighbouring
      // channels: coalesced). The block's threads are whole warps (block_of).
      const int lane = thread % 32;
      for (int64_t item = thread / 32; item < items; item += threads / 32) {
        float r = 1.0f;
        if (lane == 0) r = fused_item_factor<T>(f, pairs, cells, token, item, token_r);
        r = __shfl_sync(0xffffffffu, r, 0);
        fused_item<T>(f, pairs, cells, token, item, r, lane, 32, shared_slot);
      }
    }
    __syncthreads();
  }
}

template <int kPairs>
__global__ void __launch_bounds__(kFusedThreads)
    rerotate_kernel(const __grid_constant__ FusedParams<RerotateKernelArgs, kPairs> params) {
  extern __shared__ __align__(16) unsigned char shared_memory[];
  const RerotateKernelArgs& r = params.args;
  const PairArrays pairs{.inv_freq = params.inv_freq, .pair_stream = params.has_pair_stream ? params.pair_stream : nullptr};
  auto* cells = reinterpret_cast<AngleCell<float>*>(shared_memory);
  const int thread = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const int64_t pair_count = r.rope.rotary_dim / 2;
  __shared__ bool scales_ok;  // as fused_kernel's
  if (thread == 0) {
    scales_ok = scales_usable(r.in, r.heads);
    if (!scales_ok && blockIdx.x == 0 && r.rope.error != nullptr) atomicOr(r.rope.error, kScaleInvalid);
  }
  __syncthreads();
  if (!scales_ok) return;
  for (int64_t i = blockIdx.x; i < r.count; i += gridDim.x) {
    const int64_t slot = slot_entry(r.slots, r.slots_i64, i);
    const bool beyond = slot >= r.in.capacity || (r.out.data != nullptr && slot >= r.out.capacity);
    if (beyond) {  // only without host slots (those are checked on the host): skipped and flagged
      if (thread == 0 && r.rope.error != nullptr) atomicOr(r.rope.error, kSlotOutOfRange);
      continue;
    }
    // The opt-in duplicate check (a whole block agrees on the slot: all its threads reach the
    // barrier): a slot listed twice is turned by neither entry, and flagged.
    if (r.check_duplicates && __syncthreads_or(slot_shared(r.slots, r.slots_i64, r.count, i, slot, thread, threads)) != 0) {
      if (thread == 0 && r.rope.error != nullptr) atomicOr(r.rope.error, kSlotDuplicate);
      continue;
    }
    // Raw mode's positions in device memory, as apply's kernels take them: an unusable one (outside
    // [0, 2^31), not a row of the table, fractional with hf_float32) is flagged and its keys left.
    if (const uint32_t bad = r.raw ? token_error(r.rope, i) : 0; bad != 0) {
      if (thread == 0 && r.rope.error != nullptr) atomicOr(r.rope.error, bad);
      continue;
    }
    if (slot >= 0) {  // a whole block agrees: the __syncthreads below are reached by all or none
      for (int64_t j = thread; j < pair_count; j += threads) cells[j] = rerotate_angle(r, pairs, i, j);
      __syncthreads();
      for (int64_t h = thread / 32; h < r.heads; h += threads / 32) rerotate_item(r, pairs, cells, i, h, thread % 32, 32);
      __syncthreads();
    }
  }
}

// rope_store's and qk_norm_rope's fast kernel (src/cuda/fast_store_body.hpp): apply's fast split with
// the cache write (and the norm: kNorm).
// Its arguments by value, as apply.cu's FastParams.
struct FastStoreParams {
  KernelArgs args;
  FastStoreArgs fast;
  bool has_pair_stream;
  double inv_freq[kFastMaxPairs];
  int pair_stream[kFastMaxPairs];
};

// Registers capped at 80 as apply's fast kernels (three blocks of 256 threads per SM); with the norm
// at 128 (two blocks: the norm's lanes need more and a spill costs more than the third block).
// tests/cuda_sass_check.cmake holds the count, the 16-byte accesses and the absence of spills.
template <class T, bool kHalf, bool kNorm, bool kQuant>
__global__ void __launch_bounds__(kFastMaxThreads, kNorm ? 2 : 3)
    fast_store_kernel(const __grid_constant__ FastStoreParams params) {
  extern __shared__ __align__(16) unsigned char shared_memory[];
  const FastStoreArgs& s = params.fast;
  const PairArrays pairs{.inv_freq = params.inv_freq, .pair_stream = params.has_pair_stream ? params.pair_stream : nullptr};
  const FastStoreShared shared = fast_store_shared(shared_memory, s);
  const int x = static_cast<int>(threadIdx.x);
  const int y = static_cast<int>(threadIdx.y);
  const int chunks = static_cast<int>(blockDim.x);
  const int rows = static_cast<int>(blockDim.y);
  const int group = static_cast<int>(blockIdx.y);
  if constexpr (kQuant) {
    // The caches' scales in device memory, checked by every block alike (as fused_kernel): one not
    // finite and > 0 and no block writes anything, the first block flagging it.
    __shared__ bool scales_ok;
    if (x == 0 && y == 0) {
      scales_ok = fast_scales_usable(s);
      if (!scales_ok && blockIdx.x == 0 && blockIdx.y == 0) raise_error(params.args.error, kScaleInvalid);
    }
    __syncthreads();
    if (!scales_ok) return;
  }
  for (int64_t tile = blockIdx.x; tile < s.rope.tiles; tile += gridDim.x) {
    FastThread<kHalf> thread;
    fast_store_phase_a<T, kHalf, kNorm>(params.args, s, pairs, tile, group, x, y, chunks, rows, shared, thread);
    __syncthreads();
    if constexpr (kNorm) {
      fast_store_phase_n<T>(s, tile, group, x, y, chunks, rows, shared);
      __syncthreads();
    }
    fast_store_phase_b<T, kHalf, kNorm, kQuant>(s, tile, group, x, y, rows, shared, thread);
    __syncthreads();
  }
}

template <class T, bool kHalf, bool kNorm, bool kQuant>
void launch_fast_store_as(const FusedKernelArgs& f, const FastShape& shape, cudaStream_t stream) {
  FastStoreParams params{};
  params.args = f.rope;
  params.fast = fast_store_args(f, shape);
  params.has_pair_stream = f.rope.pair_stream != nullptr;
  for (int64_t j = 0; j < f.rope.rotary_dim / 2; ++j) {
    params.inv_freq[j] = fused_frequency(f.rope, j);
    params.pair_stream[j] = f.rope.pair_stream != nullptr ? f.rope.pair_stream[j] : 0;
  }
  params.args.inv_freq = nullptr;  // host pointers, never read on the device
  params.args.pair_stream = nullptr;
  params.args.inv_freq_hf32 = nullptr;
  const dim3 grid(static_cast<unsigned>(shape.grid), static_cast<unsigned>(shape.groups));
  const dim3 block(static_cast<unsigned>(shape.chunks), static_cast<unsigned>(shape.rows));
  fast_store_kernel<T, kHalf, kNorm, kQuant>
      <<<grid, block, static_cast<size_t>(fast_store_shared_bytes(params.fast)), stream>>>(params);
  check(static_cast<int>(cudaGetLastError()), "rope_store fast kernel launch");
}

template <class T>
void launch_fast_store_typed(const FusedKernelArgs& f, const FastShape& shape, cudaStream_t stream) {
  const bool half = f.rope.pair_step == 1;
  if (f.norm) {  // (never with a quantised cache: fast_store_refusal)
    half ? launch_fast_store_as<T, true, true, false>(f, shape, stream)
         : launch_fast_store_as<T, false, true, false>(f, shape, stream);
  } else if (fast_store_quantised(f)) {
    half ? launch_fast_store_as<T, true, false, true>(f, shape, stream)
         : launch_fast_store_as<T, false, false, true>(f, shape, stream);
  } else {
    half ? launch_fast_store_as<T, true, false, false>(f, shape, stream)
         : launch_fast_store_as<T, false, false, false>(f, shape, stream);
  }
}

template <class Args>
void fill_params(FusedParams<Args, static_cast<int>(rotary::cuda::max_pairs)>& p, const Args& args, const KernelArgs& rope) {
  p.args = args;
  p.has_pair_stream = rope.pair_stream != nullptr;
  for (int64_t j = 0; j < rope.rotary_dim / 2; ++j) {
    p.inv_freq[j] = fused_frequency(rope, j);
    p.pair_stream[j] = rope.pair_stream != nullptr ? rope.pair_stream[j] : 0;
  }
}

// The block: the work (a warp per item or head, or a thread per pair) rounded up to a warp, at most
// kFusedThreads; the grid: a
// block per token, at most 65535 * 16 blocks (the kernels loop over the rest).
dim3 block_of(int64_t work) {
  return dim3(static_cast<unsigned>(std::clamp<int64_t>((work + 31) / 32 * 32, 32, kFusedThreads)));
}
dim3 grid_of(int64_t tokens) { return dim3(static_cast<unsigned>(std::min<int64_t>(tokens, int64_t{1} << 20))); }

template <class T, int kPairs, class Full>
void launch_fused_as(const Full& full, const FusedKernelArgs& f, cudaStream_t stream) {
  using Value = typename Storage<T>::Value;
  // The smaller parameter block when the pairs fit (fewer bytes per launch), else the full one.
  FusedParams<FusedKernelArgs, kPairs> params{};
  params.args = full.args;
  params.has_pair_stream = full.has_pair_stream;
  for (int j = 0; j < kPairs; ++j) {
    params.inv_freq[j] = full.inv_freq[j];
    params.pair_stream[j] = full.pair_stream[j];
  }
  params.args.rope.inv_freq = nullptr;  // host pointers, never read on the device
  params.args.rope.pair_stream = nullptr;
  params.args.rope.inv_freq_hf32 = nullptr;
  const int64_t pairs = std::max<int64_t>(f.rope.rotary_dim / 2, 1);
  const size_t shared = static_cast<size_t>(pairs) * sizeof(AngleCell<Value>);
  fused_kernel<T, kPairs><<<grid_of(f.rope.tokens), block_of(std::max(fused_items(f) * 32, pairs)), shared, stream>>>(params);
  check(static_cast<int>(cudaGetLastError()), "fused kernel launch");
}

template <class T>
void launch_fused_typed(const FusedKernelArgs& f, cudaStream_t stream) {
  auto full = std::make_unique<FusedParams<FusedKernelArgs, static_cast<int>(rotary::cuda::max_pairs)>>();
  fill_params(*full, f, f.rope);
  if (f.rope.rotary_dim / 2 <= kFusedSmallPairs) {
    launch_fused_as<T, kFusedSmallPairs>(*full, f, stream);
  } else {
    launch_fused_as<T, static_cast<int>(rotary::cuda::max_pairs)>(*full, f, stream);
  }
}

}  // namespace

void launch_fast_store(const FusedKernelArgs& f, const FastShape& shape, CUstream_st* stream) {
  if (f.rope.tokens == 0) return;
  switch (f.rope.dtype) {
    case DType::f32: launch_fast_store_typed<float>(f, shape, stream); break;
    case DType::f16: launch_fast_store_typed<F16>(f, shape, stream); break;
    case DType::bf16: launch_fast_store_typed<BF16>(f, shape, stream); break;
    default: break;  // never fast (fast_store_refusal)
  }
}

void launch_fused(const FusedKernelArgs& f, CUstream_st* stream) {
  if (f.rope.tokens == 0) return;
  if (fast_store_refusal(f) == nullptr) {
    launch_fast_store(f, fast_store_launch_shape(f, multiprocessors()), stream);
    return;
  }
  switch (f.rope.dtype) {
    case DType::f64: launch_fused_typed<double>(f, stream); break;
    case DType::f16: launch_fused_typed<F16>(f, stream); break;
    case DType::bf16: launch_fused_typed<BF16>(f, stream); break;
    default: launch_fused_typed<float>(f, stream); break;
  }
}

void launch_rerotate(const RerotateKernelArgs& r, CUstream_st* stream) {
  if (r.count == 0) return;
  auto params = std::make_unique<FusedParams<RerotateKernelArgs, static_cast<int>(rotary::cuda::max_pairs)>>();
  fill_params(*params, r, r.rope);
  params->args.rope.inv_freq = nullptr;
  params->args.rope.pair_stream = nullptr;
  params->args.rope.inv_freq_hf32 = nullptr;
  const int64_t pairs = std::max<int64_t>(r.rope.rotary_dim / 2, 1);
  const size_t shared = static_cast<size_t>(pairs) * sizeof(AngleCell<float>);
  rerotate_kernel<static_cast<int>(rotary::cuda::max_pairs)>
      <<<grid_of(r.count), block_of(std::max(r.heads * 32, pairs)), shared, stream>>>(*params);
  check(static_cast<int>(cudaGetLastError()), "rerotate_cache kernel launch");
}

}  // namespace rotary::detail::cuda
