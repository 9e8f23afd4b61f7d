// rotary — what the user says: the RoPE settings of a model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rotary/positions.hpp"

namespace rotary {

/// How the rotary_dim leading channels of a head form 2-D pairs.
///   interleaved: pair i is (x[2i], x[2i+1])      — RoFormer, Meta LLaMA, Mistral, GPT-J, llama.cpp NORMAL
///                lanes: [a0 b0 a1 b1 a2 b2 ...]
///   half:        pair i is (x[i], x[i + r/2])    — HF rotate_half, GPT-NeoX, llama.cpp NEOX
///                lanes: [a0 a1 a2 ... b0 b1 b2 ...]
enum class Pairing { interleaved, half };

/// How inv_freq and attention_factor are derived (DESIGN.md §2, Hugging Face definitions).
enum class ScheduleType {
  default_, linear, ntk, dynamic, yarn, llama3, longrope, monotone,
  proportional,  ///< Gemma 4 full attention: frequencies over the whole head, a fraction nonzero
  last = proportional
};

/// Which position stream drives each pair (DESIGN.md §5), and for the axial layouts the pair's
/// frequency. P = rotary_dim / 2 pairs; S = sections.size() streams; `sections` holds the model
/// config's numbers (`mrope_section`): pairs per stream, in the order of the positions' streams
/// (transformers' position_ids: [t, h, w] for M-RoPE) except where a layout says otherwise.
/// Every multi-stream layout needs 2 <= S <= max_streams, each section > 0 and their sum == P.
///   single:               one stream (text models); sections empty
///   sections:             contiguous runs: pairs [0, s0) stream 0, [s0, s0+s1) stream 1, ...;
///                         frequencies as usual, base^(-2j/r) with the global j (Qwen2-VL,
///                         Qwen2.5-VL `mrope_section` with half pairing; GLM-4.1V with interleaved
///                         pairing and rotary_dim = head_dim / 2)
///   interleaved_sections: Qwen3-VL `mrope_interleaved`: pair j is stream a = j % S when a >= 1 and
///                         j < S * s_a, else stream 0 (S = 3: transformers' apply_interleaved_mrope);
///                         each stream must get exactly its section's count of pairs
///   alternating_sections: ERNIE-4.5-VL: sections in its config's order [h, w, t] with h == w,
///                         positions [t, h, w]: pair j < h + w reads height (stream 1) when j is
///                         even, width (stream 2) when odd; pairs from h + w on read time (stream 0);
///                         frequencies as usual
///   axial:                vision towers (Qwen ViT, Llama 4 vision, Gemma 4 vision with blocks = 2):
///                         stream a takes sections[a] consecutive pairs, the frequency index
///                         restarting per axis: pair k of axis a turns by base^(-2k / (2 * sections[a]))
///   axial_even_odd:       Pixtral: two equal sections; with f_i = base^(-2i/r) over the whole
///                         slice, pair k < s0 (stream 0, height) takes f_2k, pair s0 + k (stream 1,
///                         width) takes f_(2k+1)
/// The axial layouts take only schedules that scale each frequency on its own
/// (ScheduleInfo::per_frequency in spec_fields.hpp).
enum class StreamLayout { single, sections, interleaved_sections, alternating_sections, axial,
                          axial_even_odd };

/// RoPE settings. Optional fields are unset unless the schedule uses them; setting a field that the
/// chosen schedule does not use is an error (it is almost always a typo or a mismatched config).
/// The fields, the schedules and these rules are one table, spec_fields.hpp (spec_fields(),
/// schedules()): validate(), the CLI options and the Python keywords all read it.
///
/// | schedule     | required                                   | optional                                   |
/// |--------------|--------------------------------------------|--------------------------------------------|
/// | default      |                                            |                                            |
/// | linear       | factor                                     |                                            |
/// | ntk          | factor                                     |                                            |
/// | dynamic      | factor, original_max_position|max_position |                                            |
/// | yarn         | factor, original_max_position|max_position | beta_fast, beta_slow, mscale,              |
/// |              |                                            | mscale_all_dim, truncate                   |
/// | llama3       | factor, low_freq_factor, high_freq_factor,  |                                            |
/// |              | original_max_position|max_position         |                                            |
/// | longrope     | short_factor, long_factor,                 | max_position                               |
/// |              | original_max_position|max_position         |                                            |
/// | monotone     | max_length                                 | monotone_scale                             |
/// | proportional | partial_rotary_factor                      | factor                                     |
/// Every schedule takes attention_factor, rotary_offset, blocks, stream_layout (+ sections) and
/// xpos_scale_base (+ xpos_center).
struct Spec {
  int64_t head_dim = 0;                 ///< width of one head, > 0
  int64_t rotary_dim = 0;               ///< rotated leading channels; 0 means head_dim; even, <= head_dim
  double base = 10000.0;                ///< rope_theta, finite and > 1
  Pairing pairing = Pairing::half;
  ScheduleType schedule = ScheduleType::default_;

