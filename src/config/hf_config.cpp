#include "rotary/hf_config.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "json_parse.hpp"
#include "model_types.hpp"
#include "presets.hpp"
#include "rotary/error.hpp"
#include "rotary/spec_fields.hpp"
#include "schedules/registry.hpp"
#include "text.hpp"

namespace rotary {
namespace {

using json = nlohmann::json;
using detail::describe;
using detail::excerpt;

// ---- typed access naming the key on error. A JSON null counts as absent (Python's None). ----

const json& empty_object() {
  static const json empty = json::object();
  return empty;
}

const json* find(const json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string name_of(std::string_view prefix, std::string_view key) {
  return std::string(prefix) + std::string(key);
}

double number(const json& v, std::string_view where) {
  if (!v.is_number()) throw Error(fmt::format("{}={} must be a number", where, describe(v)));
  const double d = v.get<double>();
  if (!std::isfinite(d)) throw Error(fmt::format("{}={} must be finite", where, describe(v)));
  return d;
}

std::optional<double> opt_number(const json& object, std::string_view key, std::string_view prefix) {
  const json* v = find(object, key);
  if (!v) return std::nullopt;
  return number(*v, name_of(prefix, key));
}

std::optional<int64_t> opt_integer(const json& object, std::string_view key, std::string_view prefix) {
  const json* v = find(object, key);
  if (!v) return std::nullopt;
  // JSON integers are read exactly (9007199254740993 is an integer, one beyond 2^53); integers may
  // also be written as 4096.0 (both appear in real configs). The field's own rule (a range, say)
  // then names the value.
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    throw Error(fmt::format("{}{}={} must be an integer below 2^63", prefix, key, describe(*v)));
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  const double d = number(*v, name_of(prefix, key));
  if (d != std::floor(d)) throw Error(fmt::format("{}{}={} must be an integer", prefix, key, describe(*v)));
  if (!(std::fabs(d) < 0x1p63)) {
    throw Error(fmt::format("{}{}={} must be an integer in [-2^63, 2^63)", prefix, key, describe(*v)));
  }
  return static_cast<int64_t>(d);
}

std::vector<double> number_list(const json& object, std::string_view key, std::string_view prefix) {
  const json* v = find(object, key);
  if (!v) return {};
  if (!v->is_array()) {
    throw Error(fmt::format("{}{}={} must be a list of numbers", prefix, key, describe(*v)));
  }
  std::vector<double> out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) out.push_back(number((*v)[i], fmt::format("{}{}[{}]", prefix, key, i)));
  return out;
}

std::string text(const json& object, std::string_view key, std::string_view prefix) {
  const json* v = find(object, key);
  if (!v) return {};
  if (!v->is_string()) throw Error(fmt::format("{}{}={} must be a string", prefix, key, describe(*v)));
  return v->get<std::string>();
}

bool boolean(const json& object, std::string_view key, std::string_view prefix, bool fallback) {
  const json* v = find(object, key);
  if (!v) return fallback;
  if (!v->is_boolean()) throw Error(fmt::format("{}{}={} must be true or false", prefix, key, describe(*v)));
  return v->get<bool>();
}

// Python's truth value of a boolean or a number, for flags transformers tests with `if flag:`
// (Llama 4's config.json writes attn_temperature_tuning as 4, no_rope_layers as 0/1).
bool truthy(const json& v, std::string_view where) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return number(v, where) != 0;
  throw Error(fmt::format("{}={} must be a boolean or a number", where, describe(v)));
}

// ---- where a config's RoPE settings come from ----

// A decoder count far beyond any model (the largest have ~200 layers), so rope_layers stays small.
constexpr int64_t kMaxLayers = int64_t{1} << 20;

struct Source {
  const json* config = nullptr;              // the language model's settings
  const json* rope = &empty_object();        // the chosen layer type's rope dict (rope_parameters,
                                             // one entry of it, rope_scaling, or one built from v4 keys)
  std::string rope_name = "rope_scaling";    // how errors name `rope`
  std::string layer_type = std::string(default_layer_type);  // the RoPE layer type `spec` describes
  bool per_layer = false;                    // the config's RoPE differs by layer type
  const detail::ModelTypeRope* entry = nullptr;  // the model type's row, null when unknown
  const detail::ModelTypeRope* multimodal = nullptr;  // a row whose decoder takes several streams
  json owned;                                // the chosen rope dict when built from v4 keys
};

// Multimodal wrappers keep the language model's settings in text_config.
const json& language_model(const json& root) {
  const json* text_config = find(root, "text_config");
  if (!text_config || find(root, "hidden_size")) return root;
  if (!text_config->is_object()) {
    throw Error(fmt::format("text_config={} must be an object", describe(*text_config)));
  }
  return *text_config;
}

// text_config's model_type names the decoder (llama4_text); the file's names the wrapper (llama4).
// Either may be the one rotary's table knows; a wrapper whose decoder takes several position
// streams per token is refused even when its text_config's type is unknown.
void read_model_type(const json& root, Source& src, ModelRope& out) {
  const std::string inner = text(*src.config, "model_type", "");
  const std::string outer = &root == src.config ? inner : text(root, "model_type", "");
  out.model_type = inner.empty() ? outer : inner;
  const detail::ModelTypeRope* inner_entry = detail::find_model_type(inner);
  const detail::ModelTypeRope* outer_entry = detail::find_model_type(outer);
  for (const auto* e : {inner_entry, outer_entry}) {
    if (e && e->multimodal_positions && !src.multimodal) src.multimodal = e;
  }
  src.entry = inner_entry ? inner_entry : outer_entry;
}

// RoPE on or off by a config value (falcon's alibi, esm's position_embedding_type): refused when off,
// since the model then applies no rotation at all.
void require_rope_switched_on(const Source& src, const ModelRope& out) {
  const detail::ModelTypeRope* e = src.entry;
  if (!e || e->rope_switch_key.empty()) return;
  // The table's JSON text; empty means null.
  auto table_json = [](std::string_view text) { return text.empty() ? json() : json::parse(text); };
  const json* value = find(*src.config, e->rope_switch_key);
  const json fallback = table_json(e->rope_switch_default);
  if ((value ? *value : fallback) == table_json(e->rope_switch_value)) return;
  throw Error(fmt::format("{}={}{}: model_type '{}' applies RoPE only with {}={}", e->rope_switch_key,
                          value ? describe(*value) : describe(fallback), value ? "" : " (the default)",
                          excerpt(out.model_type), e->rope_switch_key, e->rope_switch_value));
}

void read_attention_shape(const Source& src, ModelRope& out) {
  const json& config = *src.config;
  const auto heads = opt_integer(config, "num_attention_heads", "");
  if (!heads || *heads <= 0) throw Error("num_attention_heads is missing or not > 0");
  out.num_attention_heads = *heads;
  out.num_key_value_heads = opt_integer(config, "num_key_value_heads", "").value_or(*heads);
  if (out.num_key_value_heads <= 0 || *heads % out.num_key_value_heads != 0) {
    throw Error(fmt::format("num_key_value_heads={} must divide num_attention_heads={}",
                            out.num_key_value_heads, *heads));
  }
  out.max_position_embeddings = opt_integer(config, "max_position_embeddings", "").value_or(0);

  // Multi-head latent attention (DeepSeek V2/V3, ...) rotates a slice of qk_rope_head_dim channels
  // of its own: that slice is the head RoPE sees. Unknown model types that carry the key mean the same.
  int64_t head_dim = 0;
  if (src.entry ? src.entry->rotary_dim_key == "qk_rope_head_dim" : find(config, "qk_rope_head_dim") != nullptr) {
    const auto rope_head = opt_integer(config, "qk_rope_head_dim", "");
    if (!rope_head) throw Error(fmt::format("qk_rope_head_dim is missing (model_type {})", excerpt(out.model_type)));
    head_dim = *rope_head;
  } else if (out.model_type == "jetmoe") {
    // JetMoeConfig: attribute_map {"head_dim": "kv_channels"}, kv_channels default 128.
    head_dim = opt_integer(config, "kv_channels", "").value_or(opt_integer(config, "head_dim", "").value_or(128));
  } else if (out.model_type == "zamba2") {
    // Zamba2Config: attribute_map {"head_dim": "attention_head_dim"}, which __post_init__ sets to
    // 2 * hidden_size // num_attention_heads (its attention reads the concatenation of two streams).
    const auto hidden = opt_integer(config, "hidden_size", "");
    if (!hidden) {
      throw Error("hidden_size is missing (needed for zamba2's head_dim = 2 * hidden_size / num_attention_heads)");
    }
    head_dim = 2 * *hidden / *heads;
  } else if (auto hd = opt_integer(config, "head_dim", "")) {
    head_dim = *hd;
  } else {
    const auto hidden = opt_integer(config, "hidden_size", "");
    if (!hidden) throw Error("hidden_size is missing (needed for head_dim = hidden_size / num_attention_heads)");
    head_dim = *hidden / *heads;  // Python's //
  }
  if (head_dim <= 0) throw Error(fmt::format("head_dim={} must be > 0", head_dim));
  out.spec.head_dim = head_dim;
}

// ---- RoPE per layer type ----

// One RoPE layer type: its name and its rope dict, read from the config or built from v4 keys.
struct LayerRope {
  std::string name;
  const json* dict = nullptr;  // into the config; null: `built`
  json built;                  // a dict assembled from v4 keys (small, from checked scalars)
  std::string rope_name;       // how errors name the dict
  const json& rope() const { return dict ? *dict : built; }
};

struct RopeTypes {
  std::vector<LayerRope> types;  // in the order they first appear
  bool per_layer = false;        // false: one RoPE for every layer (types has one entry)
  std::vector<std::string> notes;  // what reading them decided (rope_scaling over rope_parameters)
};

// A flat rope dict holds strings, numbers, lists and booleans; one per layer type holds objects.
bool per_layer_type(const json& parameters) {
  for (const auto& item : parameters.items()) {
    if (item.value().is_object()) return true;
  }
  return false;
}

bool is_deepseek_v4(const std::string& type) { return type == "deepseek_v4"; }

// The position of `name` in the config's layer_types (its first layer of that type), else past the end.
size_t first_layer_of(const json& config, const std::string& name) {
  const json* types = find(config, "layer_types");
  if (!types || !types->is_array()) {
    // Gemma 3 without layer_types: layer i is full_attention when (i + 1) % sliding_window_pattern == 0.
    const json* pattern = find(config, "sliding_window_pattern");
    if (!pattern || !pattern->is_number_integer() || pattern->get<int64_t>() < 1) return SIZE_MAX;
    const auto first_full = static_cast<size_t>(pattern->get<int64_t>() - 1);
    return name == "full_attention" ? first_full : name == "sliding_attention" && first_full > 0 ? 0 : SIZE_MAX;
  }
  for (size_t i = 0; i < types->size(); ++i) {
    if ((*types)[i].is_string() && (*types)[i].get_ref<const std::string&>() == name) return i;
  }
  return SIZE_MAX;
}

// v5: rope_parameters = {layer_type: {...}}, ordered by the config's layer_types (DeepSeek-V4: main,
// compress), the others after them in the dict's order.
void per_layer_dicts(const json& parameters, const json& config, const std::string& type, RopeTypes& out) {
  for (const auto& item : parameters.items()) {
    if (!item.value().is_object()) {
      throw Error(fmt::format("rope_parameters.{}={} must be an object: the other entries make "
                              "rope_parameters per layer type",
                              excerpt(item.key()), describe(item.value())));
    }
    out.types.push_back({.name = item.key(), .dict = &item.value(),
                         .rope_name = "rope_parameters." + excerpt(item.key())});
  }
  auto rank = [&](const LayerRope& t) {
    if (is_deepseek_v4(type)) return t.name == "main" ? size_t{0} : t.name == "compress" ? size_t{1} : SIZE_MAX;
    return first_layer_of(config, t.name);
  };
  std::stable_sort(out.types.begin(), out.types.end(),
                   [&](const LayerRope& a, const LayerRope& b) { return rank(a) < rank(b); });
  out.per_layer = true;
}

// The flat rope dict as transformers picks it (PreTrainedConfig.convert_rope_params_to_dict:
// `rope_scaling or rope_parameters`): a non-empty v4 rope_scaling, else v5 rope_parameters, else
// none. When both are given and differ, a note says which one is read.
LayerRope flat_rope(const json& config, std::vector<std::string>& notes) {
  LayerRope flat{.name = std::string(default_layer_type), .dict = &empty_object(), .rope_name = "rope_scaling"};
  const json* scaling = find(config, "rope_scaling");
  if (scaling && !scaling->is_object()) {
    throw Error(fmt::format("rope_scaling={} must be an object or null", describe(*scaling)));
  }
  const json* parameters = find(config, "rope_parameters");
  if (scaling && !scaling->empty()) {
    flat.dict = scaling;
    if (parameters && *parameters != *scaling) {
      notes.push_back(fmt::format("rope_scaling={} and rope_parameters={} differ: rope_scaling is read, as "
                                  "transformers reads it (convert_rope_params_to_dict: rope_scaling or "
                                  "rope_parameters)", excerpt(scaling->dump()), excerpt(parameters->dump())));
    }
  } else if (parameters) {
    flat.dict = parameters;
    flat.rope_name = "rope_parameters";
  }
  return flat;
}

// Keys of a rope dict that transformers' validation of its rope_type expects (the schedule's
// ScheduleEntry::rope_keys), those every type takes, and the model-specific keys rotary reads (its
// config classes' ignore_keys_at_rope_validation).
bool rope_key_is_read(const detail::ScheduleEntry& schedule, std::string_view key) {
  for (const std::string_view k : {"rope_type", "type", "rope_theta", "partial_rotary_factor", "mrope_section",
                                   "mrope_interleaved", "interleaved"}) {
    if (key == k) return true;
  }
  const auto& keys = schedule.rope_keys;
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

// transformers ignores the keys of a rope dict its rope_type does not read (it logs "Unrecognized
// keys"); rotary ignores them too, each named in a note, so a misspelt key cannot go unseen.
void note_unread_keys(const json& rope, const std::string& rope_name, const detail::ScheduleEntry& schedule,
                      std::vector<std::string>& notes) {
  if (!rope.is_object()) return;
  for (const auto& item : rope.items()) {
    if (rope_key_is_read(schedule, item.key())) continue;
    notes.push_back(fmt::format("{}.{} is not a key of rope_type {}: ignored, as transformers ignores it",
                                rope_name, excerpt(item.key()), schedule.rope_types.front()));
  }
}

// Gemma 3 (v4): rope_local_base_freq is the base of the sliding_attention layers, default schedule;
// the usual fields describe the full_attention layers.
void gemma3_v4(const json& config, double local_base, LayerRope flat, RopeTypes& out) {
  LayerRope sliding{.name = "sliding_attention", .rope_name = "rope_local_base_freq"};
  sliding.built = {{"rope_type", "default"}, {"rope_theta", local_base}};
  flat.name = "full_attention";
  out.types.push_back(std::move(sliding));
  out.types.push_back(std::move(flat));
  if (first_layer_of(config, "full_attention") < first_layer_of(config, "sliding_attention")) {
    std::swap(out.types[0], out.types[1]);
  }
  out.per_layer = true;
}

// DeepSeek-V4 (v4 keys, transformers' DeepseekV4Config.__post_init__): main = default schedule at
// rope_theta; compress = the rope_scaling dict at compress_rope_theta (default 160000), its yarn
// without a computed attention factor (attention_factor 1 unless given).
void deepseek_v4_v4(const json& config, const LayerRope& flat, RopeTypes& out) {
  LayerRope main{.name = "main", .rope_name = "rope_theta"};
  main.built = {{"rope_type", "default"}, {"rope_theta", opt_number(config, "rope_theta", "").value_or(10000.0)}};
  LayerRope compress{.name = "compress", .rope_name = flat.rope_name};
  compress.built = json::object();
  for (const auto& item : flat.rope().items()) {
    if (item.key() != "main" && item.key() != "compress") compress.built[item.key()] = item.value();
  }
  compress.built["rope_theta"] = opt_number(config, "compress_rope_theta", "").value_or(160000.0);
  if (!compress.built.contains("rope_type") && !compress.built.contains("type")) compress.built["rope_type"] = "default";
  const json& kind = compress.built.contains("rope_type") ? compress.built["rope_type"] : compress.built["type"];
  if (kind == "yarn" && !compress.built.contains("attention_factor")) compress.built["attention_factor"] = 1.0;
  out.types.push_back(std::move(main));
  out.types.push_back(std::move(compress));
  out.per_layer = true;
}

// Every RoPE layer type of the language model `config`, each with its rope dict.
RopeTypes rope_types(const json& config, const std::string& type) {
  RopeTypes out;
  LayerRope flat = flat_rope(config, out.notes);
  if (flat.dict != &empty_object() && !flat.dict->is_object()) {
    throw Error(fmt::format("{}={} must be an object or null", flat.rope_name, describe(*flat.dict)));
  }
  if (flat.rope_name == "rope_parameters" && per_layer_type(*flat.dict)) {
    per_layer_dicts(*flat.dict, config, type, out);
  } else if (auto local_base = opt_number(config, "rope_local_base_freq", "")) {
    gemma3_v4(config, *local_base, std::move(flat), out);
  } else if (is_deepseek_v4(type)) {
    deepseek_v4_v4(config, flat, out);
  } else {
    out.types.push_back(std::move(flat));
  }
  return out;
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& n : names) text += (text.empty() ? "" : ", ") + excerpt(n);
  return text;
}

std::vector<std::string> names_of(const RopeTypes& types) {
  std::vector<std::string> names;
  for (const LayerRope& t : types.types) names.push_back(t.name);
  return names;
}

// The requested layer type (empty: full_attention when present, else the first).
void select_rope(const json& config, const std::string& requested, Source& src, ModelRope& out) {
  const RopeTypes types = rope_types(config, out.model_type);
  out.notes.insert(out.notes.end(), types.notes.begin(), types.notes.end());
  out.layer_types = names_of(types);
  const std::string wanted = !requested.empty() ? requested
                             : std::find(out.layer_types.begin(), out.layer_types.end(), default_layer_type) !=
                                       out.layer_types.end()
                                 ? std::string(default_layer_type)
                                 : out.layer_types.front();
  auto chosen = std::find_if(types.types.begin(), types.types.end(),
                             [&](const LayerRope& t) { return t.name == wanted; });
  if (chosen == types.types.end()) {
    throw Error(fmt::format("layer_type '{}' is not a RoPE layer type of this config (known: {})", excerpt(wanted),
                            joined(out.layer_types)));
  }
  src.per_layer = types.per_layer;
  src.layer_type = chosen->name;
  src.rope_name = chosen->rope_name;
  // The dicts built from v4 keys live in `types`: keep the chosen one with the source.
  if (chosen->dict) {
    src.rope = chosen->dict;
  } else {
    src.owned = chosen->built;
    src.rope = &src.owned;
  }
  out.layer_type = chosen->name;
  if (types.per_layer && types.types.size() > 1) {
    out.notes.push_back(fmt::format("RoPE differs by layer type ({}): spec describes the {} layers (rope_layers "
                                    "marks them); choose another with layer_type (CLI --layer-type)",
                                    joined(out.layer_types), excerpt(src.layer_type)));
  }
}

// DeepSeek-V3 reads rope_interleave; on a model type rotary does not know, what it selects is unknown.
void refuse_unknown_interleave(const Source& src) {
  if (const json* v = find(*src.config, "rope_interleave"); v && !src.entry) {
    throw Error(fmt::format("rope_interleave={} on a model type rotary does not know: which pairing it "
                            "selects depends on the model's code",
                            describe(*v)));
  }
}

// The partial_rotary_factor a config class gives when config.json has none: transformers 5.23's
// configuration_<dir>.py, `kwargs.setdefault("partial_rotary_factor", x)` (Bamba sets it
// whatever the config says: `kwargs["partial_rotary_factor"] = 0.5  # hardcode for BC`).
// Sorted by model_type.
struct PartialDefault {
  std::string_view model_type;
  double factor;
  bool forced = false;
};
constexpr std::array kPartialDefaults = {
    PartialDefault{"bamba", 0.5, true},
    PartialDefault{"glm", 0.5},
    PartialDefault{"glm4", 0.5},
    PartialDefault{"glm4_moe", 0.5},
    PartialDefault{"glm4v_moe", 0.5},
    PartialDefault{"glm4v_moe_text", 0.5},
    PartialDefault{"glmasr_encoder", 0.5},
    PartialDefault{"moonshine", 0.9},
    PartialDefault{"nemotron", 0.5},
    PartialDefault{"persimmon", 0.5},
    PartialDefault{"phi", 0.5},
    PartialDefault{"qwen3_5", 0.25},
    PartialDefault{"qwen3_5_moe", 0.25},
    PartialDefault{"qwen3_5_moe_text", 0.25},
    PartialDefault{"qwen3_5_text", 0.25},
    PartialDefault{"qwen3_next", 0.25},
    PartialDefault{"recurrent_gemma", 0.5},
    PartialDefault{"stablelm", 0.25},
};
static_assert(std::ranges::is_sorted(kPartialDefaults, {}, &PartialDefault::model_type));

const PartialDefault* partial_default(std::string_view type) {
  const auto it = std::lower_bound(kPartialDefaults.begin(), kPartialDefaults.end(), type,
                                   [](const PartialDefault& d, std::string_view t) { return d.model_type < t; });
  return it != kPartialDefaults.end() && it->model_type == type ? &*it : nullptr;
}

// partial_rotary_factor as the model type's config class resolves it.
double partial_factor(const Source& src, const std::string& p, const ModelRope& out) {
  const json& config = *src.config;
  const std::string& type = out.model_type;
  const PartialDefault* fallback = partial_default(type);
  if (fallback && fallback->forced) return fallback->factor;
  double partial = fallback ? fallback->factor : 1.0;
  // GPT-NeoX (-Japanese): rotary_pct, default 0.25 (1.0).
  if (type == "gpt_neox") partial = opt_number(config, "rotary_pct", "").value_or(0.25);
  if (type == "gpt_neox_japanese") partial = opt_number(config, "rotary_pct", "").value_or(1.0);
  // MiniMax-M2 checkpoints give the rotated width as rotary_dim (MiniMaxM2Config: rotary_dim / head_dim).
  if (type == "minimax_m2") {
    if (auto width = opt_integer(config, "rotary_dim", "")) {
      partial = static_cast<double>(*width) / static_cast<double>(out.spec.head_dim);
    }
  }
  if (is_deepseek_v4(type)) {
    // DeepseekV4Config: qk_rope_head_dim / head_dim from older configs, else 64 / 512.
    const auto rope_head = opt_integer(config, "qk_rope_head_dim", "");
    partial = rope_head ? static_cast<double>(*rope_head) / static_cast<double>(out.spec.head_dim) : 64.0 / 512.0;
  }
  if (auto f = opt_number(config, "partial_rotary_factor", "")) partial = *f;
  if (auto f = opt_number(*src.rope, "partial_rotary_factor", p)) partial = *f;
  if (partial <= 0 || partial > 1) {
    throw Error(fmt::format("partial_rotary_factor={} must be in (0, 1]", partial));
  }
  return partial;
}

// base, rotary_dim (and where the rotated slice sits). A schedule that takes partial_rotary_factor
// (proportional) keeps the whole head and is handed the factor.
void read_dims(const Source& src, const detail::ScheduleEntry* schedule, ModelRope& out) {
  const json& config = *src.config;
  const std::string p = src.rope_name + ".";
  double base = 10000.0;
  if (out.model_type == "gpt_neox") base = opt_number(config, "rotary_emb_base", "").value_or(base);
  if (auto theta = opt_number(config, "rope_theta", "")) base = *theta;
  if (auto theta = opt_number(*src.rope, "rope_theta", p)) base = *theta;

  const double partial = partial_factor(src, p, out);
  const int64_t head_dim = out.spec.head_dim;
  const bool whole_head = schedule && schedule_uses(schedule->info, *find_spec_field("partial_rotary_factor"));
  int64_t rotary_dim = whole_head ? head_dim : static_cast<int64_t>(static_cast<double>(head_dim) * partial);
  if (whole_head) out.spec.partial_rotary_factor = partial;
  const detail::ModelTypeRope* e = src.entry;
  if (e && e->rotary_dim_key == "rotary_dim") {  // GPT-J, CodeGen: the width itself
    rotary_dim = opt_integer(config, "rotary_dim", "").value_or(head_dim);
    if (rotary_dim <= 0 || rotary_dim % 2 != 0) {
      throw Error(fmt::format("rotary_dim={} must be even and > 0", rotary_dim));
    }
  }
  if (rotary_dim <= 0 || rotary_dim % 2 != 0) {
    throw Error(fmt::format("rotary_dim=int(head_dim {} * partial_rotary_factor {})={} must be even and > 0",
                            head_dim, partial, rotary_dim));
  }
  if (e && !e->partial_rotary && rotary_dim < head_dim) {
    throw Error(fmt::format("rotary_dim={} (partial_rotary_factor {}) is less than head_dim={}, but model_type "
                            "'{}' rotates the whole head: its attention code has no partial rotation",
                            rotary_dim, partial, head_dim, excerpt(out.model_type)));
  }
  out.spec.rotary_dim = rotary_dim;
  out.spec.base = base;
  if (e && e->trailing_rotary && rotary_dim < head_dim) {
    // [nope | rope]: the rotated slice is the last rotary_dim channels.
    out.spec.rotary_offset = head_dim - rotary_dim;
    out.notes.push_back(fmt::format("model_type '{}' rotates the last {} of the {} channels of each head "
                                    "(channels {} to {}, nope-first): rotary_offset={}",
                                    excerpt(out.model_type), rotary_dim, head_dim, head_dim - rotary_dim,
                                    head_dim - 1, head_dim - rotary_dim));
  }
}

// The pairing lives in each model's modeling code: the model_types table, or the config boolean
// that table names. Unknown model types get transformers' common rotate_half, with a note.
void read_pairing(const Source& src, ModelRope& out) {
  if (const detail::ModelTypeRope* e = src.entry) {
    out.spec.pairing = e->pairing;
    bool as_formula = true;  // false: the flag switched the model to plain rotate_half
    if (!e->pairing_flag.empty()) {
      as_formula = boolean(*src.config, e->pairing_flag, "", e->pairing_flag_default);
      out.spec.pairing = as_formula ? Pairing::interleaved : Pairing::half;
    }
    out.rotates_backward = as_formula && detail::rotates_backward(e->formula);
    if (out.rotates_backward) {
      out.notes.push_back(fmt::format("model_type '{}' turns each pair by -angle: apply with Direction::inverse "
                                      "to match it",
                                      excerpt(out.model_type)));
    }
    if (as_formula && detail::deinterleaves_output(e->formula)) {
      out.notes.push_back(fmt::format("model_type '{}' writes each rotated pair (x[2i], x[2i+1]) to channels "
                                      "(i, i + rotary_dim/2): the numbers of rotary's interleaved output in "
                                      "another channel order, with the same q.k",
                                      excerpt(out.model_type)));
    }
    return;
  }
  const std::string which = out.model_type.empty()
                                ? std::string("config has no model_type")
                                : fmt::format("model_type '{}' is not in rotary's table", excerpt(out.model_type));
  out.notes.push_back(which +
                      ": assumed pairing half (rotate_half, the most common in transformers); check "
                      "the model's attention code");
}

// The rope dict's rope_type (else its legacy `type`, else "default"), as the config writes it.
std::string read_rope_type(const Source& src, const std::string& type) {
  const std::string p = src.rope_name + ".";
  std::string rope_type = text(*src.rope, "rope_type", p);
  const std::string legacy_type = text(*src.rope, "type", p);
  if (rope_type.empty()) rope_type = legacy_type;
  if (rope_type.empty()) rope_type = "default";
  if (type.rfind("phi3", 0) == 0 && (legacy_type == "su" || legacy_type == "yarn")) rope_type = "longrope";
  return rope_type;
}

// A schedule's reader sees the rope dict through this (schedules/entry.hpp).
class JsonRopeDict final : public detail::RopeDict {
 public:
  JsonRopeDict(const Source& src, ModelRope& out) : src_(src), out_(out), prefix_(src.rope_name + ".") {}

