// rotary — what the user says: the RoPE settings of a model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rotary {

/// How the rotary_dim leading channels of a head form 2-D pairs.
///   interleaved: pair i is (x[2i], x[2i+1])      — RoFormer, Meta LLaMA, Mistral, GPT-J, llama.cpp NORMAL
///                lanes: [a0 b0 a1 b1 a2 b2 ...]
///   half:        pair i is (x[i], x[i + r/2])    — HF rotate_half, GPT-NeoX, llama.cpp NEOX
///                lanes: [a0 a1 a2 ... b0 b1 b2 ...]
enum class Pairing { interleaved, half };

/// How inv_freq and attention_factor are derived (DESIGN.md §2, Hugging Face definitions).
enum class ScheduleType { default_, linear, ntk, dynamic, yarn, llama3, longrope, monotone };

/// RoPE settings. Optional fields are unset unless the schedule uses them; setting a field that the
/// chosen schedule does not use is an error (it is almost always a typo or a mismatched config).
///
/// | schedule  | required                                   | optional                                   |
/// |-----------|--------------------------------------------|--------------------------------------------|
/// | default   |                                            | attention_factor                           |
/// | linear    | factor                                     | attention_factor                           |
/// | ntk       | factor                                     | attention_factor                           |
/// | dynamic   | factor, original_max_position|max_position | attention_factor                           |
/// | yarn      | factor, original_max_position|max_position | beta_fast, beta_slow, mscale,              |
/// |           |                                            | mscale_all_dim, truncate, attention_factor |
/// | llama3    | factor, low_freq_factor, high_freq_factor,  | attention_factor                           |
/// |           | original_max_position|max_position         |                                            |
/// | longrope  | short_factor, long_factor,                 | max_position, attention_factor             |
/// |           | original_max_position|max_position         |                                            |
/// | monotone  | max_length                                 | monotone_scale, attention_factor           |
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

  /// rotary_dim with 0 resolved to head_dim.
  int64_t resolved_rotary_dim() const { return rotary_dim == 0 ? head_dim : rotary_dim; }
  /// L: original_max_position if set, else max_position (unset: 0).
  int64_t original_length() const;
};

/// Positions are int32-sized: 0 <= position < max_position_limit.
inline constexpr int64_t max_position_limit = int64_t{1} << 31;

/// attention_factor range, explicit or computed: cos and sin times the factor are stored as float32,
/// so the factor must round to a normal float32 — to at least FLT_MIN = 2^-126 (smaller ones round
/// to a subnormal or to 0) and at most FLT_MAX = (2 - 2^-23) 2^127 (larger ones round to infinity).
/// The bounds are the extreme doubles that round (to nearest even) to FLT_MIN and FLT_MAX. Within
/// them, |cos * factor| and |sin * factor| never leave float range.
inline constexpr double min_attention_factor = 0x1.fffffep-127;      // 2^-126 - 2^-150: ties to FLT_MIN
inline constexpr double max_attention_factor = 0x1.fffffefffffffp+127;  // below the tie to infinity

/// Throws rotary::Error naming the first broken rule. Called by make_schedule.
void validate(const Spec& spec);

std::string_view to_string(Pairing pairing);
std::string_view to_string(ScheduleType schedule);
/// Parse "interleaved"/"half"; throws rotary::Error naming `what` and the text.
Pairing parse_pairing(std::string_view text, std::string_view what = "pairing");
/// Parse "default", "linear", ...; throws rotary::Error naming `what` and the text.
ScheduleType parse_schedule(std::string_view text, std::string_view what = "schedule");

}  // namespace rotary
