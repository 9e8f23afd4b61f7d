// rotary — the frequencies a Spec stands for.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "rotary/spec.hpp"

namespace rotary {

/// How the channels of the rotated slice form pairs (DESIGN.md §5), derived from Schedule.
///   interleaved: pair j is (off + 2j, off + 2j + 1)
///   half:        pair j is (off + j, off + j + r/2)
///   block_half:  the slice is `blocks` blocks of width w = r/blocks, half-paired inside each:
///                pair j = k*(w/2) + i (block k, i < w/2) is (off + k*w + i, off + k*w + i + w/2)
///                (Gemma 4's vision tower: 2 blocks, one per image axis)
enum class ChannelLayout { half, interleaved, block_half };
std::string_view to_string(ChannelLayout layout);
/// The old name of ChannelLayout, kept for one release.
using Layout [[deprecated("renamed ChannelLayout")]] = ChannelLayout;

/// The descriptor: everything a kernel needs to know about one head, pair by pair. Schedules and
/// configs produce it; kernels never learn which schedule or model did.
///
/// Pair j (j < pairs() = rotary_dim / 2) rotates channels channels(j) of each head by the angle
/// p * inv_freq[j], p being the token's position in stream stream_of(j), times attention_factor.
/// Channels outside [rotary_offset, rotary_offset + rotary_dim) pass through.
struct Schedule {
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;          ///< width of the rotated slice, even
  Pairing pairing = Pairing::half;
  ScheduleType type = ScheduleType::default_;
  std::vector<double> inv_freq;    ///< rotary_dim/2 angular frequencies, radians per position,
                                   ///< finite, >= 0; 0 leaves the pair unturned (scaled by
                                   ///< attention_factor, as transformers' cos(0) * scaling)
  std::vector<float> inv_freq_hf32;  ///< transformers' own float32 inv_freq, the frequencies of
                                     ///< AngleMode::hf_float32 (make_schedule fills it: see there);
                                     ///< empty (then the float32 nearest inv_freq is used) or
                                     ///< rotary_dim/2 values, which hf_float32 angles need finite,
                                     ///< >= 0 and <= max_inv_freq (transformers' float32 arithmetic
                                     ///< can give NaN where the double schedule is fine: llama3
                                     ///< with equal factors, a float32 wavelength on the edge).
                                     ///< Whoever edits inv_freq by hand should clear it.
  double attention_factor = 1.0;   ///< multiplied into cos and sin, a normal float32 (spec.hpp)
  int64_t rotary_offset = 0;       ///< first rotated channel: 0, or head_dim - rotary_dim when the
                                   ///< rotated slice comes last (nope-first, DeepSeek-V4); any
                                   ///< offset with rotary_offset + rotary_dim <= head_dim
  int64_t blocks = 1;              ///< > 1: block_half layout (pairing half, rotary_dim divisible
                                   ///< by 2 * blocks)
  int streams = 1;                 ///< position streams the pairs read, in [1, max_streams]
  std::vector<int> pair_stream;    ///< empty (every pair reads stream 0) or pairs() entries, each
                                   ///< in [0, streams)
  /// xPos (Sun et al. 2022): pair j of a token at position p (its stream's) scales by
  /// σ = ζ_j^((p - c)/γ) in a query and ζ_j^(-(p - c)/γ) in a key, on top of the rotation and the
  /// attention factor, so q_m·k_n decays as ζ_j^((m - n)/γ) whatever the centre c. 0: no xPos.
  double xpos_scale_base = 0;        ///< γ: 0, or finite and > 0
  double xpos_center = 0;            ///< c, finite
  std::vector<double> xpos_log_zeta;  ///< ln ζ_j, ζ_j = (2j + 0.4 r) / (1.4 r): pairs() values,
                                      ///< finite and < 0, when xpos_scale_base > 0 (make_schedule
                                      ///< fills them; xpos_log_zeta(rotary_dim) computes them)

