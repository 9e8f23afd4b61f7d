// Internal: the CUDA kernels' grids played on the CPU. The same body functions the device runs
// (src/cuda/rope_body.hpp, src/cuda/fast_body.hpp), compiled by the host compiler, over every block
// and every thread, in the order the barriers allow: for each token (general) or tile (fast) of a
// block, the first phase for every thread, then the second for every thread. No CUDA call;
// single-threaded. Tests hold its results bit for bit against the reference.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "fast_body.hpp"
#include "fast_store_body.hpp"
#include "rope_body.hpp"

namespace rotary::detail::cuda {

/// Runs args on the host with the general kernel's grid `shape` (launch_shape(args) is what the
/// device launcher uses). Probe::stored sees every element store.
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
    default: break;  // cache dtypes never reach apply's kernels
  }
}

/// Runs args (a call choose_kernel gives to the fast kernels) on the host with the fast grid
/// `shape`: blocks (x, group), each looping over its tiles. Shared memory starts every tile as NaN
/// bytes (0xff: a token's error word nonzero, so a token whose cells phase A failed to write is
/// skipped, and a cell read before it is written is NaN), as a device's holds the last tile's.
template <class T, bool kHalf, class Probe = NoProbe>
void emulate_fast_as(const KernelArgs& args, const FastShape& shape) {
  const FastArgs f = fast_args(args, shape);
  std::vector<unsigned char> memory(static_cast<size_t>(fast_shared_bytes(f)));
  const FastShared shared = fast_shared(memory.data(), f);
  const PairArrays pairs{.inv_freq = args.inv_freq, .pair_stream = args.pair_stream};
  std::vector<FastThread<kHalf>> threads(static_cast<size_t>(shape.chunks * shape.rows));
  for (int group = 0; group < shape.groups; ++group) {
    for (int64_t block = 0; block < shape.grid; ++block) {
      for (int64_t tile = block; tile < f.tiles; tile += shape.grid) {
        std::fill(memory.begin(), memory.end(), static_cast<unsigned char>(0xff));
        for (int y = 0; y < shape.rows; ++y) {
          for (int x = 0; x < shape.chunks; ++x) {
            fast_phase_a<T, kHalf>(args, f, pairs, tile, group, x, y, shape.chunks, shape.rows, shared,
                                   threads[static_cast<size_t>(y * shape.chunks + x)]);
          }
        }
        for (int y = 0; y < shape.rows; ++y) {
          for (int x = 0; x < shape.chunks; ++x) {
            fast_phase_b<T, kHalf, Probe>(f, tile, group, x, y, shape.rows, shared,
                                          threads[static_cast<size_t>(y * shape.chunks + x)]);
          }
        }
      }
    }
  }
}

template <class Probe = NoProbe>
void emulate_fast(const KernelArgs& args, const FastShape& shape) {
  const bool half = args.pair_step == 1;
  switch (args.dtype) {
    case DType::f32:
      half ? emulate_fast_as<float, true, Probe>(args, shape) : emulate_fast_as<float, false, Probe>(args, shape);
      break;
    case DType::f16:
      half ? emulate_fast_as<F16, true, Probe>(args, shape) : emulate_fast_as<F16, false, Probe>(args, shape);
      break;
    case DType::bf16:
      half ? emulate_fast_as<BF16, true, Probe>(args, shape) : emulate_fast_as<BF16, false, Probe>(args, shape);
      break;
    case DType::f64: break;  // never fast (choose_kernel)
    default: break;  // cache dtypes never reach apply's kernels
  }
}

/// What detail::cuda::launch(args, stream) runs on a device with `multiprocessors` SMs: the kernel
/// choose_kernel picks, with its default launch shape.
template <class Probe = NoProbe>
void emulate_dispatched(const KernelArgs& args, int multiprocessors) {
  if (args.tokens == 0) return;
  if (choose_kernel(args).kind == KernelKind::fast) {
    emulate_fast<Probe>(args, fast_launch_shape(args, multiprocessors));
  } else {
    emulate<Probe>(args, launch_shape(args));
  }
}

