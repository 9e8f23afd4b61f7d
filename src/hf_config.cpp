#include "rotary/hf_config.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "json_parse.hpp"
#include "model_types.hpp"
#include "presets.hpp"
#include "rotary/error.hpp"
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
  // Integers may be written as 4096 or 4096.0 (both appear in real configs).
  const double d = number(*v, name_of(prefix, key));
  if (d != std::floor(d) || std::fabs(d) > 9.0e15) {
    throw Error(fmt::format("{}{}={} must be an integer", prefix, key, describe(*v)));
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
  const json* rope = &empty_object();        // rope_parameters (or one layer type's entry), rope_scaling
  std::string rope_name = "rope_scaling";    // how errors name `rope`
  std::string layer_type;                    // the layer type `spec` describes, when types differ
  const detail::ModelTypeRope* entry = nullptr;  // the model type's row, null when unknown
  const detail::ModelTypeRope* multimodal = nullptr;  // a row whose decoder takes several streams
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

// After refuse_unimplemented, so that a config naming its M-RoPE fields is refused by the field.
void refuse_multimodal(const Source& src) {
  if (!src.multimodal) return;
  throw Error(fmt::format("model_type '{}' rotates several position streams per token (multimodal RoPE), "
                          "which rotary does not implement yet",
                          src.multimodal->model_type));
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

// A flat rope dict holds strings, numbers, lists and booleans; one per layer type holds objects.
bool per_layer_type(const json& parameters) {
  for (const auto& item : parameters.items()) {
    if (item.value().is_object()) return true;
  }
  return false;
}

// rope_parameters per layer type (Gemma 3 in transformers v5): the full_attention entry, or the
// only one; the others are left to the note.
void select_layer_type(const json& parameters, Source& src, ModelRope& out) {
  for (const auto& item : parameters.items()) {
    if (!item.value().is_object()) {
      throw Error(fmt::format("rope_parameters.{}={} must be an object: the other entries make "
                              "rope_parameters per layer type",
                              excerpt(item.key()), describe(item.value())));
    }
  }
  auto chosen = parameters.find("full_attention");
  if (chosen == parameters.end()) {
    if (parameters.size() != 1) {
      throw Error(fmt::format("rope_parameters is per layer type ({} types) without a full_attention "
                              "entry; rotary resolves the full_attention layers' RoPE",
                              parameters.size()));
    }
    chosen = parameters.begin();
  }
  src.rope = &*chosen;
  src.layer_type = chosen.key();
  src.rope_name = "rope_parameters." + excerpt(chosen.key());
  if (parameters.size() > 1) {
    out.notes.push_back(fmt::format(
        "rope_parameters is per layer type: spec describes the {} layers (rope_layers marks them when "
        "layer_types lists them); the {} other layer type(s) have their own RoPE settings, not resolved",
        excerpt(src.layer_type), parameters.size() - 1));
  }
}

// v5 rope_parameters, else v4 rope_scaling.
void select_rope(Source& src, ModelRope& out) {
  const json& config = *src.config;
  if (const json* parameters = find(config, "rope_parameters")) {
    if (!parameters->is_object()) {
      throw Error(fmt::format("rope_parameters={} must be an object or null", describe(*parameters)));
    }
    if (per_layer_type(*parameters)) {
      select_layer_type(*parameters, src, out);
    } else {
      src.rope = parameters;
      src.rope_name = "rope_parameters";
    }
  } else if (const json* scaling = find(config, "rope_scaling")) {
    if (!scaling->is_object()) {
      throw Error(fmt::format("rope_scaling={} must be an object or null", describe(*scaling)));
    }
    src.rope = scaling;
  }
}

// RoPE fields whose meaning is known but which rotary does not implement yet: an error naming the
// field, never a silent drop.
struct Unimplemented {
  std::string_view key;
  std::string_view what;
};
constexpr std::array kUnimplemented = {
    Unimplemented{"mrope_section",
                  "multimodal RoPE, several position streams per token (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V)"},
    Unimplemented{"mrope_interleaved", "interleaved multimodal RoPE (Qwen3-VL)"},
    Unimplemented{"rope_3d", "3-D multimodal RoPE (ERNIE-4.5-VL)"},
};

void refuse_unimplemented(const Source& src) {
  const std::string rope_prefix = src.rope_name + ".";
  for (const auto& [object, prefix] : {std::pair{src.rope, std::string_view(rope_prefix)},
                                       std::pair{src.config, std::string_view()}}) {
    for (const Unimplemented& field : kUnimplemented) {
      const json* v = find(*object, field.key);
      if (!v || (v->is_boolean() && !v->get<bool>())) continue;
      throw Error(fmt::format("{}{}={} asks for {}, which rotary does not implement yet", prefix,
                              field.key, describe(*v), field.what));
    }
  }
  // DeepSeek-V3 reads rope_interleave; on a model type rotary does not know, what it selects is unknown.
  if (const json* v = find(*src.config, "rope_interleave"); v && !src.entry) {
    throw Error(fmt::format("rope_interleave={} on a model type rotary does not know: which pairing it "
                            "selects depends on the model's code",
                            describe(*v)));
  }
}

void read_dims(const Source& src, ModelRope& out) {
  const json& config = *src.config;
  const json& rope = *src.rope;
  const std::string p = src.rope_name + ".";
  const std::string& type = out.model_type;
  const bool neox = type == "gpt_neox";

  double base = 10000.0;
  if (neox) base = opt_number(config, "rotary_emb_base", "").value_or(base);
  if (auto theta = opt_number(config, "rope_theta", "")) base = *theta;
  if (auto theta = opt_number(rope, "rope_theta", p)) base = *theta;

  double partial = 1.0;
  if (type == "phi") partial = 0.5;
  if (neox) partial = opt_number(config, "rotary_pct", "").value_or(0.25);
  if (auto f = opt_number(config, "partial_rotary_factor", "")) partial = *f;
  if (auto f = opt_number(rope, "partial_rotary_factor", p)) partial = *f;
  if (partial <= 0 || partial > 1) {
    throw Error(fmt::format("partial_rotary_factor={} must be in (0, 1]", partial));
  }
  const int64_t head_dim = out.spec.head_dim;
  int64_t rotary_dim = static_cast<int64_t>(static_cast<double>(head_dim) * partial);  // Python int()
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
    // [nope | rope]: the rotated slice is the last rotary_dim channels, a head of its own for rotary.
    out.notes.push_back(fmt::format("model_type '{}' rotates the last {} of the {} channels of each head: spec "
                                    "describes that trailing slice as a head of its own (head_dim {}): rotate "
                                    "a view of channels {} to {}",
                                    excerpt(out.model_type), rotary_dim, head_dim, rotary_dim,
                                    head_dim - rotary_dim, head_dim - 1));
    out.spec.head_dim = rotary_dim;
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

std::string read_rope_type(const Source& src, const std::string& type) {
  const std::string p = src.rope_name + ".";
  std::string rope_type = text(*src.rope, "rope_type", p);
  const std::string legacy_type = text(*src.rope, "type", p);
  if (rope_type.empty()) rope_type = legacy_type;
  if (rope_type.empty()) rope_type = "default";
  if (type.rfind("phi3", 0) == 0 && (legacy_type == "su" || legacy_type == "yarn")) rope_type = "longrope";
  if (rope_type == "su") rope_type = "longrope";
  if (rope_type == "mrope") {
    throw Error(fmt::format("{}rope_type='mrope' asks for {}, which rotary does not implement yet", p,
                            kUnimplemented[0].what));
  }
  return rope_type;
}

int64_t need_max_position(const ModelRope& out, const char* why) {
  if (out.max_position_embeddings <= 0) {
    throw Error(fmt::format("max_position_embeddings is missing ({} needs it)", why));
  }
  return out.max_position_embeddings;
}

void read_yarn(const json& rope, const std::string& p, ModelRope& out) {
  Spec& spec = out.spec;
  const int64_t max_pos = need_max_position(out, "yarn");
  const auto original = opt_integer(rope, "original_max_position_embeddings", p);
  spec.original_max_position = original.value_or(max_pos);
  spec.factor = opt_number(rope, "factor", p);
  if (original) {
    const double implicit = static_cast<double>(max_pos) / static_cast<double>(*original);
    if (!spec.factor) {
      spec.factor = implicit;
    } else if (*spec.factor != implicit) {
      out.notes.push_back(fmt::format(
          "explicit factor {} differs from max_position_embeddings/original_max_position_embeddings = {}; "
          "the explicit factor is used (transformers >= 4.56, PR #40320; earlier versions used the ratio)",
          *spec.factor, implicit));
    }
  }
  if (!spec.factor) throw Error(fmt::format("{}factor is required for rope_type yarn", p));
  // transformers: `beta_fast or 32` — a zero counts as absent.
  if (auto v = opt_number(rope, "beta_fast", p); v && *v != 0) spec.beta_fast = *v;
  if (auto v = opt_number(rope, "beta_slow", p); v && *v != 0) spec.beta_slow = *v;
  spec.mscale = opt_number(rope, "mscale", p);
  spec.mscale_all_dim = opt_number(rope, "mscale_all_dim", p);
  if (find(rope, "truncate")) spec.truncate = boolean(rope, "truncate", p, true);
  spec.attention_factor = opt_number(rope, "attention_factor", p);
}

void read_longrope(const json& config, const json& rope, const std::string& p, ModelRope& out) {
  Spec& spec = out.spec;
  const int64_t max_pos = need_max_position(out, "longrope");
  spec.short_factor = number_list(rope, "short_factor", p);
  spec.long_factor = number_list(rope, "long_factor", p);
  if (spec.short_factor.empty()) throw Error(fmt::format("{}short_factor is required for longrope", p));
  if (spec.long_factor.empty()) throw Error(fmt::format("{}long_factor is required for longrope", p));
  spec.attention_factor = opt_number(rope, "attention_factor", p);
  // LongRoPE reads the original length from the top level (Phi-3).
  if (auto original = opt_integer(config, "original_max_position_embeddings", "")) {
    spec.original_max_position = *original;
    spec.max_position = max_pos;
  } else {
    spec.original_max_position = max_pos;
    const auto factor = opt_number(rope, "factor", p);
    if (!spec.attention_factor && factor && *factor > 1.0) {
      spec.attention_factor = std::sqrt(1.0 + std::log(*factor) / std::log(static_cast<double>(max_pos)));
    }
  }
}

void read_llama3(const json& rope, const std::string& p, ModelRope& out) {
  Spec& spec = out.spec;
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    if (!find(rope, key)) throw Error(fmt::format("{}{} is required for rope_type llama3", p, key));
  }
  spec.factor = opt_number(rope, "factor", p);
  spec.low_freq_factor = opt_number(rope, "low_freq_factor", p);
  spec.high_freq_factor = opt_number(rope, "high_freq_factor", p);
  spec.original_max_position = opt_integer(rope, "original_max_position_embeddings", p);
}

void read_schedule(const Source& src, ModelRope& out) {
  const json& rope = *src.rope;
  const std::string p = src.rope_name + ".";
  const std::string rope_type = read_rope_type(src, out.model_type);
  Spec& spec = out.spec;
  if (rope_type == "default") {
    spec.schedule = ScheduleType::default_;
  } else if (rope_type == "linear" || rope_type == "dynamic") {
    spec.schedule = rope_type == "linear" ? ScheduleType::linear : ScheduleType::dynamic;
    spec.factor = opt_number(rope, "factor", p);
    if (!spec.factor) throw Error(fmt::format("{}factor is required for rope_type {}", p, rope_type));
    // transformers compares n with max_position_embeddings
    if (spec.schedule == ScheduleType::dynamic) spec.max_position = need_max_position(out, "dynamic");
  } else if (rope_type == "yarn") {
    spec.schedule = ScheduleType::yarn;
    read_yarn(rope, p, out);
  } else if (rope_type == "longrope") {
    spec.schedule = ScheduleType::longrope;
    read_longrope(*src.config, rope, p, out);
  } else if (rope_type == "llama3") {
    spec.schedule = ScheduleType::llama3;
    read_llama3(rope, p, out);
  } else {
    throw Error(fmt::format("{}rope_type='{}' is not supported (default, linear, dynamic, yarn, longrope, "
                            "llama3, su)",
                            p, excerpt(rope_type)));
  }
}

// ---- which decoder layers apply `spec` ----

// Model types whose config class builds no_rope_layers when config.json leaves it out or empty:
// [int((i + 1) % no_rope_layer_interval != 0) for i in range(num_hidden_layers)]
// (models/llama4/configuration_llama4.py, models/smollm3/configuration_smollm3.py).
bool builds_default_nope_layers(const std::string& type) {
  return type == "llama4" || type == "llama4_text" || type == "smollm3";
}

int64_t layer_count(const std::optional<int64_t>& num_hidden_layers, size_t list_size) {
  const int64_t n = num_hidden_layers ? *num_hidden_layers : static_cast<int64_t>(list_size);
  if (n < 1 || n > kMaxLayers) throw Error(fmt::format("num_hidden_layers={} must be in [1, 2^20]", n));
  return n;
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
    const int64_t n = layer_count(num_hidden_layers, list->size());
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
    mask.resize(static_cast<size_t>(layer_count(num_hidden_layers, 0)));
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = (static_cast<int64_t>(i) + 1) % interval != 0;
  }
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
  std::vector<bool> mask(static_cast<size_t>(layer_count(num_hidden_layers, 0)));
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = (static_cast<int64_t>(i) + 1) % *pattern == 0;
  return mask;
}

// Per layer: is it of the type `spec` describes (layer_types)? Empty when every layer is, or when the
// config does not list the types.
std::vector<bool> type_mask(const json& config, const std::string& spec_type) {
  const json* types = find(config, "layer_types");
  if (spec_type == "full_attention" && !types) return full_attention_by_pattern(config);
  if (spec_type.empty() || !types) return {};
  if (!types->is_array()) throw Error(fmt::format("layer_types={} must be a list of strings", describe(*types)));
  const int64_t n = layer_count(opt_integer(config, "num_hidden_layers", ""), types->size());
  if (types->size() < static_cast<size_t>(n)) {
    throw Error(fmt::format("layer_types has {} values but num_hidden_layers={}", types->size(), n));
  }
  std::vector<bool> mask(static_cast<size_t>(n));
  for (size_t i = 0; i < mask.size(); ++i) {
    const json& t = (*types)[i];
    if (!t.is_string()) throw Error(fmt::format("layer_types[{}]={} must be a string", i, describe(t)));
    mask[i] = t.get_ref<const std::string&>() == spec_type;
  }
  return mask;
}

void read_layers(const Source& src, ModelRope& out) {
  const json& config = *src.config;
  std::string spec_type = src.layer_type;
  // Gemma 3 (v4 configs): sliding_attention layers rotate with their own base, default schedule.
  if (auto local_base = opt_number(config, "rope_local_base_freq", ""); local_base && spec_type.empty()) {
    spec_type = "full_attention";
    out.notes.push_back(fmt::format(
        "sliding_attention layers rotate with base rope_local_base_freq={} and the default schedule; spec "
        "describes the full_attention layers (rope_layers marks them when layer_types or "
        "sliding_window_pattern says which)",
        *local_base));
  }
  const std::vector<bool> rope = nope_mask(config, out.model_type, out);
  const std::vector<bool> typed = type_mask(config, spec_type);
  int64_t nope_layers = 0;
  std::string listed;  // the first 16 layers without RoPE
  for (size_t i = 0; i < rope.size(); ++i) {
    if (rope[i]) continue;
    if (++nope_layers <= 16) listed += fmt::format("{}{}", listed.empty() ? "" : ", ", i);
  }
  if (nope_layers > 0) {
    out.notes.push_back(fmt::format("{} of {} layers apply no RoPE (no_rope_layers: 1 = RoPE): {}{}", nope_layers,
                                    rope.size(), listed, nope_layers > 16 ? ", ..." : ""));
    note_query_temperature(config, out.model_type, nope_layers, out);
  }
  const size_t n = std::max(rope.size(), typed.size());
  std::vector<bool> layers(n, true);
  bool all = true;
  for (size_t i = 0; i < n; ++i) {
    layers[i] = (i >= rope.size() || rope[i]) && (i >= typed.size() || typed[i]);
    all = all && layers[i];
  }
  if (!all) out.rope_layers = std::move(layers);
}

ModelRope resolve(const json& root) {
  if (!root.is_object()) throw Error("config must be a JSON object");
  Source src;
  src.config = &language_model(root);
  ModelRope out;
  read_model_type(root, src, out);
  require_rope_switched_on(src, out);
  read_attention_shape(src, out);
  select_rope(src, out);
  refuse_unimplemented(src);
  refuse_multimodal(src);
  read_dims(src, out);
  read_pairing(src, out);
  read_schedule(src, out);
  read_layers(src, out);
  try {
    validate(out.spec);
  } catch (const Error& e) {
    throw Error(fmt::format("config resolves to an invalid RoPE spec: {}", e.what()));
  }
  return out;
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

ModelRope read_hf_config(std::string_view json_text) {
  return resolve(detail::parse_json(json_text, "config"));
}

ModelRope read_hf_config_file(const std::string& path) {
  const std::string shown = excerpt(path);
  const std::string text = read_capped(path, shown);
  try {
    return read_hf_config(text);
  } catch (const Error& e) {
    throw Error(fmt::format("config '{}': {}", shown, e.what()));
  }
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

ModelRope load_preset(std::string_view name) {
  const json file = detail::parse_json(preset_text(name), "preset");
  return resolve(file.at("config"));
}

}  // namespace rotary
