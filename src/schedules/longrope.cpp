// longrope (LongRoPE, Phi-3): inv_freq = default_i / factor_i, the long factors when the sequence
// is longer than L, else the short ones; attention factor sqrt(1 + ln(M/L)/ln(L)) when M > L
// (DESIGN.md §2).
#include <cmath>

#include <fmt/format.h>

#include "rotary/error.hpp"
#include "schedules/common.hpp"
#include "schedules/entry.hpp"
#include "schedules/hazards.hpp"

namespace rotary::detail {
namespace {

void check(const Spec& spec) {
  const auto pairs = static_cast<size_t>(spec.resolved_rotary_dim() / 2);
  for (const auto* list : {&spec.short_factor, &spec.long_factor}) {
    const char* name = list == &spec.short_factor ? "short_factor" : "long_factor";
    if (list->size() != pairs) {
      throw Error(fmt::format("{} has {} values but rotary_dim/2={}", name, list->size(), pairs), std::string(name));
    }
    for (size_t i = 0; i < list->size(); ++i) {
      const double v = (*list)[i];
      if (!std::isfinite(v) || v <= 0) throw Error(fmt::format("{}[{}]={} must be finite and > 0", name, i, v), std::string(name));
    }
  }
  if (spec.original_length() < 2) {
    throw Error(fmt::format("original_max_position={} must be >= 2 for schedule longrope",
                            spec.original_length()), "original_max_position");
  }
}

const std::vector<double>& factors(const Spec& spec, std::optional<int64_t> seq_len) {
  const bool long_context = seq_len && *seq_len > spec.original_length();
  return long_context ? spec.long_factor : spec.short_factor;
}

Frequencies derive(const Spec& spec, std::optional<int64_t> seq_len) {
  Frequencies out{unscaled_inv_freq(spec, spec.base)};
  const std::vector<double>& by = factors(spec, seq_len);
  for (size_t i = 0; i < out.inv_freq.size(); ++i) out.inv_freq[i] /= by[i];
  const int64_t original = spec.original_length();
  if (spec.max_position && *spec.max_position > original) {
    const double ratio = static_cast<double>(*spec.max_position) / static_cast<double>(original);
    out.attention_factor = std::sqrt(1.0 + std::log(ratio) / std::log(static_cast<double>(original)));
  }
  return out;
}

// _compute_longrope_parameters: 1 / (ext_factors * pos_freqs), in float32.
std::vector<float> hf_float32(const Spec& spec, std::optional<int64_t> seq_len, const std::vector<double>&) {
  std::vector<float> out = hf_powers_of(spec, f32(spec.base));
  const std::vector<double>& by = factors(spec, seq_len);
  for (size_t i = 0; i < out.size(); ++i) out[i] = 1.0f / (f32(by[i]) * out[i]);
  return out;
}

// Phi-3 keeps original_max_position_embeddings at the top level; without it L is
// max_position_embeddings and a factor > 1 in the dict gives the attention factor.
void read_config(RopeDict& dict, Spec& spec) {
  const int64_t max_pos = dict.max_position("longrope");
  dict.read(spec, "short_factor");
  dict.read(spec, "long_factor");
  if (spec.short_factor.empty()) throw Error(fmt::format("{}short_factor is required for longrope", dict.prefix()));
  if (spec.long_factor.empty()) throw Error(fmt::format("{}long_factor is required for longrope", dict.prefix()));
  dict.read(spec, "attention_factor");
  if (auto original = dict.config_integer("original_max_position_embeddings")) {
    spec.original_max_position = *original;
    spec.max_position = max_pos;
  } else {
    spec.original_max_position = max_pos;
    const auto factor = dict.number("factor");
    if (!spec.attention_factor && factor && *factor > 1.0) {
      spec.attention_factor = std::sqrt(1.0 + std::log(*factor) / std::log(static_cast<double>(max_pos)));
    }
  }
}

void hazards(const Spec& spec, const DoctorReport& r, std::vector<Hazard>& out) {
  const int64_t original = spec.original_length();
  if (r.positions <= original) return;
  out.push_back({"longrope_switch", original,
                 fmt::format("transformers switches LongRoPE's short factors for the long ones once the sequence is "
                             "longer than {} tokens: every cos/sin, and every key cached before, changes; {}",
                             original, one_schedule_fix(r))});
}

}  // namespace

const ScheduleEntry& longrope_schedule() {
  static const ScheduleEntry entry{
      .info = {.name = "longrope", .type = ScheduleType::longrope, .doc = "LongRoPE: per-pair short or long factors",
               .required = {{"original_max_position", "max_position"}}, .optional = {"short_factor", "long_factor"},
               .per_frequency = true, .check = check},
      .derive = derive,
      .hf_float32 = hf_float32,
      .rope_types = {"longrope", "su"},
      .rope_keys = {"short_factor", "long_factor", "original_max_position_embeddings", "attention_factor", "factor"},
      .read_config = read_config,
      .hazards = hazards,
  };
  return entry;
}

}  // namespace rotary::detail