  const std::string& prefix() const override { return prefix_; }
  bool has(std::string_view key) const override { return find(*src_.rope, key) != nullptr; }
  std::optional<double> number(std::string_view key) const override { return opt_number(*src_.rope, key, prefix_); }
  std::optional<int64_t> config_integer(std::string_view key) const override {
    return opt_integer(*src_.config, key, "");
  }
  int64_t max_position(std::string_view why) const override {
    if (out_.max_position_embeddings <= 0) {
      throw Error(fmt::format("max_position_embeddings is missing ({} needs it)", why));
    }
    return out_.max_position_embeddings;
  }
  void note(std::string text) override { out_.notes.push_back(std::move(text)); }

  void read(Spec& spec, std::string_view name) const override {
    const SpecField* field = find_spec_field(name);
    if (!field || field->config_key.empty()) throw std::logic_error(fmt::format("{} has no config key", name));
    const json& rope = *src_.rope;
    const std::string_view key = field->config_key;
    switch (field->kind) {
      case FieldKind::integer:
        if (auto v = opt_integer(rope, key, prefix_)) set_field(spec, name, *v);
        return;
      case FieldKind::number:
        if (auto v = opt_number(rope, key, prefix_)) set_field(spec, name, *v);
        return;
      case FieldKind::boolean:
        if (find(rope, key)) set_field(spec, name, boolean(rope, key, prefix_, true));
        return;
      case FieldKind::numbers:
        if (auto v = number_list(rope, key, prefix_); !v.empty()) set_field(spec, name, std::move(v));
        return;
      case FieldKind::integers:
      case FieldKind::choice:
        break;
    }
    throw std::logic_error(fmt::format("{} is not read from a rope dict", name));
  }

