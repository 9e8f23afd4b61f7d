// rotary — RoPE settings from a Hugging Face config.json, resolved the way transformers does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rotary/spec.hpp"

namespace rotary {

/// The layer type a config reports when all its layers share one RoPE (every model before per-layer
/// RoPE, and every vision tower).
inline constexpr std::string_view default_layer_type = "full_attention";

/// What a model's config says about RoPE, plus the attention shape needed to use it.
struct ModelRope {
  std::string model_type;            ///< config "model_type" (text_config's, else the file's; the
                                     ///< vision_config's, else the file's, for a vision tower), may be empty
  Spec spec;                          ///< the RoPE settings, ready for make_schedule
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;    ///< defaults to num_attention_heads (no GQA)
  int64_t max_position_embeddings = 0;  ///< 0 when the config has none
  /// The RoPE layer type `spec` describes: one of `layer_types`.
  std::string layer_type = std::string(default_layer_type);
  /// The RoPE layer types of the model, in the order they first appear (see rotary::layer_types):
  /// each resolves with ReadOptions::layer_type. One entry when every layer shares one RoPE.
  std::vector<std::string> layer_types = {std::string(default_layer_type)};
  /// Per decoder layer (index < num_hidden_layers): true where the layer rotates q and k with
  /// `spec`, false where it does not — a layer without RoPE (Llama 4's and SmolLM3's NoPE layers,
  /// `no_rope_layers`) or a layer of another RoPE layer type (Gemma 3's sliding_attention layers when
  /// `spec` describes full_attention). Empty when every layer applies `spec`, or when the config
  /// does not say which layers are of which type.
  std::vector<bool> rope_layers;
  /// `spec` is the vision tower's RoPE (ReadOptions::vision): positions are 2-D (stream 0 and 1
  /// as the notes say), one image's patches per sequence.
  bool vision = false;
  /// The model turns each pair by -angle (NanoChat: rotate_half = cat(x2, -x1)): apply with
  /// Direction::inverse to match it. A note says so as well.
  bool rotates_backward = false;
  std::vector<std::string> notes;     ///< non-fatal findings (e.g. an explicit factor overriding the
                                      ///< ratio of the context lengths, an assumed pairing, a query
                                      ///< scale outside RoPE, what each position stream holds), one
                                      ///< sentence each
};

/// Which RoPE of a config to resolve: one layer type of the text decoder, or the vision tower.
struct ReadOptions {
  /// A name from layer_types(config); empty: "full_attention" when the model has it, else its first
  /// layer type. An unknown name is an error listing the known ones.
  std::string layer_type{};
  /// Resolve `vision_config` (the vision tower) instead of the text decoder; an error when the
  /// config has none or rotary does not know its tower's RoPE. Its only layer type is full_attention.
  bool vision = false;
};

/// Largest config.json read_hf_config_file reads: 16 MiB (real configs are a few KiB; the largest,
/// LongRoPE factor lists, stay under 100 KiB).
inline constexpr std::size_t max_config_bytes = std::size_t{16} << 20;

/// Resolves RoPE settings from config.json text, following transformers 4.4x–5.x:
///  - The text is parsed with arrays/objects nested at most 64 levels (real configs nest 4).
///    Multimodal wrappers: `text_config` holds the language model when the top level has no
///    `hidden_size`; `vision_config` the vision tower (ReadOptions::vision).
///  - `rope_parameters` (v5) or `rope_scaling` (v4); `rope_type` wins over `type` (`"type": "mrope"`
///    means default); `rope_theta` at the top level or inside; default base 10000 (GPT-NeoX:
///    `rotary_emb_base`).
///  - head_dim: `qk_rope_head_dim` for the model types that rotate a slice of their own (multi-head
///    latent attention: DeepSeek V2/V3, ...; also unknown model types that carry it), else `head_dim`
///    if present and not null, else hidden_size / num_attention_heads; the full_attention layers of
///    a config with `global_head_dim` (Gemma 4; default 512 for model_type gemma4/gemma4_text) use
///    that, and `num_global_key_value_heads` when `attention_k_eq_v`. rotary_dim =
///    int(head_dim * partial_rotary_factor); GPT-NeoX `rotary_pct` (default 0.25), Phi default 0.5,
///    GPT-J and CodeGen `rotary_dim`; rope_type `proportional` (Gemma 4) keeps rotary_dim = head_dim
///    and passes the factor to Spec::partial_rotary_factor.
///  - The model type's modeling code (src/config/model_types.cpp, each entry cited) decides the pairing, or
///    the config boolean it reads (DeepSeek-V3 `rope_interleave`); whether a rotary_dim < head_dim
///    matches the code (else an error); a trailing rotated slice (DeepSeek-V4: Spec::rotary_offset =
///    head_dim - rotary_dim); rotation by -angle (`rotates_backward`, NanoChat); RoPE switched off by
///    a config value (falcon `alibi`, esm `position_embedding_type`: an error). An unknown or missing
///    model_type gets pairing `half` (rotate_half, transformers' common convention) and a note.
///  - Multimodal RoPE (M-RoPE): `mrope_section` in the rope dict (or at the top level) gives
///    Spec::sections, three streams (t, h, w) in transformers' position_ids order. The stream layout
///    is the model type's (model_types table: Qwen3-VL/Qwen3.5 interleaved_sections, ERNIE-4.5-VL
///    alternating_sections [h, w, t], the others contiguous `sections`); `mrope_interleaved: true`
///    selects interleaved_sections for the others and for unknown types. ERNIE's own config form
///    `rope_3d: true` with `freq_allocation` t (default 20) means alternating sections
///    [(P - t)/2, (P - t)/2, t]. mrope_section must be a list of 1 to max_streams positive integers
///    summing to rotary_dim/2; a model type whose decoder takes several streams needs it.
///  - Phi-3: `su` and `yarn` mean longrope; LongRoPE reads original_max_position_embeddings from the
///    top level; YaRN from inside rope_scaling; YaRN factor explicit, else max/original.
///  - llama3: low_freq_factor == high_freq_factor is accepted (Llama 4 Scout); see make_schedule.
///  - Per-layer-type RoPE (layer_types(config) names them; ReadOptions::layer_type picks one):
///    v5 `rope_parameters` = {layer_type: {...}} (Gemma 3, Gemma 4; DeepSeek-V4's labels `main` and
///    `compress`); v4 Gemma 3: `rope_local_base_freq` is the base of the sliding_attention layers
///    (default schedule), the usual fields the full_attention layers'; v4 DeepSeek-V4: `main` is the
///    default schedule at `rope_theta`, `compress` the rope_scaling dict at `compress_rope_theta`
///    (attention_factor 1 for yarn, as transformers' DeepseekV4Config). `rope_layers` marks the
///    layers of the chosen type (from `layer_types`, else Gemma 3's `sliding_window_pattern`;
///    DeepSeek-V4: `main` on sliding_attention layers, `compress` on the others).
///  - NoPE layers (Llama 4, SmolLM3): `no_rope_layers` (1 = RoPE, 0 = none); when absent or empty,
///    those model types build it as transformers does: layer i has RoPE unless
///    (i + 1) % no_rope_layer_interval == 0 (interval default 4) — needs num_hidden_layers. Llama 4
///    also scales queries on its NoPE layers (attn_temperature_tuning): a note gives the formula.
///  - Vision towers (ReadOptions::vision), each from its modeling code: Qwen2-VL, Qwen2.5-VL,
///    Qwen3-VL, GLM-4.1V (`axial`, half, streams h then w, base 10000, head_dim = hidden_size (Qwen2-VL:
///    embed_dim) / num_heads); Pixtral (`axial_even_odd`, half, h then w, `rope_theta`); Llama 4
///    (`axial`, interleaved, stream 0 = column + 1 and stream 1 = row + 1: positions 1-based, the CLS
///    token at position 0 in both); Gemma 4 (`axial` in 2 blocks of half pairs, x then y, base
///    `rope_theta`, default 100).
/// Refused, each with an error naming the field: a rope type no schedule of rotary reads (the error
/// lists those that one does), `rope_interleave` on a model type rotary does not know, and a vision
/// tower rotary does not know.
/// Other unknown keys are ignored; wrong types and invalid values throw rotary::Error naming the key,
/// e.g. "rope_scaling.factor='x' must be a number". Errors and notes echo at most ~100 characters
/// of any value from the config. Pure; thread-safe.
ModelRope read_hf_config(std::string_view json_text, const ReadOptions& options = {});
/// The same from a file; errors name the path. Reads at most max_config_bytes (also from /dev/zero,
/// FIFOs and other files that are not regular): a larger config is an error, as is a directory.
ModelRope read_hf_config_file(const std::string& path, const ReadOptions& options = {});

/// The RoPE layer types of a config, in the order they first appear in its `layer_types` (then the
/// others in the order of its rope dict; DeepSeek-V4: main, compress): what ReadOptions::layer_type
/// accepts. A config whose layers share one RoPE gives {"full_attention"} (default_layer_type), even
/// when `layer_types` lists attention kinds (sliding windows) that rotate alike. Throws
/// rotary::Error for JSON that is not a config object.
std::vector<std::string> layer_types(std::string_view json_text);

/// A model's own context: how many positions (0 .. length-1) it is made for, and how its settings
/// state that number.
struct ContextLength {
  int64_t length = 0;  ///< 0: the settings state no length
  std::string source;  ///< "max_position_embeddings", "max_position", "original length", "max_length",
                       ///< or "factor 4 x original length 32768"
};

/// The model's own context length, the one rule `rotary info` (its float32 drift line), `rotary
/// doctor` and rotary.plot follow: monotone's max_length; for yarn and llama3, whose factor s
/// stretches the original length L (Spec::original_length), floor(s x L) (at most 2^62) when s > 1
/// and no larger maximum is stated (Qwen2.5: max_position_embeddings = L = 32768, factor 4:
/// 131072); else the largest length stated, of `max_position_embeddings` (ModelRope's; 0: none),
/// Spec::max_position and L (Llama-3.1: max_position_embeddings 131072 > L = 8192; LongRoPE's
/// max_position). linear states no L: its max_position_embeddings is the model's length (Gemma 3
/// states 131072 with factor 8). The length may exceed the positions rotary takes (2^31). Pure.
ContextLength context_length(const Spec& spec, int64_t max_position_embeddings = 0);

/// Built-in presets: real models' RoPE fields (presets/*.json, sources cited in each file).
std::vector<std::string> preset_names();
/// The preset's config resolved by read_hf_config. Throws rotary::Error for an unknown name,
/// listing the known ones.
ModelRope load_preset(std::string_view name, const ReadOptions& options = {});
/// The preset file's text (JSON with "name", "source", "config").
std::string preset_text(std::string_view name);
/// The preset's config as JSON text, for layer_types() and read_hf_config().
std::string preset_config(std::string_view name);

}  // namespace rotary
