// The CUDA kernels: the body of src/cuda/rope_body.hpp on the device, one instantiation per storage
// type and per size of the launch parameters. Compiled with -fmad=false and without fast math; the
// body uses explicitly rounded intrinsics only (tests/cuda_ptx_check.cmake holds the PTX to that).
#include <cuda_runtime.h>

#include <atomic>

#include "fast_body.hpp"
#include "launch.hpp"
#include "rope_body.hpp"
#include "rotary/cuda.hpp"

namespace rotary::detail::cuda {
namespace {

// Pair j's frequency as the device reads it from the launch parameters: inv_freq for every source
// but hf_float32, which reads transformers' float32 inv_freq (PairArrays: the launch parameters
// hold it as the float's exact double, and the device's PairArrays::inv_freq_hf32 stays null).
double parameter_frequency(const KernelArgs& args, int64_t j) {
  if (args.angle_source != KernelAngleSource::hf_float32) return args.inv_freq[j];
  return static_cast<double>(args.inv_freq_hf32 != nullptr ? args.inv_freq_hf32[j] : static_cast<float>(args.inv_freq[j]));
}

static_assert(kPositionOutOfRange == rotary::cuda::position_out_of_range &&
              kPositionNotInTable == rotary::cuda::position_not_in_table &&
              kPositionNotInAngles == rotary::cuda::position_not_in_angles &&
              kPositionBeyondXposReach == rotary::cuda::position_beyond_xpos_reach);

// Everything a launch reads, by value in the kernel's parameters: args, and the per-pair arrays
// args points to on the host (inv_freq, pair_stream), so no call copies anything to the device.
// The kernel reads them where they lie (__grid_constant__: no copy into local memory), the body
// taking the arrays through PairArrays (args.inv_freq and args.pair_stream are host pointers).
template <int kPairs>
struct Params {
  KernelArgs args;
  bool shared_angles;
  bool has_pair_stream;
  double inv_freq[kPairs];
  int pair_stream[kPairs];
};
constexpr int kSmallPairs = 128;  // rotary_dim <= 256: about 1.8 KB of parameters
static_assert(sizeof(Params<static_cast<int>(rotary::cuda::max_pairs)>) <= 32764,
              "CUDA limits kernel parameters to 32764 bytes");

template <class T, int kPairs>
__global__ void __launch_bounds__(kMaxThreads) rope_kernel(const __grid_constant__ Params<kPairs> params) {
  using Value = typename Storage<T>::Value;
  extern __shared__ __align__(16) unsigned char shared_memory[];
  const KernelArgs& args = params.args;
  const PairArrays pairs{.inv_freq = params.inv_freq,
                         .pair_stream = params.has_pair_stream ? params.pair_stream : nullptr};
  auto* cells = params.shared_angles ? reinterpret_cast<AngleCell<Value>*>(shared_memory) : nullptr;
  const int thread = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  for (int64_t token = blockIdx.x; token < args.tokens; token += gridDim.x) {
    rope_angles<T>(args, pairs, token, thread, threads, cells);
    __syncthreads();
    rope_rotate<T>(args, pairs, token, thread, threads, cells);
    __syncthreads();
  }
}

template <class T, int kPairs>
void launch_as(const KernelArgs& args, const LaunchShape& shape, cudaStream_t stream) {
  Params<kPairs> params{};
  params.args = args;
  params.shared_angles = shape.shared_angles;
  params.has_pair_stream = args.pair_stream != nullptr;
  const int64_t pairs = args.rotary_dim / 2;
  for (int64_t j = 0; j < pairs; ++j) {
    params.inv_freq[j] = parameter_frequency(args, j);
    params.pair_stream[j] = args.pair_stream != nullptr ? args.pair_stream[j] : 0;
  }
  // Host pointers, never read on the device (the kernel reads the arrays above).
  params.args.inv_freq = nullptr;
  params.args.pair_stream = nullptr;
  params.args.inv_freq_hf32 = nullptr;
  const size_t shared = shape.shared_angles ? static_cast<size_t>(shared_bytes(args)) : 0;
  rope_kernel<T, kPairs><<<static_cast<unsigned>(shape.blocks), static_cast<unsigned>(shape.threads),
                           shared, stream>>>(params);
  check(static_cast<int>(cudaGetLastError()), "kernel launch");
}

template <class T>
void launch_as(const KernelArgs& args, const LaunchShape& shape, cudaStream_t stream) {
  if (args.rotary_dim / 2 <= kSmallPairs) {
    launch_as<T, kSmallPairs>(args, shape, stream);
  } else {
    launch_as<T, static_cast<int>(rotary::cuda::max_pairs)>(args, shape, stream);
  }
}

// ---- The fast kernels (src/cuda/fast_body.hpp): one per storage type and pairing ----

// As Params: KernelArgs (phase A's angle sources and positions), the fast body's own arguments,
// and the per-pair arrays, all read where they lie.
struct FastParams {
  KernelArgs args;
  FastArgs fast;
  bool has_pair_stream;
  double inv_freq[kFastMaxPairs];
  int pair_stream[kFastMaxPairs];
};

// Registers: __launch_bounds__(256, 3) caps them at 80 (three blocks of 256 threads resident per
// SM, 768 of its 2048 threads); FastThread says why that suffices, and tests/cuda_sass_check.cmake
// holds the count, the 16-byte accesses and the absence of spills and subroutine calls.
template <class T, bool kHalf>
__global__ void __launch_bounds__(kFastMaxThreads, 3) fast_rope_kernel(const __grid_constant__ FastParams params) {
  extern __shared__ __align__(16) unsigned char shared_memory[];
  const FastArgs& f = params.fast;
  const PairArrays pairs{.inv_freq = params.inv_freq,
                         .pair_stream = params.has_pair_stream ? params.pair_stream : nullptr};
  const FastShared shared = fast_shared(shared_memory, f);
  const int x = static_cast<int>(threadIdx.x);
  const int y = static_cast<int>(threadIdx.y);
  const int chunks = static_cast<int>(blockDim.x);
  const int rows = static_cast<int>(blockDim.y);
  const int group = static_cast<int>(blockIdx.y);
  for (int64_t tile = blockIdx.x; tile < f.tiles; tile += gridDim.x) {
    FastThread<kHalf> thread;
    fast_phase_a<T, kHalf>(params.args, f, pairs, tile, group, x, y, chunks, rows, shared, thread);
    __syncthreads();
    fast_phase_b<T, kHalf, NoProbe>(f, tile, group, x, y, rows, shared, thread);
    __syncthreads();
  }
}

template <class T, bool kHalf>
void launch_fast_as(const KernelArgs& args, const FastShape& shape, cudaStream_t stream) {
  FastParams params{};
  params.args = args;
  params.fast = fast_args(args, shape);
  params.has_pair_stream = args.pair_stream != nullptr;
  const int64_t pairs = args.rotary_dim / 2;
  for (int64_t j = 0; j < pairs; ++j) {
    params.inv_freq[j] = parameter_frequency(args, j);
    params.pair_stream[j] = args.pair_stream != nullptr ? args.pair_stream[j] : 0;
  }
  params.args.inv_freq = nullptr;  // host pointers, never read on the device
  params.args.pair_stream = nullptr;
  params.args.inv_freq_hf32 = nullptr;
  const dim3 grid(static_cast<unsigned>(shape.grid), static_cast<unsigned>(shape.groups));
  const dim3 block(static_cast<unsigned>(shape.chunks), static_cast<unsigned>(shape.rows));
  fast_rope_kernel<T, kHalf><<<grid, block, static_cast<size_t>(fast_shared_bytes(params.fast)), stream>>>(params);
  check(static_cast<int>(cudaGetLastError()), "kernel launch");
}

template <class T>
void launch_fast_as(const KernelArgs& args, const FastShape& shape, cudaStream_t stream) {
  if (args.pair_step == 1) {
    launch_fast_as<T, true>(args, shape, stream);
  } else {
    launch_fast_as<T, false>(args, shape, stream);
  }
}

// Devices' SM counts, read once per device (cudaDeviceGetAttribute) and kept for the process.
constexpr int kCachedDevices = 64;
std::atomic<int> multiprocessor_counts[kCachedDevices];

}  // namespace

int kernel_image_status() {
  cudaFuncAttributes attributes{};
  const cudaError_t status = cudaFuncGetAttributes(&attributes, fast_rope_kernel<BF16, true>);
  if (status != cudaSuccess) static_cast<void>(cudaGetLastError());
  return static_cast<int>(status);
}

int multiprocessors() {
  int device = 0;
  check(static_cast<int>(cudaGetDevice(&device)), "cudaGetDevice");
  if (device >= 0 && device < kCachedDevices) {
    const int known = multiprocessor_counts[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int count = 0;
  check(static_cast<int>(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device)),
        "cudaDeviceGetAttribute (multiprocessors)");
  if (device >= 0 && device < kCachedDevices) multiprocessor_counts[device].store(count, std::memory_order_relaxed);
  return count;
}

void launch(const KernelArgs& args, CUstream_st* stream) {
  if (args.tokens == 0) return;
  if (choose_kernel(args).kind == KernelKind::fast) {
    launch_fast(args, fast_launch_shape(args, multiprocessors()), stream);
  } else {
    launch(args, launch_shape(args), stream);
  }
}

void launch(const KernelArgs& args, const LaunchShape& shape, CUstream_st* stream) {
  if (args.tokens == 0) return;
  switch (args.dtype) {
    case DType::f32: launch_as<float>(args, shape, stream); break;
    case DType::f64: launch_as<double>(args, shape, stream); break;
    case DType::f16: launch_as<F16>(args, shape, stream); break;
    case DType::bf16: launch_as<BF16>(args, shape, stream); break;
    default: break;  // cache dtypes never reach apply's kernels (validate refuses them)
  }
}

void launch_fast(const KernelArgs& args, const FastShape& shape, CUstream_st* stream) {
  if (args.tokens == 0) return;
  switch (args.dtype) {
    case DType::f32: launch_fast_as<float>(args, shape, stream); break;
    case DType::f16: launch_fast_as<F16>(args, shape, stream); break;
    case DType::bf16: launch_fast_as<BF16>(args, shape, stream); break;
    case DType::f64: break;  // never fast (choose_kernel)
    default: break;  // cache dtypes never reach apply's kernels (validate refuses them)
  }
}

}  // namespace rotary::detail::cuda