 private:
  const Source& src_;
  ModelRope& out_;
  std::string prefix_;
};

// "default, linear, ..., mrope, su": every rope_type the schedules read, their own names first.
std::string supported_rope_types() {
  std::string own, legacy;
  for (const auto entry : detail::kScheduleEntries) {
    const auto& names = entry().rope_types;
    for (size_t i = 0; i < names.size(); ++i) (i == 0 ? own : legacy) += fmt::format(", {}", names[i]);
  }
  return (own + legacy).substr(2);
}

// The schedule the rope dict names, and its fields (the schedule's own reader).
void read_schedule(const Source& src, const detail::ScheduleEntry* schedule, const std::string& rope_type,
                   ModelRope& out) {
  if (!schedule) {
    throw Error(fmt::format("{}.rope_type='{}' is not supported ({})", src.rope_name, excerpt(rope_type),
                            supported_rope_types()));
  }
  out.spec.schedule = schedule->info.type;
  JsonRopeDict dict(src, out);
  if (schedule->read_config) schedule->read_config(dict, out.spec);
  note_unread_keys(*src.rope, src.rope_name, *schedule, out.notes);
}

// ---- position streams (multimodal RoPE) ----

const json* find_either(const json& rope, const json& config, std::string_view key, std::string& name,
                        const std::string& p) {
  if (const json* v = find(rope, key)) {
    name = p + std::string(key);
    return v;
  }
  name = std::string(key);
  return find(config, key);
}

// mrope_section: 1 to max_streams positive integers.
std::vector<int64_t> section_list(const json& v, const std::string& name) {
  const auto bad = [&] {
    return Error(fmt::format("{}={} must be a list of 1 to {} positive integers (pairs per position stream)", name,
                             describe(v), max_streams));
  };
  if (!v.is_array() || v.empty() || v.size() > static_cast<size_t>(max_streams)) throw bad();
  std::vector<int64_t> sections;
  for (const json& item : v) {
    if (!item.is_number_integer() && !(item.is_number() && item.get<double>() == std::floor(item.get<double>()))) {
      throw bad();
    }
    const double d = item.get<double>();
    if (d < 1 || d > 1e9) throw bad();
    sections.push_back(static_cast<int64_t>(d));
  }
  return sections;
}

// ERNIE-4.5-VL's own config: rope_3d with freq_allocation t pairs of time; h and w share the rest.
std::vector<int64_t> ernie_sections(const json& config, int64_t pairs) {
  const int64_t time = opt_integer(config, "freq_allocation", "").value_or(20);
  if (time < 1 || time >= pairs || (pairs - time) % 2 != 0) {
    throw Error(fmt::format("freq_allocation={} must be in [1, {}) with rotary_dim/2 - freq_allocation even "
                            "(rope_3d: h and w share the other pairs)",
                            time, pairs));
  }
  return {(pairs - time) / 2, (pairs - time) / 2, time};
}

// Spec::sections and stream_layout from mrope_section (+ mrope_interleaved), or rope_3d.
void read_streams(const Source& src, ModelRope& out) {
  const json& config = *src.config;
  const std::string p = src.rope_name + ".";
  std::string section_name, flag_name;
  const json* section = find_either(*src.rope, config, "mrope_section", section_name, p);
  const json* flag = find_either(*src.rope, config, "mrope_interleaved", flag_name, p);
  if (flag && !flag->is_boolean()) throw Error(fmt::format("{}={} must be true or false", flag_name, describe(*flag)));
  const bool interleaved = flag && flag->get<bool>();
  const bool rope_3d = boolean(config, "rope_3d", "", false);
  if (!section && !rope_3d) {
    if (src.multimodal) {
      throw Error(fmt::format("model_type '{}' rotates several position streams per token (multimodal RoPE), "
                              "but the config has no mrope_section saying how many pairs each stream drives",
                              src.multimodal->model_type));
    }
    if (interleaved) throw Error(fmt::format("{}=true without mrope_section", flag_name));
    return;
  }
  const int64_t pairs = out.spec.resolved_rotary_dim() / 2;
  Spec& spec = out.spec;
  spec.sections = section ? section_list(*section, section_name) : ernie_sections(config, pairs);
  if (!section) section_name = "rope_3d sections";
  spec.stream_layout = src.multimodal ? src.multimodal->stream_layout : StreamLayout::sections;
  if (rope_3d) spec.stream_layout = StreamLayout::alternating_sections;
  if (interleaved && spec.stream_layout == StreamLayout::sections) spec.stream_layout = StreamLayout::interleaved_sections;
  int64_t sum = 0;
  for (int64_t n : spec.sections) sum += n;
  if (sum != pairs) {
    throw Error(fmt::format("{}={} sums to {} pairs, but rotary_dim={} has {}", section_name,
                            section ? describe(*section) : std::to_string(sum), sum, spec.resolved_rotary_dim(),
                            pairs));
  }
  if (spec.stream_layout != StreamLayout::sections && spec.sections.size() != 3) {
    throw Error(fmt::format("{}={} must have 3 entries for {} (streams t, h, w)", section_name,
                            section ? describe(*section) : std::string("?"), to_string(spec.stream_layout)));
  }
}

// ---- which decoder layers apply `spec` ----

// Model types whose config class builds no_rope_layers when config.json leaves it out or empty:
// [int((i + 1) % no_rope_layer_interval != 0) for i in range(num_hidden_layers)]
// (models/llama4/configuration_llama4.py, models/smollm3/configuration_smollm3.py).
bool builds_default_nope_layers(const std::string& type) {
  return type == "llama4" || type == "llama4_text" || type == "smollm3";
}

// The number of decoder layers: num_hidden_layers, or when the config lacks it the length of the
// per-layer list `list` (layer_types, no_rope_layers) that asked.
int64_t layer_count(const std::optional<int64_t>& num_hidden_layers, size_t list_size, std::string_view list) {
  if (num_hidden_layers) {
    const int64_t n = *num_hidden_layers;
    if (n < 1 || n > kMaxLayers) throw Error(fmt::format("num_hidden_layers={} must be in [1, 2^20]", n));
    return n;
  }
  if (list_size < 1) {
    throw Error(fmt::format("num_hidden_layers is missing and {} is empty: the number of layers is unknown", list));
  }
  if (list_size > static_cast<size_t>(kMaxLayers)) {
    throw Error(fmt::format("{} has {} values (num_hidden_layers is missing): at most 2^20 layers", list, list_size));
  }
  return static_cast<int64_t>(list_size);
}

// Per layer: does it apply RoPE at all (no_rope_layers, 1 = RoPE)? Empty when every layer does.
std::vector<bool> nope_mask(const json& config, const std::string& type, ModelRope& out) {
  const auto num_hidden_layers = opt_integer(config, "num_hidden_layers", "");
  const json* list = find(config, "no_rope_layers");
  if (list && !list->is_array()) {
    throw Error(fmt::format("no_rope_layers={} must be a list of 0/1", describe(*list)));
  }
  std::vector<bool> mask;
  if (list && !list->empty()) {
    const int64_t n = layer_count(num_hidden_layers, list->size(), "no_rope_layers");
    if (list->size() < static_cast<size_t>(n)) {
      throw Error(fmt::format("no_rope_layers has {} values but num_hidden_layers={}", list->size(), n));
    }
    mask.resize(static_cast<size_t>(n));
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = truthy((*list)[i], fmt::format("no_rope_layers[{}]", i));
  } else if (builds_default_nope_layers(type)) {
    const int64_t interval = opt_integer(config, "no_rope_layer_interval", "").value_or(4);
    if (interval < 1) throw Error(fmt::format("no_rope_layer_interval={} must be >= 1", interval));
    if (!num_hidden_layers) {
      out.notes.push_back(fmt::format("every {}th layer of model_type {} applies no RoPE, but num_hidden_layers "
                                      "is missing: rope_layers is left empty",
                                      interval, type));
      return {};
    }
    mask.resize(static_cast<size_t>(layer_count(num_hidden_layers, 0, "no_rope_layers")));
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = (static_cast<int64_t>(i) + 1) % interval != 0;
  }
  return mask;
}

// layer_types entries of layers without attention, so without RoPE: transformers names every
// recurrent mixer "linear_attention" (Qwen3-Next's and Qwen3.5's Gated DeltaNet, Mamba, MiniMax's
// lightning attention; configuration_utils.py remaps the legacy "mamba" to it) and LFM2's short
// convolutions "conv". Their decoder layers never read position_embeddings.
bool is_mixer_without_rope(std::string_view layer_type) {
  return layer_type == "linear_attention" || layer_type == "mamba" || layer_type == "conv";
}

// layer_types as the config class builds it when config.json has none, or null when it does not:
//  - Qwen3-Next, Qwen3.5 (Qwen3NextConfig, Qwen3_5TextConfig, Qwen3_5MoeTextConfig): layer i is
//    linear_attention unless (i + 1) % full_attention_interval == 0 (default 4);
//  - Bamba (BambaConfig.layers_block_type): full_attention at attn_layer_indices, else linear_attention;
//  - RecurrentGemma (RecurrentGemmaConfig.layers_block_type): block_types (default recurrent,
//    recurrent, attention) repeated, recurrent meaning linear_attention;
//  - Bamba, Zamba2 (attribute_map) and GraniteMoeHybrid also read the key layers_block_type.
json built_layer_types(const json& config, const std::string& type) {
  if (const json* block_types = find(config, "layers_block_type")) return *block_types;
  const bool interval = type == "qwen3_next" || type == "qwen3_5" || type == "qwen3_5_text" ||
                        type == "qwen3_5_moe" || type == "qwen3_5_moe_text";
  if (!interval && type != "bamba" && type != "recurrent_gemma") return nullptr;
  const auto num_hidden_layers = opt_integer(config, "num_hidden_layers", "");
  if (!num_hidden_layers) return nullptr;
  const int64_t n = layer_count(num_hidden_layers, 0, "layer_types");
  json types = json::array();
  if (interval) {
    const int64_t every = opt_integer(config, "full_attention_interval", "").value_or(4);
    if (every < 1) throw Error(fmt::format("full_attention_interval={} must be >= 1", every));
    for (int64_t i = 0; i < n; ++i) types.push_back((i + 1) % every != 0 ? "linear_attention" : "full_attention");
  } else if (type == "bamba") {
    std::vector<bool> attends(static_cast<size_t>(n), false);
    if (const json* list = find(config, "attn_layer_indices"); list && !list->is_null()) {
      if (!list->is_array()) {
        throw Error(fmt::format("attn_layer_indices={} must be a list of layer indices", describe(*list)));
      }
      for (const json& i : *list) {
        if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= n) {
          throw Error(fmt::format("attn_layer_indices holds {}, not a layer index in [0, {})", describe(i), n));
        }
        attends[static_cast<size_t>(i.get<int64_t>())] = true;
      }
    }
    for (const bool a : attends) types.push_back(a ? "full_attention" : "linear_attention");
  } else {  // recurrent_gemma
    const json* blocks = find(config, "block_types");
    const json fallback = json::array({"recurrent", "recurrent", "attention"});
    const json& cycle = blocks ? *blocks : fallback;
    if (!cycle.is_array() || cycle.empty()) {
      throw Error(fmt::format("block_types={} must be a non-empty list", describe(cycle)));
    }
    for (int64_t i = 0; i < n; ++i) {
      const json& b = cycle[static_cast<size_t>(i) % cycle.size()];
      types.push_back(b == "recurrent" ? "linear_attention" : "sliding_attention");
    }
  }
  return types;
}

