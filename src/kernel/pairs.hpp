// Internal: one head's pairs and pass-through channels at any strides, written once as ROTARY_HD
// code over KernelArgs: the reference's loop, the CPU's path for views whose head_dim stride is not
// 1 (and f64 data), and the CUDA general kernel's items (one pair or one channel per thread).
// Arithmetic is detail::rotate_pair (math/rotate.hpp): float32 for f32/f16/bf16 with one rounding
// to 16 bits at the store, double for f64.
#pragma once

#include <cstdint>

#include "../math/hd.hpp"
#include "../math/rotate.hpp"
#include "angles.hpp"
#include "args.hpp"
#include "storage.hpp"

namespace rotary::detail {

/// The two channels pair j rotates (KernelArgs' formula: Schedule::channels as numbers).
struct PairChannels {
  int64_t a;
  int64_t b;
};
ROTARY_HD inline PairChannels pair_channels(const KernelArgs& args, int64_t j) {
  const int64_t a = args.rotary_offset + (j / args.block_pairs) * args.block_width + (j % args.block_pairs) * args.pair_step;
  return {a, a + args.partner};
}

/// The k-th channel outside the rotated slice [rotary_offset, rotary_offset + rotary_dim), k <
/// head_dim - rotary_dim.
ROTARY_HD inline int64_t passthrough_channel(const KernelArgs& args, int64_t k) {
  return k < args.rotary_offset ? k : k + args.rotary_dim;
}

/// Whether an operand's pass-through channels are copied: out of place, unless copy_tail is off.
ROTARY_HD inline bool copies_tail(const KernelArgs& args, const KernelOperand& op) {
  return args.copy_tail && !op.in_place;
}

/// Element offsets of head h of token (b, s) in an operand's input and output.
struct HeadOffsets {
  int64_t in;
  int64_t out;
};
ROTARY_HD inline HeadOffsets head_offsets(const KernelOperand& op, int64_t b, int64_t s, int64_t h) {
  return {b * op.in_strides[0] + s * op.in_strides[1] + h * op.in_strides[2],
          b * op.out_strides[0] + s * op.out_strides[1] + h * op.out_strides[2]};
}

/// Observes every element store (the CUDA emulation counts them; elsewhere nothing).
struct NoProbe {
  ROTARY_HD static void stored(const void*) {}
  ROTARY_HD static void vector(const void*) {}
};

/// Rotates pair j of the head at `at` by `angle`: both elements loaded before either is stored, so
/// in place is safe.
template <class T, class Probe = NoProbe, class Value = typename Storage<T>::Value>
ROTARY_HD inline void rotate_pair_at(const KernelArgs& args, const KernelOperand& op, HeadOffsets at, int64_t j,
                                     AngleCell<Value> angle) {
  using S = Storage<T>;
  const PairChannels ch = pair_channels(args, j);
  const int64_t in_d = op.in_strides[3];
  const int64_t out_d = op.out_strides[3];
  const Value x = S::load(op.in, at.in + ch.a * in_d);
  const Value y = S::load(op.in, at.in + ch.b * in_d);
  Value x_out;
  Value y_out;
  rotate_pair(x, y, angle.c, angle.s, x_out, y_out);
  S::store(op.out, at.out + ch.a * out_d, x_out);
  S::store(op.out, at.out + ch.b * out_d, y_out);
  Probe::stored(static_cast<const typename S::Bits*>(op.out) + at.out + ch.a * out_d);
  Probe::stored(static_cast<const typename S::Bits*>(op.out) + at.out + ch.b * out_d);
}

/// Copies the k-th pass-through channel of the head at `at`, bit for bit (NaN payloads kept).
template <class T, class Probe = NoProbe>
ROTARY_HD inline void copy_channel_at(const KernelArgs& args, const KernelOperand& op, HeadOffsets at, int64_t k) {
  using Bits = typename Storage<T>::Bits;
  const int64_t channel = passthrough_channel(args, k);
  Bits* out = static_cast<Bits*>(op.out) + at.out + channel * op.out_strides[3];
  *out = static_cast<const Bits*>(op.in)[at.in + channel * op.in_strides[3]];
  Probe::stored(out);
}

/// One head: every pair j rotated by angle(j) (an AngleCell<Value>), then the pass-through channels
/// copied when copies_tail.
template <class T, class AngleOf, class Probe = NoProbe>
ROTARY_HD inline void rotate_head(const KernelArgs& args, const KernelOperand& op, HeadOffsets at, AngleOf angle) {
  const int64_t pairs = args.rotary_dim / 2;
  for (int64_t j = 0; j < pairs; ++j) rotate_pair_at<T, Probe>(args, op, at, j, angle(j));
  if (!copies_tail(args, op)) return;
  const int64_t passthrough = args.head_dim - args.rotary_dim;
  for (int64_t k = 0; k < passthrough; ++k) copy_channel_at<T, Probe>(args, op, at, k);
}

}  // namespace rotary::detail