/// Runs a rope_store or qk_norm_rope call (one fast_store_refusal takes) on the host with the fast
/// store grid `shape`, as emulate_fast_as plays apply's: blocks (x, group) looping over their tiles,
/// phase A for every thread, then (a norm) phase N, then phase B; shared memory 0xff bytes at every tile (a cell or cache row read
/// before phase A writes it is NaN or a negative row: skipped, never a wrong address).
template <class T, bool kHalf, bool kNorm, bool kQuant>
void emulate_fast_store_as(const FusedKernelArgs& f, const FastShape& shape) {
  const FastStoreArgs s = fast_store_args(f, shape);
  if (kQuant && !fast_scales_usable(s)) {  // every block alike: nothing written, flagged
    raise_error(f.rope.error, kScaleInvalid);
    return;
  }
  std::vector<unsigned char> memory(static_cast<size_t>(fast_store_shared_bytes(s)));
  const FastStoreShared shared = fast_store_shared(memory.data(), s);
  const PairArrays pairs = pair_arrays(f.rope);
  std::vector<FastThread<kHalf>> threads(static_cast<size_t>(shape.chunks * shape.rows));
  for (int group = 0; group < shape.groups; ++group) {
    for (int64_t block = 0; block < shape.grid; ++block) {
      for (int64_t tile = block; tile < s.rope.tiles; tile += shape.grid) {
        std::fill(memory.begin(), memory.end(), static_cast<unsigned char>(0xff));
        for (int y = 0; y < shape.rows; ++y) {
          for (int x = 0; x < shape.chunks; ++x) {
            fast_store_phase_a<T, kHalf, kNorm>(f.rope, s, pairs, tile, group, x, y, shape.chunks, shape.rows, shared,
                                                threads[static_cast<size_t>(y * shape.chunks + x)]);
          }
        }
        if constexpr (kNorm) {  // its own phase, between two barriers
          for (int y = shape.rows - 1; y >= 0; --y) {
            for (int x = shape.chunks - 1; x >= 0; --x) {
              fast_store_phase_n<T>(s, tile, group, x, y, shape.chunks, shape.rows, shared);
            }
          }
        }
        for (int y = shape.rows - 1; y >= 0; --y) {  // any order: every vector is one thread's
          for (int x = shape.chunks - 1; x >= 0; --x) {
            fast_store_phase_b<T, kHalf, kNorm, kQuant>(s, tile, group, x, y, shape.rows, shared,
                                                threads[static_cast<size_t>(y * shape.chunks + x)]);
          }
        }
      }
    }
  }
}

template <class T>
void emulate_fast_store_typed(const FusedKernelArgs& f, const FastShape& shape) {
  const bool half = f.rope.pair_step == 1;
  if (f.norm) {  // (never with a quantised cache: fast_store_refusal)
    half ? emulate_fast_store_as<T, true, true, false>(f, shape) : emulate_fast_store_as<T, false, true, false>(f, shape);
  } else if (fast_store_quantised(f)) {
    half ? emulate_fast_store_as<T, true, false, true>(f, shape) : emulate_fast_store_as<T, false, false, true>(f, shape);
  } else {
    half ? emulate_fast_store_as<T, true, false, false>(f, shape) : emulate_fast_store_as<T, false, false, false>(f, shape);
  }
}

inline void emulate_fast_store(const FusedKernelArgs& f, const FastShape& shape) {
  if (f.rope.tokens == 0) return;
  switch (f.rope.dtype) {
    case DType::f32: emulate_fast_store_typed<float>(f, shape); break;
    case DType::f16: emulate_fast_store_typed<F16>(f, shape); break;
    case DType::bf16: emulate_fast_store_typed<BF16>(f, shape); break;
    default: break;  // never fast (fast_store_refusal)
  }
}

}  // namespace rotary::detail::cuda