// Per layer: does it attend at all (false for the mixers above)? Empty when layer_types is absent
// or names no such mixer. Hybrid models (Qwen3-Next, Qwen3.5) share one RoPE among their attention
// layers, so layer_types names no RoPE layer type and type_mask leaves them unmarked.
std::vector<bool> attention_mask(const json& config, const std::string& type, std::vector<int64_t>& mixers) {
  const json* types = find(config, "layer_types");
  json built;
  if (!types) {  // absent or null: the config class builds it
    built = built_layer_types(config, type);
    types = &built;
  }
  if (!types || !types->is_array()) return {};  // type_mask checks it where it names RoPE types
  const int64_t n = layer_count(opt_integer(config, "num_hidden_layers", ""), types->size(), "layer_types");
  if (types->size() < static_cast<size_t>(n)) {
    throw Error(fmt::format("layer_types has {} values but num_hidden_layers={}", types->size(), n));
  }
  std::vector<bool> mask(static_cast<size_t>(n), true);
  for (size_t i = 0; i < mask.size(); ++i) {
    const json& t = (*types)[i];
    if (!t.is_string()) throw Error(fmt::format("layer_types[{}]={} must be a string", i, describe(t)));
    if (is_mixer_without_rope(t.get_ref<const std::string&>())) {
      mask[i] = false;
      mixers.push_back(static_cast<int64_t>(i));
    }
  }
  if (mixers.empty()) return {};
  return mask;
}

