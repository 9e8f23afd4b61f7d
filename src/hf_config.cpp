#include "rotary/hf_config.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "presets.hpp"
#include "rotary/error.hpp"

namespace rotary {
namespace {

using json = nlohmann::json;

// Typed access naming the key on error. A JSON null counts as absent (Python's None).
const json* find(const json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

double number(const json& v, const std::string& where) {
  if (!v.is_number()) throw Error(fmt::format("{}={} must be a number", where, v.dump()));
  const double d = v.get<double>();
  if (!std::isfinite(d)) throw Error(fmt::format("{}={} must be finite", where, v.dump()));
  return d;
}

std::optional<double> opt_number(const json& object, const char* key, const std::string& prefix) {
  const json* v = find(object, key);
  if (!v) return std::nullopt;
  return number(*v, prefix + key);
}

std::optional<int64_t> opt_integer(const json& object, const char* key, const std::string& prefix) {
  const json* v = find(object, key);
  if (!v) return std::nullopt;
  // Integers may be written as 4096 or 4096.0 (both appear in real configs).
  const double d = number(*v, prefix + key);
  if (d != std::floor(d) || std::fabs(d) > 9.0e15) {
    throw Error(fmt::format("{}{}={} must be an integer", prefix, key, v->dump()));
  }
  return static_cast<int64_t>(d);
}

std::vector<double> number_list(const json& object, const char* key, const std::string& prefix) {
  const json* v = find(object, key);
  if (!v) return {};
  if (!v->is_array()) throw Error(fmt::format("{}{} must be a list of numbers", prefix, key));
  std::vector<double> out;
  for (size_t i = 0; i < v->size(); ++i) out.push_back(number((*v)[i], fmt::format("{}{}[{}]", prefix, key, i)));
  return out;
}

std::string text(const json& object, const char* key, const std::string& prefix) {
  const json* v = find(object, key);
  if (!v) return {};
  if (!v->is_string()) throw Error(fmt::format("{}{}={} must be a string", prefix, key, v->dump()));
  return v->get<std::string>();
}

bool boolean(const json& object, const char* key, const std::string& prefix, bool fallback) {
  const json* v = find(object, key);
  if (!v) return fallback;
  if (!v->is_boolean()) throw Error(fmt::format("{}{}={} must be true or false", prefix, key, v->dump()));
  return v->get<bool>();
}

}  // namespace

ModelRope read_hf_config(std::string_view json_text) {
  json config;
  try {
    config = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    std::string what = e.what();
    throw Error("config is not valid JSON: " + what);
  }
  if (!config.is_object()) throw Error("config must be a JSON object");
  // Multimodal wrappers keep the language model's settings in text_config.
  if (const json* text_config = find(config, "text_config"); text_config && !find(config, "hidden_size")) {
    if (!text_config->is_object()) throw Error("text_config must be an object");
    config = *text_config;
  }
  ModelRope out;
  out.model_type = text(config, "model_type", "");
  const std::string& type = out.model_type;
  const bool neox = type == "gpt_neox";
  const bool deepseek = type == "deepseek_v2" || type == "deepseek_v3";

  // ---- attention shape ----
  const auto heads = opt_integer(config, "num_attention_heads", "");
  const auto hidden = opt_integer(config, "hidden_size", "");
  if (!heads || *heads <= 0) throw Error("num_attention_heads is missing or not > 0");
  out.num_attention_heads = *heads;
  out.num_key_value_heads = opt_integer(config, "num_key_value_heads", "").value_or(*heads);
  if (out.num_key_value_heads <= 0 || *heads % out.num_key_value_heads != 0) {
    throw Error(fmt::format("num_key_value_heads={} must divide num_attention_heads={}",
                            out.num_key_value_heads, *heads));
  }
  out.max_position_embeddings = opt_integer(config, "max_position_embeddings", "").value_or(0);

  int64_t head_dim = 0;
  if (deepseek) {
    const auto rope_head = opt_integer(config, "qk_rope_head_dim", "");
    if (!rope_head) throw Error(fmt::format("qk_rope_head_dim is missing (model_type {})", type));
    head_dim = *rope_head;
  } else if (auto hd = opt_integer(config, "head_dim", "")) {
    head_dim = *hd;
  } else {
    if (!hidden) throw Error("hidden_size is missing (needed for head_dim = hidden_size / num_attention_heads)");
    head_dim = *hidden / *heads;  // Python's //
  }
  if (head_dim <= 0) throw Error(fmt::format("head_dim={} must be > 0", head_dim));

  // ---- rope parameters: v5 rope_parameters, else v4 rope_scaling ----
  json scaling = json::object();
  std::string scaling_name = "rope_scaling";
  if (const json* parameters = find(config, "rope_parameters")) {
    if (!parameters->is_object()) throw Error("rope_parameters must be an object");
    if (!find(*parameters, "rope_type") && !find(*parameters, "rope_theta") && find(*parameters, "full_attention")) {
      scaling = (*parameters)["full_attention"];  // per layer type: the global-attention layers
      out.notes.push_back("rope_parameters is per layer type; using full_attention");
      scaling_name = "rope_parameters.full_attention";
    } else {
      scaling = *parameters;
      scaling_name = "rope_parameters";
    }
  } else if (const json* rs = find(config, "rope_scaling")) {
    if (!rs->is_object()) throw Error(fmt::format("rope_scaling={} must be an object or null", rs->dump()));
    scaling = *rs;
  }
  const std::string p = scaling_name + ".";

  double base = 10000.0;
  if (neox) base = opt_number(config, "rotary_emb_base", "").value_or(base);
  if (auto theta = opt_number(config, "rope_theta", "")) base = *theta;
  if (auto theta = opt_number(scaling, "rope_theta", p)) base = *theta;

  double partial = 1.0;
  if (type == "phi") partial = 0.5;
  if (neox) partial = opt_number(config, "rotary_pct", "").value_or(0.25);
  if (auto f = opt_number(config, "partial_rotary_factor", "")) partial = *f;
  if (auto f = opt_number(scaling, "partial_rotary_factor", p)) partial = *f;
  if (partial <= 0 || partial > 1) {
    throw Error(fmt::format("partial_rotary_factor={} must be in (0, 1]", partial));
  }
  int64_t rotary_dim = static_cast<int64_t>(static_cast<double>(head_dim) * partial);  // Python int()
  if (type == "gptj") rotary_dim = opt_integer(config, "rotary_dim", "").value_or(head_dim);
  if (rotary_dim <= 0 || rotary_dim % 2 != 0) {
    throw Error(fmt::format("rotary_dim=int(head_dim {} * partial_rotary_factor {})={} must be even and > 0",
                            head_dim, partial, rotary_dim));
  }

  Spec& spec = out.spec;
  spec.head_dim = head_dim;
  spec.rotary_dim = rotary_dim;
  spec.base = base;
  spec.pairing = Pairing::half;
  if (type == "gptj") spec.pairing = Pairing::interleaved;
  if (type == "deepseek_v3" && boolean(config, "rope_interleave", "", true)) spec.pairing = Pairing::interleaved;

  // ---- schedule ----
  std::string rope_type = text(scaling, "rope_type", p);
  if (rope_type.empty()) rope_type = text(scaling, "type", p);
  if (rope_type.empty()) rope_type = "default";
  const std::string legacy_type = text(scaling, "type", p);
  if (type.rfind("phi3", 0) == 0 && (legacy_type == "su" || legacy_type == "yarn")) rope_type = "longrope";
  if (rope_type == "su") rope_type = "longrope";
  const int64_t max_pos = out.max_position_embeddings;
  auto need_max_pos = [&](const char* why) {
    if (max_pos <= 0) throw Error(fmt::format("max_position_embeddings is missing ({} needs it)", why));
  };

  if (rope_type == "default") {
    spec.schedule = ScheduleType::default_;
  } else if (rope_type == "linear") {
    spec.schedule = ScheduleType::linear;
    spec.factor = opt_number(scaling, "factor", p);
    if (!spec.factor) throw Error(fmt::format("{}factor is required for rope_type linear", p));
  } else if (rope_type == "dynamic") {
    spec.schedule = ScheduleType::dynamic;
    spec.factor = opt_number(scaling, "factor", p);
    if (!spec.factor) throw Error(fmt::format("{}factor is required for rope_type dynamic", p));
    need_max_pos("dynamic");
    spec.max_position = max_pos;  // transformers compares n with max_position_embeddings
  } else if (rope_type == "yarn") {
    spec.schedule = ScheduleType::yarn;
    need_max_pos("yarn");
    const auto original = opt_integer(scaling, "original_max_position_embeddings", p);
    spec.original_max_position = original.value_or(max_pos);
    spec.factor = opt_number(scaling, "factor", p);
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
    if (auto v = opt_number(scaling, "beta_fast", p); v && *v != 0) spec.beta_fast = *v;
    if (auto v = opt_number(scaling, "beta_slow", p); v && *v != 0) spec.beta_slow = *v;
    spec.mscale = opt_number(scaling, "mscale", p);
    spec.mscale_all_dim = opt_number(scaling, "mscale_all_dim", p);
    if (find(scaling, "truncate")) spec.truncate = boolean(scaling, "truncate", p, true);
    spec.attention_factor = opt_number(scaling, "attention_factor", p);
  } else if (rope_type == "longrope") {
    spec.schedule = ScheduleType::longrope;
    need_max_pos("longrope");
    spec.short_factor = number_list(scaling, "short_factor", p);
    spec.long_factor = number_list(scaling, "long_factor", p);
    if (spec.short_factor.empty()) throw Error(fmt::format("{}short_factor is required for longrope", p));
    if (spec.long_factor.empty()) throw Error(fmt::format("{}long_factor is required for longrope", p));
    spec.attention_factor = opt_number(scaling, "attention_factor", p);
    // LongRoPE reads the original length from the top level (Phi-3).
    if (auto original = opt_integer(config, "original_max_position_embeddings", "")) {
      spec.original_max_position = *original;
      spec.max_position = max_pos;
    } else {
      spec.original_max_position = max_pos;
      const auto factor = opt_number(scaling, "factor", p);
      if (!spec.attention_factor && factor && *factor > 1.0) {
        spec.attention_factor =
            std::sqrt(1.0 + std::log(*factor) / std::log(static_cast<double>(max_pos)));
      }
    }
  } else if (rope_type == "llama3") {
    spec.schedule = ScheduleType::llama3;
    spec.factor = opt_number(scaling, "factor", p);
    spec.low_freq_factor = opt_number(scaling, "low_freq_factor", p);
    spec.high_freq_factor = opt_number(scaling, "high_freq_factor", p);
    spec.original_max_position = opt_integer(scaling, "original_max_position_embeddings", p);
    for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (!find(scaling, key)) throw Error(fmt::format("{}{} is required for rope_type llama3", p, key));
    }
  } else {
    throw Error(fmt::format("{}rope_type='{}' is not supported (default, linear, dynamic, yarn, longrope, "
                            "llama3, su)", p, rope_type));
  }
  try {
    validate(spec);
  } catch (const Error& e) {
    throw Error(fmt::format("config resolves to an invalid RoPE spec: {}", e.what()));
  }
  return out;
}

ModelRope read_hf_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("config '{}' cannot be read", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  try {
    return read_hf_config(buffer.str());
  } catch (const Error& e) {
    throw Error(fmt::format("config '{}': {}", path, e.what()));
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
  throw Error(fmt::format("preset '{}' is unknown (known: {})", name, known));
}

ModelRope load_preset(std::string_view name) {
  const json file = json::parse(preset_text(name));
  return read_hf_config(file.at("config").dump());
}

}  // namespace rotary
