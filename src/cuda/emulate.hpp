// Internal: the CUDA kernels' grid played on the CPU. The same body functions the device runs
// (src/cuda/rope_body.hpp), compiled by the host compiler, over every block and every thread, in the
// order the barriers allow: for each token of a block, phase 0 for every thread, then phase 1 for
// every thread. No CUDA call; single-threaded. Tests hold its results bit for bit against the
// reference backend.
#pragma once

#include <algorithm>
#include <vector>

#include "rope_body.hpp"

namespace rotary::detail::cuda {

/// Runs args on the host with the grid `shape` (launch_shape(args) is what the device launcher
/// uses). Probe::stored sees every element store.
template <class T, class Probe = NoProbe>
void emulate_as(const KernelArgs& args, const LaunchShape& shape) {
  using Value = typename Storage<T>::Value;
  std::vector<AngleCell<Value>> shared(
      shape.shared_angles ? static_cast<size_t>(std::max<int64_t>(args.rotary_dim / 2, 1)) : 0);
  AngleCell<Value>* cells = shape.shared_angles ? shared.data() : nullptr;
  const PairArrays pairs{.inv_freq = args.inv_freq, .pair_stream = args.pair_stream};
  for (int64_t block = 0; block < shape.blocks; ++block) {
    for (int64_t token = block; token < args.tokens; token += shape.blocks) {
      for (int t = 0; t < shape.threads; ++t) rope_angles<T>(args, pairs, token, t, shape.threads, cells);
      for (int t = 0; t < shape.threads; ++t) {
        rope_rotate<T, Probe>(args, pairs, token, t, shape.threads, cells);
      }
    }
  }
}

template <class Probe = NoProbe>
void emulate(const KernelArgs& args, const LaunchShape& shape) {
  switch (args.dtype) {
    case DType::f32: emulate_as<float, Probe>(args, shape); break;
    case DType::f64: emulate_as<double, Probe>(args, shape); break;
    case DType::f16: emulate_as<F16, Probe>(args, shape); break;
    case DType::bf16: emulate_as<BF16, Probe>(args, shape); break;
  }
}

}  // namespace rotary::detail::cuda