// Llama 4 scales the queries of its NoPE layers (Llama4TextAttention, attn_temperature_tuning).
void note_query_temperature(const json& config, const std::string& type, int64_t nope_layers,
                            ModelRope& out) {
  if (type != "llama4" && type != "llama4_text") return;
  const json* tuning = find(config, "attn_temperature_tuning");
  if (tuning && !truthy(*tuning, "attn_temperature_tuning")) return;
  const double floor_scale = opt_number(config, "floor_scale", "").value_or(8192.0);
  const double attn_scale = opt_number(config, "attn_scale", "").value_or(0.1);
  out.notes.push_back(fmt::format(
      "on its {} layers without RoPE, Llama 4 multiplies queries by log1p(floor((p + 1) / floor_scale)) * "
      "attn_scale + 1 at position p (floor_scale={}, attn_scale={}; transformers' Llama4TextAttention, "
      "attn_temperature_tuning): a scale outside RoPE, which rotary does not apply",
      nope_layers, floor_scale, attn_scale));
}

// Gemma 3 configs without layer_types: layer i slides unless (i + 1) % sliding_window_pattern == 0
// (transformers' Gemma3TextConfig builds layer_types so). Empty when the config does not say.
std::vector<bool> full_attention_by_pattern(const json& config) {
  const auto pattern = opt_integer(config, "sliding_window_pattern", "");
  const auto num_hidden_layers = opt_integer(config, "num_hidden_layers", "");
  if (!pattern || !num_hidden_layers) return {};
  if (*pattern < 1) throw Error(fmt::format("sliding_window_pattern={} must be >= 1", *pattern));
  std::vector<bool> mask(static_cast<size_t>(layer_count(num_hidden_layers, 0, "sliding_window_pattern")));
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = (static_cast<int64_t>(i) + 1) % *pattern == 0;
  return mask;
}

