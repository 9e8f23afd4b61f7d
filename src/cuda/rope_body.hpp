// Internal: the CUDA kernels' body, written once as ROTARY_HD code over explicit (block, thread)
// indices, so that nvcc compiles it for the device (src/cuda/apply.cu) and a plain C++ compiler
// runs the same functions over every block and thread on the CPU (src/cuda/emulate.hpp), where the
// tests compare it bit for bit with the reference. Numerics are the shared headers': the rotation
// detail::rotate_minus (src/rotate.hpp), exact angles detail::cos_sin_of_product
// (src/math/exact_angle.hpp), 16-bit rounding src/half.hpp; device branches use explicitly rounded
// intrinsics only.
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

#include "../half.hpp"
#include "../kernel_args.hpp"
#include "../math/exact_angle.hpp"
#include "../math/hd.hpp"
#include "../math/xpos.hpp"
#include "../rotate.hpp"

namespace rotary::detail::cuda {

/// Tags of the 16-bit storage types (binary16, bfloat16).
struct F16 {};
struct BF16 {};

/// Storage of one dtype: load widens to Value (float, or double for f64), store narrows once
/// (nearest even, src/half.hpp); `Bits` is the element as an integer, for bit-exact copies.
template <class T>
struct Storage;
template <>
struct Storage<float> {
  using Value = float;
  using Bits = uint32_t;
  ROTARY_HD static float load(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
  ROTARY_HD static void store(void* p, int64_t i, float v) { static_cast<float*>(p)[i] = v; }
};
template <>
struct Storage<double> {
  using Value = double;
  using Bits = uint64_t;
  ROTARY_HD static double load(const void* p, int64_t i) { return static_cast<const double*>(p)[i]; }
  ROTARY_HD static void store(void* p, int64_t i, double v) { static_cast<double*>(p)[i] = v; }
};
template <>
struct Storage<F16> {
  using Value = float;
  using Bits = uint16_t;
  ROTARY_HD static float load(const void* p, int64_t i) {
    return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  ROTARY_HD static void store(void* p, int64_t i, float v) {
    static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
  }
};
template <>
struct Storage<BF16> {
  using Value = float;
  using Bits = uint16_t;
  ROTARY_HD static float load(const void* p, int64_t i) {
    return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  ROTARY_HD static void store(void* p, int64_t i, float v) {
    static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
  }
};

/// One pair's angle values in shared memory.
template <class Value>
struct AngleCell {
  Value c;
  Value s;
};

/// Observes every element store of the bodies and every 16-byte access of the fast body (the
/// emulator counts stores and checks alignment; on the device this is nothing).
struct NoProbe {
  ROTARY_HD static void stored(const void*) {}
  ROTARY_HD static void vector(const void*) {}
};

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

/// The per-pair arrays the body reads: KernelArgs::inv_freq and pair_stream on the host (the
/// emulator); on the device, the copies in the kernel's own parameters (src/cuda/apply.cu), so
/// that the kernel reads its KernelArgs where they lie instead of copying them.
struct PairArrays {
  const double* inv_freq = nullptr;  ///< rotary_dim / 2 values
  const int* pair_stream = nullptr;  ///< rotary_dim / 2 stream indices, or null: all stream 0
};

/// The position of token (b, s) (token = b * seq + s) in stream k of the given positions, as a
/// double (exact: whole numbers below 2^53, floats, doubles), as Positions::value reads it.
ROTARY_HD inline double position_of(const KernelPositions& p, int64_t token, int64_t s, int stream) {
  using Kind = KernelPositions::Kind;
  if (p.kind == Kind::sequential) return static_cast<double>(p.offset + s);
  const int64_t i = (p.streams == 1 ? 0 : stream) * p.count + (token < p.count ? token : s);
  switch (p.kind) {
    case Kind::i32: return static_cast<double>(static_cast<const int32_t*>(p.data)[i]);
    case Kind::i64: return static_cast<double>(static_cast<const int64_t*>(p.data)[i]);
    case Kind::f32: return static_cast<double>(static_cast<const float*>(p.data)[i]);
    default: return static_cast<const double*>(p.data)[i];
  }
}

/// The kPosition* bit of a position the angle source cannot use, or 0. Usable: in [0, 2^31) and,
/// where rows are indexed by it (a table, per_position caller angles), a whole number whose row
/// exists.
ROTARY_HD inline uint32_t position_error(const KernelArgs& args, double v) {
  if (!(v >= 0.0 && v < static_cast<double>(max_position_limit))) return kPositionOutOfRange;
  const auto whole = static_cast<int64_t>(v);
  const bool fractional = static_cast<double>(whole) != v;
  if (args.angle_source == KernelAngleSource::table &&
      (fractional || whole < args.table.first || whole - args.table.first >= args.table.rows)) {
    return kPositionNotInTable;
  }
  if (args.angle_source == KernelAngleSource::caller && args.angles.per_position &&
      (fractional || whole >= args.angles.rows)) {
    return kPositionNotInAngles;
  }
  if (args.xpos_scale_base != 0) {
    const double from_center = ieee::sub(v, args.xpos_center);
    if (!(from_center <= args.xpos_reach && -from_center <= args.xpos_reach)) return kPositionBeyondXposReach;
  }
  return 0;
}

/// The kPosition* bit of the first unusable position of token `token` (sequence index s = token %
/// seq) over every stream the schedule reads, or 0 when all are usable.
ROTARY_HD inline uint32_t token_error(const KernelArgs& args, int64_t token, int64_t s) {
  for (int k = 0; k < args.streams; ++k) {
    const uint32_t error = position_error(args, position_of(args.positions, token, s, k));
    if (error != 0) return error;
  }
  return 0;
}
ROTARY_HD inline uint32_t token_error(const KernelArgs& args, int64_t token) {
  return token_error(args, token, token % args.seq);
}

/// One element of the caller's cos or sin, widened to double as the CPU's caller_row does.
ROTARY_HD inline double load_angle(DType dtype, const void* base, int64_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<double>(static_cast<const float*>(base)[i]);
    case DType::f64: return static_cast<const double*>(base)[i];
    case DType::f16: return static_cast<double>(f16_to_f32(static_cast<const uint16_t*>(base)[i]));
    default: return static_cast<double>(bf16_to_f32(static_cast<const uint16_t*>(base)[i]));
  }
}

/// Pair j's (c, s) for token `token` = b * seq + s_index (all of whose positions are usable:
/// token_error 0), sin negated for the inverse: what detail::float_angle_row (Value float) and
/// double_angle_row (Value double) give the reference, bit for bit. The caller gives b and s_index
/// (the fast kernels divide by seq with a precomputed multiplier, src/cuda/fast_body.hpp).
template <class Value>
ROTARY_HD inline AngleCell<Value> pair_angle(const KernelArgs& args, const PairArrays& pairs, int64_t token,
                                             int64_t b, int64_t s_index, int64_t j) {
  const int stream = pairs.pair_stream == nullptr ? 0 : pairs.pair_stream[j];
  Value c;
  Value s;
  if (args.angle_source == KernelAngleSource::caller) {
    // The caller's value as given (multi-stream: the caller merged the streams).
    const KernelCallerAngles& a = args.angles;
    const int64_t first = a.per_position || a.broadcast ? 0 : b;
    const int64_t row = a.per_position
                            ? static_cast<int64_t>(position_of(args.positions, token, s_index, stream))
                            : s_index;
    const int64_t column = j * a.column_step;
    const int64_t ci = first * a.cos_strides[0] + row * a.cos_strides[1] + column * a.cos_strides[2];
    const int64_t si = first * a.sin_strides[0] + row * a.sin_strides[1] + column * a.sin_strides[2];
    c = static_cast<Value>(load_angle(a.dtype, a.cos, ci));
    s = static_cast<Value>(load_angle(a.dtype, a.sin, si));
  } else if (args.angle_source == KernelAngleSource::table) {
    const double position = position_of(args.positions, token, s_index, stream);
    const int64_t at = (static_cast<int64_t>(position) - args.table.first) * (args.rotary_dim / 2) + j;
    c = static_cast<Value>(args.table.cos[at]);
    s = static_cast<Value>(args.table.sin[at]);
  } else {
    // cos and sin in double, times the factor in double, then (float rows) one rounding.
    const double position = position_of(args.positions, token, s_index, stream);
    const CosSin cs = cos_sin_of_product(position, pairs.inv_freq[j]);
    c = static_cast<Value>(ieee::mul(cs.cos, args.attention_factor));
    s = static_cast<Value>(ieee::mul(cs.sin, args.attention_factor));
  }
  return {c, args.inverse ? -s : s};
}
template <class Value>
ROTARY_HD inline AngleCell<Value> pair_angle(const KernelArgs& args, const PairArrays& pairs, int64_t token,
                                             int64_t j) {
  return pair_angle<Value>(args, pairs, token, token / args.seq, token % args.seq, j);
}

/// xPos: pair j's row value for a query or a key (`key`) at the token's position in the pair's
/// stream, as detail::xpos_float_row / xpos_double_row give the reference, bit for bit.
template <class Value>
ROTARY_HD inline AngleCell<Value> xpos_angle(const KernelArgs& args, const PairArrays& pairs, int64_t token,
                                             int64_t j, bool key, AngleCell<Value> angle) {
  const int stream = pairs.pair_stream == nullptr ? 0 : pairs.pair_stream[j];
  const double position = position_of(args.positions, token, token % args.seq, stream);
  const double sigma = xpos_scale(xpos_log_zeta_of(j, args.rotary_dim), position, args.xpos_center,
                                  args.xpos_scale_base, key);
  if constexpr (sizeof(Value) == sizeof(double)) {
    return {ieee::mul(angle.c, sigma), ieee::mul(angle.s, sigma)};
  } else {
    return {xpos_scaled(angle.c, sigma), xpos_scaled(angle.s, sigma)};
  }
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
  using S = Storage<T>;
  if (token_error(args, token) != 0) return;
  const int64_t b = token / args.seq;
  const int64_t s = token % args.seq;
  const int64_t pair_count = args.rotary_dim / 2;
  const int64_t passthrough = args.head_dim - args.rotary_dim;
  int64_t item = thread;
  for (int o = 0; o < args.operand_count; ++o) {
    const KernelOperand& op = args.operands[o];
    const int64_t lanes = pair_count + (args.copy_tail && !op.in_place ? passthrough : 0);
    const int64_t items = op.heads * lanes;
    for (; item < items; item += threads) {
      const int64_t h = item / lanes;
      const int64_t lane = item % lanes;
      const int64_t in_base = b * op.in_strides[0] + s * op.in_strides[1] + h * op.in_strides[2];
      const int64_t out_base = b * op.out_strides[0] + s * op.out_strides[1] + h * op.out_strides[2];
      const int64_t in_d = op.in_strides[3];
      const int64_t out_d = op.out_strides[3];
      if (lane < pair_count) {
        const int64_t ca = args.rotary_offset + (lane / args.block_pairs) * args.block_width +
                           (lane % args.block_pairs) * args.pair_step;
        const int64_t cb = ca + args.partner;
        AngleCell<Value> angle = shared != nullptr ? shared[lane] : pair_angle<Value>(args, pairs, token, lane);
        if (args.xpos_scale_base != 0) angle = xpos_angle(args, pairs, token, lane, op.key, angle);
        const Value x = S::load(op.in, in_base + ca * in_d);
        const Value y = S::load(op.in, in_base + cb * in_d);
        Value x_out;
        Value y_out;
        rotate_pair(x, y, angle.c, angle.s, x_out, y_out);
        S::store(op.out, out_base + ca * out_d, x_out);
        S::store(op.out, out_base + cb * out_d, y_out);
        Probe::stored(static_cast<const typename S::Bits*>(op.out) + out_base + ca * out_d);
        Probe::stored(static_cast<const typename S::Bits*>(op.out) + out_base + cb * out_d);
      } else {
        // Channels outside [rotary_offset, rotary_offset + rotary_dim), bit for bit.
        const int64_t k = lane - pair_count;
        const int64_t channel = k < args.rotary_offset ? k : k + args.rotary_dim;
        using Bits = typename S::Bits;
        Bits* out = static_cast<Bits*>(op.out) + out_base + channel * out_d;
        *out = static_cast<const Bits*>(op.in)[in_base + channel * in_d];
        Probe::stored(out);
      }
    }
    item -= items;  // the next operand's items continue the same stride
  }
}

}  // namespace rotary::detail::cuda
