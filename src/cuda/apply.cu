// The CUDA kernels: the body of src/cuda/rope_body.hpp on the device, one instantiation per storage
// type and per size of the launch parameters. Compiled with -fmad=false and without fast math; the
// body uses explicitly rounded intrinsics only (tests/cuda_ptx_check.cmake holds the PTX to that).
#include <cuda_runtime.h>

#include "launch.hpp"
#include "rope_body.hpp"
#include "rotary/cuda.hpp"

namespace rotary::detail::cuda {
namespace {

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
    params.inv_freq[j] = args.inv_freq[j];
    params.pair_stream[j] = args.pair_stream != nullptr ? args.pair_stream[j] : 0;
  }
  // Host pointers, never read on the device (the kernel reads the arrays above).
  params.args.inv_freq = nullptr;
  params.args.pair_stream = nullptr;
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

}  // namespace

void launch(const KernelArgs& args, CUstream_st* stream) {
  if (args.tokens == 0) return;
  launch(args, launch_shape(args), stream);
}

void launch(const KernelArgs& args, const LaunchShape& shape, CUstream_st* stream) {
  if (args.tokens == 0) return;
  switch (args.dtype) {
    case DType::f32: launch_as<float>(args, shape, stream); break;
    case DType::f64: launch_as<double>(args, shape, stream); break;
    case DType::f16: launch_as<F16>(args, shape, stream); break;
    case DType::bf16: launch_as<BF16>(args, shape, stream); break;
  }
}

}  // namespace rotary::detail::cuda