// Per layer: is it of the RoPE layer type `spec` describes? Empty when every layer shares one RoPE,
// or when the config does not say which layer is of which type. DeepSeek-V4 keys its RoPE by label:
// main on the sliding_attention layers, compress on the layers with a compressor.
std::vector<bool> type_mask(const Source& src, const std::string& model_type) {
  if (!src.per_layer) return {};
  const json& config = *src.config;
  const json* types = find(config, "layer_types");
  if (!types) {
    if (src.layer_type != "full_attention" && src.layer_type != "sliding_attention") return {};
    std::vector<bool> mask = full_attention_by_pattern(config);
    if (src.layer_type == "sliding_attention") mask.flip();
    return mask;
  }
  if (!types->is_array()) throw Error(fmt::format("layer_types={} must be a list of strings", describe(*types)));
  const int64_t n = layer_count(opt_integer(config, "num_hidden_layers", ""), types->size(), "layer_types");
  if (types->size() < static_cast<size_t>(n)) {
    throw Error(fmt::format("layer_types has {} values but num_hidden_layers={}", types->size(), n));
  }
  std::vector<bool> mask(static_cast<size_t>(n));
  for (size_t i = 0; i < mask.size(); ++i) {
    const json& t = (*types)[i];
    if (!t.is_string()) throw Error(fmt::format("layer_types[{}]={} must be a string", i, describe(t)));
    const std::string& name = t.get_ref<const std::string&>();
    mask[i] = is_deepseek_v4(model_type) ? (name == "sliding_attention") == (src.layer_type == "main")
                                         : name == src.layer_type;
  }
  return mask;
}

// "3, 7, 11" for a note: the first 16 layer indices, then "...".
std::string first_layers(const std::vector<int64_t>& layers) {
  std::string listed;
  for (size_t i = 0; i < layers.size() && i < 16; ++i) listed += fmt::format("{}{}", i ? ", " : "", layers[i]);
  return layers.size() > 16 ? listed + ", ..." : listed;
}

