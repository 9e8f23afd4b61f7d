// rotary — move cached keys: to other positions (rerotate), or to another schedule (switch_schedule).
#pragma once

#include <cstdint>
#include <span>

#include "rotary/apply.hpp"
#include "rotary/schedule.hpp"
#include "rotary/tensor.hpp"

namespace rotary {

/// Keys already rotated (by apply) at `positions`, as a KV cache holds them.
struct RotatedKeys {
  TensorView k{};        ///< keys [batch, seq, heads, head_dim]; also the output when k_out unset
  TensorView k_out{};    ///< optional output, same shape and dtype as k; unset = in place
  Positions positions{};  ///< the positions k was rotated at (apply's rules: streams, count, range)
  Direction rotated = Direction::forward;  ///< how k was rotated: forward (apply's default), or
                                           ///< inverse for models that turn pairs by -angle
  bool copy_tail = true;  ///< out of place: copy the channels outside the rotated slice
  int threads = 0;        ///< as ApplyArgs::threads; results are bit-identical for any value
  Backend backend = Backend::automatic;
};

/// Moves keys rotated at positions p to positions p + Δ (a StreamingLLM eviction, a context shift):
/// each pair j turns by the exact angle Δ_s * inv_freq[j], s = stream_of(j), with factor 1 — the
/// attention factor the keys already carry is not applied again (llama.cpp's K-shift multiplies
/// YaRN keys by it on every shift).
///
/// delta: one value for every stream, or one per stream of the schedule (M-RoPE: t, h, w), any
/// signs; each in (-2^31, 2^31).
///
/// xPos (schedule.xpos()): the keys' scale moves with them, pair j times ζ_j^(-Δ_s/γ) folded into
/// the cos and sin (rounded once with them); a jump whose factor would leave float range (beyond
/// about xpos_reach) is split over passes of at most e^xpos_max_log each, the first turning. Every
/// p + Δ must lie within xpos_reach of xpos_center (a context shift that brings keys back towards
/// the centre is how a long stream stays in xPos's range).
///
/// One apply call with the caller's angles (CallerAngles per_token, one row broadcast over the
/// tokens): cos and sin of |Δ_s| * inv_freq[j] from exact_cos_sin, rounded once to float32, sin
/// negated for Δ_s < 0 (or for keys rotated inverse), so each pair is rounded once whatever the
/// signs. Accuracy: apply's, for the stored keys (a, b): |result - exact| <= 2^-23 (|a| + |b|) per
/// pair (f32 arithmetic; f16/bf16 then round once at the store; f64 in double), exact meaning the
/// real rotation of the stored values by the exact angle. n successive shifts add two kinds of
/// error: the products' roundings, data-dependent, walk like sqrt(n) times one; the float32 cos/sin
/// of a repeated step (c, s) are the same every time, so their error ε_j = |(c, s) - (cos, sin)|
/// <= 2^-24 √2 adds up linearly, n ε_j of the pair's norm (its norm drifts by n |hypot(c, s) - 1|).
/// Measured for 1000 shifts by +1: 1.9 times the random-walk term alone, 0.65 of the sum.
///
/// Throws rotary::Error before any write: everything apply validates (messages name k and k_out),
/// k unset, delta's count not 1 nor the schedule's streams, a delta outside (-2^31, 2^31), a key's
/// position p with p + Δ outside [0, 2^31), e.g. "positions[3]=5 + delta=-9 leaves [0, 2^31)".
/// Allocates rotary_dim floats (a cos and a sin per pair); thread-safe for calls on disjoint outputs.
void rerotate(const Schedule& schedule, const RotatedKeys& keys, std::span<const int64_t> delta);

/// Moves keys rotated under schedule `from` at positions p to what schedule `to` gives at the same
/// positions (LongRoPE's short -> long factors once the context passes the original length, a
/// dynamic-NTK base change): pair j turns by p * (θB_j - θA_j) and scales by gB / gA (θ: inv_freq,
/// g: attention_factor; the schedules' xPos settings must be equal, and the keys keep their xPos
/// scale), in at most two apply calls on disjoint sets of turning pairs:
///   pass 1: inv_freq max(θB_j - θA_j, 0), attention_factor gB / gA, forward;
///   pass 2 (only when some θB_j < θA_j): inv_freq max(θA_j - θB_j, 0), factor 1, inverse
///   (directions swapped for keys rotated inverse). Pass 1 is skipped when gB == gA and no
///   θB_j > θA_j.
/// A pair with inv_freq 0 and factor 1 in a pass comes back with its value (cos 0 = 1, sin 0 = 0:
/// a' = a - b*0, b' = b + a*0), except that a negative zero may come back positive and a pair
/// holding an infinity or NaN becomes NaN.
/// Accuracy: when gB == gA (LongRoPE short -> long, dynamic NTK) each pair is rounded once: apply's
/// bound for the stored keys, as rerotate. Otherwise the pairs of pass 2 (θB_j < θA_j) are rounded
/// twice (scaled, then turned): up to twice the bound. The frequency difference θB_j - θA_j is
/// formed in double (exact when the two are within a factor 2, Sterbenz), so the angle is off by
/// at most p * |θB_j - θA_j| * 2^-53 rad (2^-22 rad at p = 2^31 for a difference of 1).
///
/// Throws rotary::Error before any write: validate(from) and validate(to) (messages prefixed
/// "from schedule: " / "to schedule: "), schedules that differ in head_dim, rotary_dim, pairing,
/// blocks, rotary_offset, streams or pair_stream (naming the field and both values), gB / gA not a
/// normal float32, and everything apply validates. Allocates two rotary_dim/2 vectors; thread-safe
/// for calls on disjoint outputs. (Named switch_schedule: `switch` is a C++ keyword.)
void switch_schedule(const Schedule& from, const Schedule& to, const RotatedKeys& keys);

}  // namespace rotary
