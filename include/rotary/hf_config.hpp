// rotary — RoPE settings from a Hugging Face config.json, resolved the way transformers does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rotary/spec.hpp"

namespace rotary {

/// What a model's config says about RoPE, plus the attention shape needed to use it.
struct ModelRope {
  std::string model_type;            ///< config "model_type", may be empty
  Spec spec;                          ///< the RoPE settings, ready for make_schedule
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;    ///< defaults to num_attention_heads (no GQA)
  int64_t max_position_embeddings = 0;  ///< 0 when the config has none
  std::vector<std::string> notes;     ///< non-fatal findings (e.g. an explicit factor overriding the
                                      ///< ratio of the context lengths), one sentence each
};

/// Resolves RoPE settings from config.json text, following transformers 4.4x–5.x:
///  - `rope_parameters` (v5) or `rope_scaling` (v4); `rope_type` wins over `type`; `rope_theta` at the
///    top level or inside; default base 10000 (GPT-NeoX: `rotary_emb_base`).
///  - head_dim: `head_dim` if present and not null, else hidden_size / num_attention_heads;
///    DeepSeek V2/V3: `qk_rope_head_dim`. rotary_dim = int(head_dim * partial_rotary_factor);
///    GPT-NeoX `rotary_pct` (default 0.25), Phi default 0.5, GPT-J `rotary_dim`.
///  - pairing: half (rotate_half) except GPT-J and DeepSeek V3 with rope_interleave (interleaved).
///  - Phi-3: `su` and `yarn` mean longrope; LongRoPE reads original_max_position_embeddings from the
///    top level; YaRN from inside rope_scaling; YaRN factor explicit, else max/original.
/// Unknown keys are ignored; wrong types and invalid values throw rotary::Error naming the key, e.g.
/// "rope_scaling.factor='x' must be a number". Pure; thread-safe.
ModelRope read_hf_config(std::string_view json_text);
/// The same from a file; errors name the path.
ModelRope read_hf_config_file(const std::string& path);

/// Built-in presets: real models' RoPE fields (presets/*.json, sources cited in each file).
std::vector<std::string> preset_names();
/// The preset's config resolved by read_hf_config. Throws rotary::Error for an unknown name,
/// listing the known ones.
ModelRope load_preset(std::string_view name);
/// The preset file's text (JSON with "name", "source", "config").
std::string preset_text(std::string_view name);

}  // namespace rotary