void read_layers(const Source& src, ModelRope& out) {
  const json& config = *src.config;
  // Gemma 3 (v4 configs): the sliding_attention layers' base is rope_local_base_freq.
  const bool gemma3_v4 = src.per_layer && src.rope_name.rfind("rope_parameters.", 0) != 0;
  if (auto local_base = opt_number(config, "rope_local_base_freq", "");
      local_base && gemma3_v4 && src.layer_type == "full_attention") {
    out.notes.push_back(fmt::format(
        "sliding_attention layers rotate with base rope_local_base_freq={} and the default schedule; spec "
        "describes the full_attention layers (rope_layers marks them when layer_types or "
        "sliding_window_pattern says which)",
        *local_base));
  }
  const std::vector<bool> rope = nope_mask(config, out.model_type, out);
  const std::vector<bool> typed = type_mask(src, out.model_type);
  std::vector<int64_t> mixers;
  const std::vector<bool> attends = attention_mask(config, out.model_type, mixers);
  std::vector<int64_t> nope;
  for (size_t i = 0; i < rope.size(); ++i) {
    if (!rope[i]) nope.push_back(static_cast<int64_t>(i));
  }
  if (!nope.empty()) {
    out.notes.push_back(fmt::format("{} of {} layers apply no RoPE (no_rope_layers: 1 = RoPE): {}", nope.size(),
                                    rope.size(), first_layers(nope)));
    note_query_temperature(config, out.model_type, static_cast<int64_t>(nope.size()), out);
  }
  if (!mixers.empty()) {
    out.notes.push_back(fmt::format("{} of {} layers are recurrent or convolutional (layer_types linear_attention, "
                                    "mamba or conv) and apply no RoPE: {}",
                                    mixers.size(), attends.size(), first_layers(mixers)));
  }
  const size_t n = std::max({rope.size(), typed.size(), attends.size()});
  std::vector<bool> layers(n, true);
  bool all = true;
  for (size_t i = 0; i < n; ++i) {
    layers[i] = (i >= rope.size() || rope[i]) && (i >= typed.size() || typed[i]) &&
                (i >= attends.size() || attends[i]);
    all = all && layers[i];
  }
  if (!all) out.rope_layers = std::move(layers);
}

// Gemma 4: the full_attention layers use global_head_dim (Gemma4TextConfig: default 512, handed to
// those layers by per_layer_config), and num_global_key_value_heads when attention_k_eq_v.
void read_global_head(const Source& src, ModelRope& out) {
  const json& config = *src.config;
  const bool gemma4 = out.model_type == "gemma4" || out.model_type == "gemma4_text";
  if (!src.per_layer || src.layer_type != "full_attention" || (!gemma4 && !find(config, "global_head_dim"))) return;
  const int64_t head_dim = opt_integer(config, "global_head_dim", "").value_or(512);
  if (head_dim <= 0) throw Error(fmt::format("global_head_dim={} must be > 0", head_dim));
  out.spec.head_dim = head_dim;
  if (boolean(config, "attention_k_eq_v", "", false)) {
    if (auto kv = opt_integer(config, "num_global_key_value_heads", "")) {
      if (*kv <= 0 || out.num_attention_heads % *kv != 0) {
        throw Error(fmt::format("num_global_key_value_heads={} must divide num_attention_heads={}", *kv,
                                out.num_attention_heads));
      }
      out.num_key_value_heads = *kv;
    }
  }
  out.notes.push_back(fmt::format("the full_attention layers use global_head_dim={}", head_dim));
}

void validate_resolved(const ModelRope& out) {
  try {
    validate(out.spec);
  } catch (const Error& e) {
    throw Error(fmt::format("config resolves to an invalid RoPE spec: {}", e.what()));
  }
}

ModelRope resolve_text(const json& root, const ReadOptions& options) {
  Source src;
  src.config = &language_model(root);
  ModelRope out;
  read_model_type(root, src, out);
  require_rope_switched_on(src, out);
  read_attention_shape(src, out);
  select_rope(*src.config, options.layer_type, src, out);
  read_global_head(src, out);
  refuse_unknown_interleave(src);
  const std::string rope_type = read_rope_type(src, out.model_type);
  const detail::ScheduleEntry* schedule = detail::find_rope_type(rope_type);
  read_dims(src, schedule, out);
  read_streams(src, out);
  read_pairing(src, out);
  read_schedule(src, schedule, rope_type, out);
  read_layers(src, out);
  validate_resolved(out);
  return out;
}

// ---- vision towers ----

// One vision tower's RoPE, from its modeling code.
struct VisionTower {
  std::string_view model_type;   // vision_config's model_type (less "_vision"), or the wrapper's
  std::string_view source;       // what its modeling code does
  std::string_view width_key;    // vision_config key of the width split over the heads
  std::string_view heads_key;    // vision_config key of the head count
  StreamLayout layout;
  Pairing pairing;
  int64_t blocks;
  double default_base;           // its base when vision_config gives no rope_theta
  std::string_view positions;    // what the two streams hold
};

constexpr std::string_view kQwenViT =
    "VisionRotaryEmbedding(head_dim // 2): freqs of (h, w) concatenated, cos = cat(freqs, freqs), rotate_half";
constexpr std::string_view kRowColumn = "stream 0 is the patch row (h), stream 1 its column (w), from 0";

// Sorted by model_type.
constexpr std::array kVisionTowers = {
    VisionTower{"gemma4_vision",
                "apply_multidimensional_rope: the head split in 2 blocks, rotate_half inside each, block a turned "
                "by position a at rope_theta^(-2k/(head_dim/2))",
                "head_dim", "num_attention_heads", StreamLayout::axial, Pairing::half, 2, 100.0,
                "stream 0 is the patch x (column), stream 1 its y (row)"},
    VisionTower{"glm4v", kQwenViT, "hidden_size", "num_heads", StreamLayout::axial, Pairing::half, 1, 10000.0,
                kRowColumn},
    VisionTower{"llama4_vision_model",
                "Llama4VisionRotaryEmbedding: (x + 1, y + 1) times rope_theta^(-2k/(head_dim/2)), complex pairs, "
                "the CLS token's angle 0",
                "hidden_size", "num_attention_heads", StreamLayout::axial, Pairing::interleaved, 1, 10000.0,
                "stream 0 is the patch column + 1 (x), stream 1 its row + 1 (y): positions are 1-based, and the "
                "CLS token (last) takes position 0 in both (angle 0)"},
    VisionTower{"pixtral",
                "PixtralRotaryEmbedding: freqs = rope_theta^(-2i/head_dim), h takes freqs[::2], w freqs[1::2], "
                "cos = cat(freqs, freqs), rotate_half",
                "hidden_size", "num_attention_heads", StreamLayout::axial_even_odd, Pairing::half, 1, 10000.0,
                kRowColumn},
    VisionTower{"qwen2_5_vl", kQwenViT, "hidden_size", "num_heads", StreamLayout::axial, Pairing::half, 1, 10000.0,
                kRowColumn},
    VisionTower{"qwen2_vl", kQwenViT, "embed_dim", "num_heads", StreamLayout::axial, Pairing::half, 1, 10000.0,
                kRowColumn},
    // Qwen3.5's published vision_config names the wrapper's type, qwen3_5 (transformers renames it
    // qwen3_5_vision); Qwen3_5VisionRotaryEmbedding and Qwen3_5MoeVisionRotaryEmbedding are Qwen3-VL's.
    VisionTower{"qwen3_5", kQwenViT, "hidden_size", "num_heads", StreamLayout::axial, Pairing::half, 1, 10000.0,
                kRowColumn},
    VisionTower{"qwen3_5_moe", kQwenViT, "hidden_size", "num_heads", StreamLayout::axial, Pairing::half, 1,
                10000.0, kRowColumn},
    VisionTower{"qwen3_vl", kQwenViT, "hidden_size", "num_heads", StreamLayout::axial, Pairing::half, 1, 10000.0,
                kRowColumn},
    VisionTower{"qwen3_vl_moe", kQwenViT, "hidden_size", "num_heads", StreamLayout::axial, Pairing::half, 1,
                10000.0, kRowColumn},
};

