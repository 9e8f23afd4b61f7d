// Internal: the CUDA kernels' body, written once as ROTARY_HD code over explicit (block, thread)
// indices, so that nvcc compiles it for the device (src/cuda/apply.cu) and a plain C++ compiler
// runs the same functions over every block and thread on the CPU (src/cuda/emulate.hpp), where the
// tests compare it bit for bit with the reference. The angle semantics, storage and pair loop are
// the kernel layer's, shared with the reference and the CPU (src/kernel/angles.hpp, storage.hpp,
// pairs.hpp); device branches use explicitly rounded intrinsics only.
//
// Work split (v1: simple and general; speed comes later). Blocks take tokens in a grid-stride loop;
// for each token
//   phase 0 (rope_angles): the block's threads fill `shared` with the token's (c, s) for every pair
//           (pair_angle: from a table, exact, or the caller's; s negated for the inverse) — once
//           per token, shared by all heads of q and k;
//   barrier;
//   phase 1 (rope_rotate): thread t takes items t, t + threads, ... of the token, an item being one
//           pair of one head of q or k (consecutive threads: consecutive pairs), or one pass-through
//           channel to copy;
//   barrier (the next token overwrites `shared`).
// Each pair is loaded whole before either of its outputs is stored, and belongs to one item, so
// in-place calls are race-free. When the angle row does not fit in shared memory
// (LaunchShape::shared_angles false), phase 1 computes each item's angle itself.
// The body reads KernelArgs by reference and keeps no per-token array: the kernel reads its launch
// parameters where they lie (no copy to local memory, no stack frame), and a pair reads its own
// stream's position when it needs it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../kernel/angles.hpp"
#include "../kernel/args.hpp"
#include "../kernel/pairs.hpp"
#include "../kernel/storage.hpp"
#include "../math/hd.hpp"

namespace rotary::detail::cuda {

/// How a kernel is launched; the emulator plays the same shape.
struct LaunchShape {
  int64_t blocks = 0;          ///< grid size; blocks loop over tokens block, block + blocks, ...
  int threads = 0;             ///< threads per block
  bool shared_angles = false;  ///< phase 0 fills shared memory (else phase 1 computes angles)
};

/// Shared memory a block needs for one token's angles (double cells for f64, else float).
inline int64_t shared_bytes(const KernelArgs& args) {
  const auto cell = args.dtype == DType::f64 ? sizeof(AngleCell<double>) : sizeof(AngleCell<float>);
  return args.rotary_dim / 2 * static_cast<int64_t>(cell);
}

inline constexpr int kMaxThreads = 256;
inline constexpr int64_t kMaxBlocks = int64_t{1} << 20;  ///< more tokens: blocks loop over them
/// The dynamic shared memory every CUDA device grants a block without opting in.
inline constexpr int64_t kMaxSharedAngleBytes = 48 * 1024;

/// The launch for args (host code): one block per token up to kMaxBlocks; threads: one token's
/// items (pairs of every head, plus pass-through copies) rounded up to a warp, at most kMaxThreads;
/// angles in shared memory when the row fits kMaxSharedAngleBytes.
inline LaunchShape launch_shape(const KernelArgs& args) {
  int64_t items = 0;
  for (int o = 0; o < args.operand_count; ++o) {
    const KernelOperand& op = args.operands[o];
    const int64_t tail = args.copy_tail && !op.in_place ? args.head_dim - args.rotary_dim : 0;
    items += op.heads * (args.rotary_dim / 2 + tail);
  }
  LaunchShape shape;
  shape.blocks = std::min(args.tokens, kMaxBlocks);
  shape.threads = static_cast<int>(std::clamp<int64_t>((items + 31) / 32 * 32, 32, kMaxThreads));
  shape.shared_angles = shared_bytes(args) <= kMaxSharedAngleBytes;
  return shape;
}

ROTARY_HD inline void raise_error(uint32_t* flag, uint32_t bits) {
  if (flag == nullptr || bits == 0) return;
#if defined(__CUDA_ARCH__)
  atomicOr(flag, bits);
#else
  *flag |= bits;
#endif
}

/// Phase 0 for one token: thread `thread` of `threads` fills shared[j] for pairs j = thread,
/// thread + threads, ...; thread 0 reports an unusable position. Nothing is written for a skipped
/// token (phase 1 skips it too).
template <class T, class Value = typename Storage<T>::Value>
ROTARY_HD inline void rope_angles(const KernelArgs& args, const PairArrays& pairs, int64_t token,
                                  int thread, int threads, AngleCell<Value>* shared) {
  const uint32_t error = token_error(args, token);
  if (thread == 0) raise_error(args.error, error);
  if (error != 0 || shared == nullptr) return;
  const int64_t count = args.rotary_dim / 2;
  for (int64_t j = thread; j < count; j += threads) shared[j] = pair_angle<Value>(args, pairs, token, j);
}

/// Phase 1 for one token: thread `thread` of `threads` rotates or copies items thread,
/// thread + threads, ... (operand by operand, head by head: the pairs, then the pass-through
/// channels to copy). `shared`: phase 0's angles, or null to compute each item's.
template <class T, class Probe = NoProbe, class Value = typename Storage<T>::Value>
ROTARY_HD inline void rope_rotate(const KernelArgs& args, const PairArrays& pairs, int64_t token,
                                  int thread, int threads, const AngleCell<Value>* shared) {
  if (token_error(args, token) != 0) return;
  const int64_t b = token / args.seq;
  const int64_t s = token % args.seq;
  const int64_t pair_count = args.rotary_dim / 2;
  const int64_t passthrough = args.head_dim - args.rotary_dim;
  int64_t item = thread;
  for (int o = 0; o < args.operand_count; ++o) {
    const KernelOperand& op = args.operands[o];
    const int64_t lanes = pair_count + (copies_tail(args, op) ? passthrough : 0);
    const int64_t items = op.heads * lanes;
    for (; item < items; item += threads) {
      const int64_t lane = item % lanes;
      const HeadOffsets at = head_offsets(op, b, s, item / lanes);
      if (lane < pair_count) {
        AngleCell<Value> angle = shared != nullptr ? shared[lane] : pair_angle<Value>(args, pairs, token, lane);
        if (args.xpos_scale_base != 0) angle = xpos_angle(args, pairs, token, lane, op.key, angle);
        rotate_pair_at<T, Probe>(args, op, at, lane, angle);
      } else {
        copy_channel_at<T, Probe>(args, op, at, lane - pair_count);
      }
    }
    item -= items;  // the next operand's items continue the same stride
  }
}

}  // namespace rotary::detail::cuda
