// Internal: how each transformers `model_type` pairs its rotated channels. config.json never says
// so; the pairing lives in each model's modeling code, which every entry cites.
#pragma once

#include <span>
#include <string_view>

#include "rotary/spec.hpp"

namespace rotary::detail {

/// The formula a modeling file writes the rotation with (tests/test_model_types.cpp writes each
/// out and holds every entry against rotary::apply). r is the rotated width, angle_i = p * inv_freq[i].
enum class RopeFormula {
  /// Llama: cos/sin = cat(freqs, freqs); x * cos + rotate_half(x) * sin, rotate_half = cat(-x2, x1).
  /// Pairs (x[i], x[i + r/2]).
  rotate_half,
  /// NanoChat: as rotate_half but rotate_half = cat(x2, -x1): pairs (x[i], x[i + r/2]) turned by -angle.
  rotate_half_negated,
  /// GPT-OSS: x1, x2 = chunk(x, 2); cat(x1 cos - x2 sin, x2 cos + x1 sin), cos/sin of r/2 angles.
  /// Pairs (x[i], x[i + r/2]).
  half_chunks,
  /// GPT-J: sin/cos repeat_interleave(2); x * cos + rotate_every_two(x) * sin with rotate_every_two =
  /// stack(-x[1::2], x[::2]).flatten(). Pairs (x[2i], x[2i+1]).
  rotate_every_two,
  /// Cohere: freqs.repeat_interleave(2) before cos/sin; rotate_half = stack(-x[1::2], x[::2]).flatten().
  /// Pairs (x[2i], x[2i+1]).
  cohere,
  /// GLM: cos/sin = cat(freqs, freqs), then cos[..., :r/2].repeat_interleave(2); rotate_half on the
  /// even/odd channels as cohere. Pairs (x[2i], x[2i+1]).
  glm,
  /// Meta LLaMA: view_as_complex over (x[2i], x[2i+1]) times polar(1, angle). Pairs (x[2i], x[2i+1]).
  complex,
  /// x1, x2 = x[::2], x[1::2]; stack(x1 cos - x2 sin, x2 cos + x1 sin).flatten(). Pairs (x[2i], x[2i+1]).
  even_odd_chunks,
  /// Perception Encoder: (x[2i], x[2i+1]) times [[cos, -sin], [sin, cos]]. Pairs (x[2i], x[2i+1]).
  pair_matrix,
  /// DeepSeek-V3 `rope_interleave`: reads the pair (x[2i], x[2i+1]) and writes it de-interleaved to
  /// (y[i], y[i + r/2]). q and k move alike, so every q·k equals that of the interleaved rotation;
  /// rotary's interleaved output is the same numbers in the reading order.
  interleave_to_half,
};

/// The pairing a formula rotates: which two channels turn together.
constexpr Pairing pairing_of(RopeFormula formula) {
  switch (formula) {
    case RopeFormula::rotate_half:
    case RopeFormula::rotate_half_negated:
    case RopeFormula::half_chunks: return Pairing::half;
    default: return Pairing::interleaved;
  }
}

/// True when the formula turns pairs by -angle: rotary matches it with Direction::inverse.
constexpr bool rotates_backward(RopeFormula formula) { return formula == RopeFormula::rotate_half_negated; }

/// True when the formula writes pair i to channels (i, i + r/2) although it reads (2i, 2i+1).
constexpr bool deinterleaves_output(RopeFormula formula) { return formula == RopeFormula::interleave_to_half; }

/// One model type's rotation as its modeling code does it. Fields past `multimodal_positions`
/// default to the common case (Llama's rotate_half over the whole width, RoPE always on).
struct ModelTypeRope {
  std::string_view model_type;  ///< config.json "model_type"
  Pairing pairing;              ///< the pairing its attention applies (with pairing_flag at its default)
  /// Modeling file and what in it decides the pairing: "models/<dir>/modeling_<dir>.py: ..." for
  /// transformers (5.x), "github.com/<owner>/<repo> <path>/modeling_<name>.py: ..." for remote code.
  std::string_view source;
  /// A config.json boolean that chooses the pairing (true: interleaved with `formula`, false: half
  /// with RopeFormula::rotate_half), e.g. DeepSeek-V3's "rope_interleave"; empty when the modeling
  /// code has no such switch.
  std::string_view pairing_flag = {};
  bool pairing_flag_default = false;  ///< the flag's value when config.json leaves it out
  /// The text decoder takes several position streams per token (M-RoPE: mrope_section, ...): a
  /// config of this type must say how many pairs each stream drives (read_hf_config).
  bool multimodal_positions = false;
  /// With multimodal_positions: how the code maps the streams to pairs — `sections` (contiguous,
  /// transformers' apply_multimodal_rotary_pos_emb; a config's mrope_interleaved may switch it to
  /// interleaved_sections), `interleaved_sections` (the code always interleaves, whatever the config
  /// says: Qwen3-VL's apply_interleaved_mrope) or `alternating_sections` (ERNIE-4.5-VL).
  StreamLayout stream_layout = StreamLayout::sections;
  RopeFormula formula = RopeFormula::rotate_half;  ///< how the code writes the rotation; pairing_of(formula) == pairing
  /// The code rotates only the leading rotary_dim < head_dim channels when the config asks
  /// (partial_rotary_factor, rotary_pct, rotary_dim) and passes the rest through unchanged. False:
  /// it always rotates the whole head (a factor < 1 in such a config does not match the code).
  bool partial_rotary = false;
  /// The rotated channels are the LAST rotary_dim of the head ([nope | rope], DeepSeek-V4), not the
  /// first: rotate that trailing slice as a head of its own.
  bool trailing_rotary = false;
  /// config.json key holding the rotated width when it is not head_dim * partial_rotary_factor:
  /// "qk_rope_head_dim" (multi-head latent attention rotates a slice of its own), "rotary_dim"
  /// (GPT-J, CodeGen). Empty: head_dim * partial_rotary_factor.
  std::string_view rotary_dim_key = {};
  /// RoPE is on only when config.json's `rope_switch_key` holds `rope_switch_value` (JSON text,
  /// e.g. falcon: "alibi" must be `false`; otherwise the model uses ALiBi and no rotation at all);
  /// `rope_switch_default` is the key's value when config.json leaves it out. Empty key: always on.
  std::string_view rope_switch_key = {};
  std::string_view rope_switch_value = {};
  std::string_view rope_switch_default = {};
};

/// Every known model type, sorted by model_type (byte order), each listed once. Model types whose
/// attention has no RoPE (ALiBi: bloom, mpt; learned or relative positions) are absent.
std::span<const ModelTypeRope> model_type_table();

/// The entry for `model_type`, or null when it is unknown.
const ModelTypeRope* find_model_type(std::string_view model_type);

}  // namespace rotary::detail