// vision_config's model_type, less the "_vision" suffix transformers gives some; the wrapper's when
// vision_config has none (Qwen2-VL, Llama 4 and Gemma 4 configs write one; older ones may not).
std::string vision_type_of(const json& vision, const std::string& outer) {
  std::string inner = text(vision, "model_type", "vision_config.");
  if (inner.ends_with("_vision") && inner != "gemma4_vision") inner.resize(inner.size() - 7);
  if (!inner.empty()) return inner;
  if (outer == "llama4") return "llama4_vision_model";
  if (outer == "gemma4") return "gemma4_vision";
  if (outer == "glm4v_moe") return "glm4v";
  return outer;
}

ModelRope vision_rope(const json& vision, const VisionTower& tower, const std::string& outer) {
  const std::string p = "vision_config.";
  ModelRope out;
  out.model_type = outer.empty() ? std::string(tower.model_type) : outer;
  out.vision = true;
  const auto heads = opt_integer(vision, tower.heads_key, p);
  if (!heads || *heads <= 0) throw Error(fmt::format("{}{} is missing or not > 0", p, tower.heads_key));
  out.num_attention_heads = out.num_key_value_heads = *heads;
  int64_t head_dim = 0;
  if (tower.width_key == "head_dim") {
    head_dim = opt_integer(vision, "head_dim", p).value_or(64);  // Gemma4VisionConfig default
  } else if (auto hd = opt_integer(vision, "head_dim", p); hd && tower.layout == StreamLayout::axial_even_odd) {
    head_dim = *hd;
  } else {
    const auto width = opt_integer(vision, tower.width_key, p);
    if (!width) throw Error(fmt::format("{}{} is missing (head_dim = it / {})", p, tower.width_key, tower.heads_key));
    head_dim = *width / *heads;
  }
  if (head_dim < 4 || (tower.blocks == 1 && head_dim % 4 != 0)) {
    throw Error(fmt::format("vision head_dim={} must be a multiple of 4 (two axes of pairs)", head_dim));
  }
  const json* rope = find(vision, "rope_parameters");
  double base = opt_number(vision, "rope_theta", p).value_or(tower.default_base);
  if (rope && rope->is_object()) base = opt_number(*rope, "rope_theta", p + "rope_parameters.").value_or(base);
  Spec& spec = out.spec;
  spec.head_dim = head_dim;
  spec.rotary_dim = 4 * (head_dim / 4);  // Gemma 4: leftover channels pass through
  spec.base = base;
  spec.pairing = tower.pairing;
  spec.blocks = tower.blocks;
  spec.stream_layout = tower.layout;
  spec.sections = {head_dim / 4, head_dim / 4};
  out.notes.push_back(fmt::format("vision tower ({}): {}; {}", tower.model_type, tower.source, tower.positions));
  validate_resolved(out);
  return out;
}

ModelRope resolve_vision(const json& root, const ReadOptions& options) {
  const std::string outer = text(root, "model_type", "");
  const json* vision = find(root, "vision_config");
  if (!vision) {
    throw Error(fmt::format("config (model_type '{}') has no vision_config: no vision tower to resolve",
                            excerpt(outer)));
  }
  if (!vision->is_object()) throw Error(fmt::format("vision_config={} must be an object", describe(*vision)));
  if (!options.layer_type.empty() && options.layer_type != default_layer_type) {
    throw Error(fmt::format("layer_type '{}' is not a RoPE layer type of the vision tower (known: {})",
                            excerpt(options.layer_type), default_layer_type));
  }
  const std::string type = vision_type_of(*vision, outer);
  const auto tower = std::find_if(kVisionTowers.begin(), kVisionTowers.end(),
                                  [&](const VisionTower& t) { return t.model_type == type; });
  if (tower == kVisionTowers.end()) {
    throw Error(fmt::format("vision_config of model_type '{}' (vision model_type '{}'): rotary does not know this "
                            "vision tower's RoPE",
                            excerpt(outer), excerpt(type)));
  }
  return vision_rope(*vision, *tower, outer);
}

ModelRope resolve(const json& root, const ReadOptions& options) {
  if (!root.is_object()) throw Error("config must be a JSON object");
  return options.vision ? resolve_vision(root, options) : resolve_text(root, options);
}

// At most max_config_bytes from any file: /dev/zero and FIFOs have no size to check first.
std::string read_capped(const std::string& path, const std::string& shown) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(status)) throw Error(fmt::format("config '{}' is a directory", shown));
  const auto too_large = [&] {
    return Error(fmt::format("config '{}' is larger than {} bytes (16 MiB), the most rotary reads", shown,
                             max_config_bytes));
  };
  if (std::filesystem::is_regular_file(status)) {
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec && size > max_config_bytes) throw too_large();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("config '{}' cannot be read", shown));
  std::string text;
  std::vector<char> chunk(size_t{1} << 16);
  while (in && text.size() <= max_config_bytes) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    text.append(chunk.data(), static_cast<size_t>(in.gcount()));
  }
  if (text.size() > max_config_bytes) throw too_large();
  if (in.bad()) throw Error(fmt::format("config '{}' cannot be read", shown));
  return text;
}

}  // namespace

ModelRope read_hf_config(std::string_view json_text, const ReadOptions& options) {
  return resolve(detail::parse_json(json_text, "config"), options);
}

ModelRope read_hf_config_file(const std::string& path, const ReadOptions& options) {
  const std::string shown = excerpt(path);
  const std::string text = read_capped(path, shown);
  try {
    return read_hf_config(text, options);
  } catch (const Error& e) {
    throw Error(fmt::format("config '{}': {}", shown, e.what()));
  }
}

std::vector<std::string> layer_types(std::string_view json_text) {
  const json root = detail::parse_json(json_text, "config");
  if (!root.is_object()) throw Error("config must be a JSON object");
  const json& config = language_model(root);
  Source src;
  src.config = &config;
  ModelRope out;
  read_model_type(root, src, out);
  return names_of(rope_types(config, out.model_type));
}

ContextLength context_length(const Spec& spec, int64_t max_position_embeddings) {
  if (spec.schedule == ScheduleType::monotone) return {spec.max_length.value_or(0), "max_length"};
  const int64_t original = spec.original_length();
  const int64_t stated = std::max(max_position_embeddings, spec.max_position.value_or(0));
  const bool stretches = spec.schedule == ScheduleType::yarn || spec.schedule == ScheduleType::llama3;
  if (stretches && spec.factor && *spec.factor > 1 && original > 0 && stated <= original) {
    constexpr double longest = 0x1p62;  // far beyond max_position_limit, and an exact int64
    const double length = std::min(std::floor(*spec.factor * static_cast<double>(original)), longest);
    return {static_cast<int64_t>(length), fmt::format("factor {} x original length {}", *spec.factor, original)};
  }
  const int64_t length = std::max(stated, original);
  if (length == max_position_embeddings) return {length, "max_position_embeddings"};
  return {length, length == spec.max_position ? "max_position" : "original length"};
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& preset : detail::presets()) names.emplace_back(preset.name);
  return names;
}

std::string preset_text(std::string_view name) {
  for (const auto& preset : detail::presets()) {
    if (preset.name == name) return std::string(preset.text);
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(fmt::format("preset '{}' is unknown (known: {})", excerpt(name), known));
}

std::string preset_config(std::string_view name) {
  return detail::parse_json(preset_text(name), "preset").at("config").dump();  // our own file, not user data
}

ModelRope load_preset(std::string_view name, const ReadOptions& options) {
  const json file = detail::parse_json(preset_text(name), "preset");
  return resolve(file.at("config"), options);
}

}  // namespace rotary