  std::optional<double> factor{};                   ///< scaling factor s > 0
  std::optional<int64_t> original_max_position{};   ///< L: original_max_position_embeddings
  std::optional<int64_t> max_position{};            ///< M: max_position_embeddings
  std::optional<double> beta_fast{};                ///< yarn, default 32
  std::optional<double> beta_slow{};                ///< yarn, default 1
  std::optional<double> mscale{};                   ///< yarn
  std::optional<double> mscale_all_dim{};           ///< yarn
  std::optional<bool> truncate{};                   ///< yarn, default true
  std::optional<double> attention_factor{};         ///< explicit factor multiplied into cos and sin,
                                                  ///< in [min_attention_factor, max_attention_factor]
  std::optional<double> low_freq_factor{};          ///< llama3, > 0 and <= high_freq_factor
  std::optional<double> high_freq_factor{};         ///< llama3 (equal factors: two bands, Llama 4)
  std::vector<double> short_factor{};               ///< longrope, rotary_dim/2 values
  std::vector<double> long_factor{};                ///< longrope, rotary_dim/2 values
  std::optional<int64_t> max_length{};              ///< monotone: N, the longest window the model sees
  std::optional<double> monotone_scale{};           ///< monotone: c; default: largest c with a 2^-10 margin
  std::optional<double> partial_rotary_factor{};    ///< proportional: p in (0, 1]; the first
                                                  ///< floor(p * head_dim / 2) pairs turn, the rest
                                                  ///< have inv_freq 0 (rotary_dim must be head_dim)

  // The descriptor's channels and streams (schedule.hpp: Schedule, ChannelLayout).
  int64_t rotary_offset = 0;            ///< first rotated channel, in [0, head_dim - rotary_dim]
                                        ///< (head_dim - rotary_dim: nope-first, DeepSeek-V4)
  int64_t blocks = 1;                   ///< >= 1; > 1: block_half, half pairing inside each block,
                                        ///< rotary_dim divisible by 2 * blocks
  StreamLayout stream_layout = StreamLayout::single;
  std::vector<int64_t> sections{};      ///< pairs per stream (StreamLayout), empty for single

  // xPos (Sun et al. 2022): a query's pair j at position p scales by ζ_j^((p - c)/γ), a key's by
  // ζ_j^(-(p - c)/γ), ζ_j = (2j + 0.4 r)/(1.4 r), so q_m·k_n decays as ζ^((m - n)/γ) (schedule.hpp).
  std::optional<double> xpos_scale_base{};  ///< γ, finite and > 0 (torchscale's scale_base, 512);
                                            ///< unset: no xPos
  std::optional<double> xpos_center{};      ///< c, finite (default 0); only with xpos_scale_base

  /// rotary_dim with 0 resolved to head_dim.
  int64_t resolved_rotary_dim() const { return rotary_dim == 0 ? head_dim : rotary_dim; }
  /// L: original_max_position if set, else max_position (unset: 0).
  int64_t original_length() const;
  bool operator==(const Spec&) const = default;
};

/// attention_factor range, explicit or computed: cos and sin times the factor are stored as float32,
/// so the factor must round to a normal float32 — to at least FLT_MIN = 2^-126 (smaller ones round
/// to a subnormal or to 0) and at most FLT_MAX = (2 - 2^-23) 2^127 (larger ones round to infinity).
/// The bounds are the extreme doubles that round (to nearest even) to FLT_MIN and FLT_MAX. Within
/// them, |cos * factor| and |sin * factor| never leave float range.
inline constexpr double min_attention_factor = 0x1.fffffep-127;      // 2^-126 - 2^-150: ties to FLT_MIN
inline constexpr double max_attention_factor = 0x1.fffffefffffffp+127;  // below the tie to infinity

/// Throws rotary::Error naming the first broken rule, in this order: the fields every Spec has
/// (head_dim, rotary_dim, base, pairing, schedule, attention_factor, rotary_offset, blocks,
/// stream_layout), then "X is set but schedule Y does not use it" (or "... stream_layout single
/// ..."), the set fields' own ranges, "schedule Y needs X", the schedule's rules across fields, and
/// the stream layout's rules on sections. Driven by spec_fields() and schedules(). Called by
/// make_schedule.
void validate(const Spec& spec);

std::string_view to_string(Pairing pairing);
std::string_view to_string(ScheduleType schedule);
std::string_view to_string(StreamLayout layout);
/// Parse "interleaved"/"half"; throws rotary::Error naming `what` and the text.
Pairing parse_pairing(std::string_view text, std::string_view what = "pairing");
/// Parse "default", "linear", ... (the names of schedules()); throws rotary::Error naming `what`
/// and the text.
ScheduleType parse_schedule(std::string_view text, std::string_view what = "schedule");
/// Parse "single", "sections", ...; throws rotary::Error naming `what` and the text.
StreamLayout parse_stream_layout(std::string_view text, std::string_view what = "stream_layout");

}  // namespace rotary