  int64_t pairs() const { return rotary_dim / 2; }
  bool xpos() const { return xpos_scale_base != 0; }
  ChannelLayout channel_layout() const {
    return blocks > 1 ? ChannelLayout::block_half
                      : pairing == Pairing::interleaved ? ChannelLayout::interleaved : ChannelLayout::half;
  }
  [[deprecated("renamed channel_layout()")]] ChannelLayout layout() const { return channel_layout(); }
  /// The stream driving pair j (j < pairs()).
  int stream_of(int64_t j) const { return pair_stream.empty() ? 0 : pair_stream[static_cast<size_t>(j)]; }
  /// The two channels of pair j within a head (see ChannelLayout), rotary_offset included.
  std::pair<int64_t, int64_t> channels(int64_t j) const {
    if (blocks > 1) {
      const int64_t half_width = rotary_dim / blocks / 2;
      const int64_t start = rotary_offset + (j / half_width) * 2 * half_width + j % half_width;
      return {start, start + half_width};
    }
    if (pairing == Pairing::interleaved) return {rotary_offset + 2 * j, rotary_offset + 2 * j + 1};
    return {rotary_offset + j, rotary_offset + j + rotary_dim / 2};
  }
  bool operator==(const Schedule&) const = default;
};

/// Largest inv_freq accepted (radians per position). Beyond it angles at large positions exceed what
/// an exact reduction in double-double handles, and a pair would turn more than 2^20 rad per token.
inline constexpr double max_inv_freq = 1048576.0;

/// The unscaled frequencies base^(-2i/r), i in [0, r/2), in double.
std::vector<double> default_inv_freq(double base, int64_t rotary_dim);

/// xPos's ln ζ_j = ln((2j + 0.4 r) / (1.4 r)), j in [0, r/2), in double.
std::vector<double> xpos_log_zeta(int64_t rotary_dim);

/// The largest |t| = |ln ζ_j (p - c)/γ| an xPos call may reach: σ = e^±t then stays within
/// [e^-80, e^80] = [2^-115.4, 2^115.4], so σ times a cos or sin times an attention factor in
/// [xpos_min_attention_factor, xpos_max_attention_factor] is a normal float32.
inline constexpr double xpos_max_log = 80.0;
inline constexpr double xpos_min_attention_factor = 0x1p-10;
inline constexpr double xpos_max_attention_factor = 0x1p12;

/// `schedule` with xPos: xpos_scale_base = scale_base (> 0; 0 turns xPos off, and then center must
/// be 0: a centre without a scale base is refused, as in a Spec), xpos_center = center (finite),
/// xpos_log_zeta computed; validated (throws rotary::Error naming the value). The same as setting
/// Spec::xpos_scale_base and xpos_center, for a schedule from a config or preset.
Schedule with_xpos(Schedule schedule, double scale_base, double center = 0);

/// xPos's reach: the largest |p - c| a position may have, xpos_max_log * γ / max_j |ln ζ_j|
/// (pair 0's ζ = 2/7 is the smallest). apply refuses positions further from the centre. 0 when the
/// schedule has no xPos.
double xpos_reach(const Schedule& schedule);

/// The descriptor of a Spec: inv_freq and attention_factor computed in double exactly as DESIGN.md
/// §2 writes them; rotary_offset and blocks copied; streams and pair_stream from stream_layout and
/// sections (spec.hpp's StreamLayout: streams = sections.size(), pair_stream empty for single).
/// The unscaled frequencies are base^(-2j/r) except for the axial layouts (per axis, restarting)
/// and proportional (base^(-2j/head_dim) for j < floor(p * head_dim / 2), 0 after, then divided by
/// factor if given: transformers' _compute_proportional_rope_parameters); the schedule scales them.
/// `seq_len` is n for the schedules that depend on the current sequence length (dynamic: NTK base
/// grows when n > L; longrope: long factors when n > L); unset means n <= L. Other schedules ignore it.
/// llama3 follows transformers' comparisons, with λ_i = 2π/default_i: λ_i < L/hf kept, λ_i > L/lf
/// divided by s, L/hf <= λ_i <= L/lf smoothed — so λ_i == L/lf gets t = 0 (divided by s, as the band
/// above) and λ_i == L/hf gets t = 1 (kept). lf == hf (Llama 4 Scout) leaves two bands; a wavelength
/// then exactly equal to L/lf is an error (transformers computes 0/0 = NaN there).
///
/// inv_freq_hf32 is transformers 5.23's float32 inv_freq for the same settings: its
/// _compute_*_parameters (and the models' compute_default_rope_parameters) replayed one torch
/// float32 operation at a time, each rounded as torch rounds it — Python numbers rounded to
/// float32 where they meet a tensor (comparisons included), `x / tensor` as tensor.reciprocal() *
/// x — and what transformers computes in Python (YaRN's correction range, llama3's band edges, the
/// dynamic base at init) in double. pow is the correctly rounded float32 power: torch's own CPU pow
/// is not correctly rounded on about 1.6% of these inputs (a vectorised 1-ulp pow over whole
/// vector blocks, the C library's powf over the rest, so it depends on the machine and on the
/// tensor's length); there inv_freq_hf32 is one ulp (before the reciprocal) from transformers'.
/// dynamic past L and longrope with the long factors are the values after transformers' own update
/// at that sequence length. ntk and monotone, which transformers lacks, get the float32 nearest
/// inv_freq.
///
/// Throws rotary::Error (validate(spec), seq_len < 0, a non-finite or out-of-range result, a computed
/// attention_factor outside [min_attention_factor, max_attention_factor]). Allocates; thread-safe.
Schedule make_schedule(const Spec& spec, std::optional<int64_t> seq_len = std::nullopt);

/// Checks a Schedule built by hand (or received from elsewhere): head_dim > 0, rotary_dim even,
/// > 0 and <= head_dim, rotary_offset >= 0 and rotary_offset + rotary_dim <= head_dim, pairing a
/// named Pairing, blocks >= 1 (> 1 only with half pairing and rotary_dim divisible by 2 * blocks),
/// streams in [1, max_streams], pair_stream empty or pairs() entries in [0, streams), rotary_dim/2
/// inv_freq values each finite, >= 0 and <= max_inv_freq, attention_factor in
/// [min_attention_factor, max_attention_factor] (a normal float32); with xPos (xpos_scale_base != 0):
/// xpos_scale_base finite and > 0, xpos_center finite, pairs() xpos_log_zeta values each finite
/// and < 0, attention_factor in [xpos_min_attention_factor, xpos_max_attention_factor]. Throws rotary::Error naming the
/// first broken rule, e.g. "pair_stream[5]=3 must be in [0, streams=3)".
void validate(const Schedule& schedule);

/// The monotone schedule's default constant c for window N and first default frequency f0:
/// the largest c with (N-1) * c * f0 <= 2π (1 - 2^-10).
double monotone_default_scale(int64_t max_length, double first_inv_freq);

}  // namespace rotary
