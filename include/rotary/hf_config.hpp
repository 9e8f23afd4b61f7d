// rotary — RoPE settings from a Hugging Face config.json, resolved the way transformers does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rotary/spec.hpp"

namespace rotary {

/// What a model's config says about RoPE, plus the attention shape needed to use it.
struct ModelRope {
  std::string model_type;            ///< config "model_type" (text_config's, else the file's), may be empty
  Spec spec;                          ///< the RoPE settings, ready for make_schedule
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;    ///< defaults to num_attention_heads (no GQA)
  int64_t max_position_embeddings = 0;  ///< 0 when the config has none
  /// Per decoder layer (index < num_hidden_layers): true where the layer rotates q and k with
  /// `spec`, false where it does not — a layer without RoPE (Llama 4's and SmolLM3's NoPE layers,
  /// `no_rope_layers`) or a layer of another type whose RoPE settings differ (Gemma 3's
  /// sliding_attention layers; `notes` says what they use). Empty when every layer applies `spec`.
  std::vector<bool> rope_layers;
  /// The model turns each pair by -angle (NanoChat: rotate_half = cat(x2, -x1)): apply with
  /// Direction::inverse to match it. A note says so as well.
  bool rotates_backward = false;
  std::vector<std::string> notes;     ///< non-fatal findings (e.g. an explicit factor overriding the
                                      ///< ratio of the context lengths, an assumed pairing, a query
                                      ///< scale outside RoPE), one sentence each
};

/// Largest config.json read_hf_config_file reads: 16 MiB (real configs are a few KiB; the largest,
/// LongRoPE factor lists, stay under 100 KiB).
inline constexpr std::size_t max_config_bytes = std::size_t{16} << 20;

/// Resolves RoPE settings from config.json text, following transformers 4.4x–5.x:
///  - The text is parsed with arrays/objects nested at most 64 levels (real configs nest 4).
///    Multimodal wrappers: `text_config` holds the language model when the top level has no
///    `hidden_size`.
///  - `rope_parameters` (v5) or `rope_scaling` (v4); `rope_type` wins over `type`; `rope_theta` at the
///    top level or inside; default base 10000 (GPT-NeoX: `rotary_emb_base`). `rope_parameters` per
///    layer type (every value an object, Gemma 3 in v5): the `full_attention` entry (or the only
///    one); `rope_layers` marks the layers of that type when `layer_types` lists them.
///  - head_dim: `qk_rope_head_dim` for the model types that rotate a slice of their own (multi-head
///    latent attention: DeepSeek V2/V3, ...; also unknown model types that carry it), else `head_dim`
///    if present and not null, else hidden_size / num_attention_heads. rotary_dim =
///    int(head_dim * partial_rotary_factor); GPT-NeoX `rotary_pct` (default 0.25), Phi default 0.5,
///    GPT-J and CodeGen `rotary_dim`.
///  - The model type's modeling code (src/model_types.cpp, each entry cited) decides the pairing, or
///    the config boolean it reads (DeepSeek-V3 `rope_interleave`); whether a rotary_dim < head_dim
///    matches the code (else an error); a trailing rotated slice (DeepSeek-V4: spec is that slice,
///    a note says which channels); rotation by -angle (`rotates_backward`, NanoChat); RoPE switched
///    off by a config value (falcon `alibi`, esm `position_embedding_type`: an error). An unknown or
///    missing model_type gets pairing `half` (rotate_half, transformers' common convention) and a
///    note saying so.
///  - Phi-3: `su` and `yarn` mean longrope; LongRoPE reads original_max_position_embeddings from the
///    top level; YaRN from inside rope_scaling; YaRN factor explicit, else max/original.
///  - llama3: low_freq_factor == high_freq_factor is accepted (Llama 4 Scout); see make_schedule.
///  - NoPE layers (Llama 4, SmolLM3): `no_rope_layers` (1 = RoPE, 0 = none); when absent or empty,
///    those model types build it as transformers does: layer i has RoPE unless
///    (i + 1) % no_rope_layer_interval == 0 (interval default 4) — needs num_hidden_layers. Llama 4
///    also scales queries on its NoPE layers (attn_temperature_tuning): a note gives the formula.
///  - Gemma 3 (v4): `rope_local_base_freq` is the base of the sliding_attention layers (default
///    schedule); `spec` describes the full_attention layers, `rope_layers` marks them (from
///    `layer_types`, else `sliding_window_pattern`: layer i is full when (i + 1) % pattern == 0), a
///    note says so.
/// Refused, each with an error naming the field, because rotary does not implement them yet (never
/// dropped silently): `mrope_section`, `mrope_interleaved`, `rope_3d` (multimodal RoPE: several
/// position streams per token — Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V, ERNIE-4.5-VL), rope_type
/// `mrope`, model types whose text decoder takes several position streams (model_types table),
/// rope types other than default, linear, dynamic, yarn, longrope, llama3 and su (e.g. Gemma 4's
/// `proportional`), `rope_interleave` on a model type rotary does not know, and per-layer-type
/// `rope_parameters` with several types but no `full_attention`.
/// Other unknown keys are ignored; wrong types and invalid values throw rotary::Error naming the key,
/// e.g. "rope_scaling.factor='x' must be a number". Errors and notes echo at most ~100 characters
/// of any value from the config. Pure; thread-safe.
ModelRope read_hf_config(std::string_view json_text);
/// The same from a file; errors name the path. Reads at most max_config_bytes (also from /dev/zero,
/// FIFOs and other files that are not regular): a larger config is an error, as is a directory.
ModelRope read_hf_config_file(const std::string& path);

/// Built-in presets: real models' RoPE fields (presets/*.json, sources cited in each file).
std::vector<std::string> preset_names();
/// The preset's config resolved by read_hf_config. Throws rotary::Error for an unknown name,
/// listing the known ones.
ModelRope load_preset(std::string_view name);
/// The preset file's text (JSON with "name", "source", "config").
std::string preset_text(std::string_view name);

}  // namespace rotary
