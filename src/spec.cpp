#include "rotary/spec.hpp"

#include <cmath>

#include <fmt/format.h>

#include "rotary/error.hpp"
#include "text.hpp"

namespace rotary {
namespace {

bool uses(ScheduleType type, std::initializer_list<ScheduleType> users) {
  for (ScheduleType t : users) {
    if (t == type) return true;
  }
  return false;
}

template <class T>
void reject_unused(const std::optional<T>& field, const char* name, ScheduleType type,
                   std::initializer_list<ScheduleType> users) {
  if (field && !uses(type, users)) {
    throw Error(fmt::format("{} is set but schedule {} does not use it", name, to_string(type)));
  }
}

void require_finite(double value, const char* name) {
  if (!std::isfinite(value)) throw Error(fmt::format("{}={} must be finite", name, value));
}

void require_positive(const std::optional<double>& value, const char* name) {
  if (!value) return;
  require_finite(*value, name);
  if (*value <= 0) throw Error(fmt::format("{}={} must be > 0", name, *value));
}

// cos and sin times the factor are stored as float32: it must be a normal float32.
void require_float32_factor(const std::optional<double>& value, const char* name) {
  if (!value || (*value >= min_attention_factor && *value <= max_attention_factor)) return;
  throw Error(fmt::format("{}={} must round to a normal float32, in [2^-126, 3.40282347e+38] (cos and sin "
                          "times it are stored as float32)",
                          name, *value));
}

void require_length(const std::optional<int64_t>& value, const char* name) {
  if (value && *value < 1) throw Error(fmt::format("{}={} must be >= 1", name, *value));
}

}  // namespace

int64_t Spec::original_length() const {
  if (original_max_position) return *original_max_position;
  if (max_position) return *max_position;
  return 0;
}

std::string_view to_string(Pairing pairing) {
  return pairing == Pairing::interleaved ? "interleaved" : "half";
}

std::string_view to_string(ScheduleType schedule) {
  switch (schedule) {
    case ScheduleType::default_: return "default";
    case ScheduleType::linear: return "linear";
    case ScheduleType::ntk: return "ntk";
    case ScheduleType::dynamic: return "dynamic";
    case ScheduleType::yarn: return "yarn";
    case ScheduleType::llama3: return "llama3";
    case ScheduleType::longrope: return "longrope";
    case ScheduleType::monotone: return "monotone";
  }
  return "?";
}

Pairing parse_pairing(std::string_view text, std::string_view what) {
  if (text == "interleaved") return Pairing::interleaved;
  if (text == "half") return Pairing::half;
  throw Error(fmt::format("{}='{}' must be interleaved or half", what, detail::excerpt(text)));
}

ScheduleType parse_schedule(std::string_view text, std::string_view what) {
  for (ScheduleType t : {ScheduleType::default_, ScheduleType::linear, ScheduleType::ntk,
                         ScheduleType::dynamic, ScheduleType::yarn, ScheduleType::llama3,
                         ScheduleType::longrope, ScheduleType::monotone}) {
    if (text == to_string(t)) return t;
  }
  throw Error(fmt::format(
      "{}='{}' must be one of default, linear, ntk, dynamic, yarn, llama3, longrope, monotone", what,
      detail::excerpt(text)));
}

void validate(const Spec& spec) {
  using enum ScheduleType;
  const ScheduleType type = spec.schedule;
  if (spec.head_dim <= 0) throw Error(fmt::format("head_dim={} must be > 0", spec.head_dim));
  if (spec.head_dim > (int64_t{1} << 20)) {
    throw Error(fmt::format("head_dim={} exceeds 1048576", spec.head_dim));
  }
  if (spec.rotary_dim < 0) throw Error(fmt::format("rotary_dim={} must be > 0", spec.rotary_dim));
  const int64_t r = spec.resolved_rotary_dim();
  if (r % 2 != 0) {
    throw Error(fmt::format("rotary_dim={} must be even and <= head_dim={}", r, spec.head_dim));
  }
  if (r > spec.head_dim) {
    throw Error(fmt::format("rotary_dim={} exceeds head_dim={}", r, spec.head_dim));
  }
  require_finite(spec.base, "base");
  if (spec.base <= 1) throw Error(fmt::format("base={} must be > 1", spec.base));

  reject_unused(spec.factor, "factor", type, {linear, ntk, dynamic, yarn, llama3});
  reject_unused(spec.original_max_position, "original_max_position", type,
                {dynamic, yarn, llama3, longrope});
  reject_unused(spec.max_position, "max_position", type, {dynamic, yarn, llama3, longrope});
  reject_unused(spec.beta_fast, "beta_fast", type, {yarn});
  reject_unused(spec.beta_slow, "beta_slow", type, {yarn});
  reject_unused(spec.mscale, "mscale", type, {yarn});
  reject_unused(spec.mscale_all_dim, "mscale_all_dim", type, {yarn});
  reject_unused(spec.truncate, "truncate", type, {yarn});
  reject_unused(spec.low_freq_factor, "low_freq_factor", type, {llama3});
  reject_unused(spec.high_freq_factor, "high_freq_factor", type, {llama3});
  reject_unused(spec.max_length, "max_length", type, {monotone});
  reject_unused(spec.monotone_scale, "monotone_scale", type, {monotone});
  if (type != longrope && !spec.short_factor.empty()) {
    throw Error(fmt::format("short_factor is set but schedule {} does not use it", to_string(type)));
  }
  if (type != longrope && !spec.long_factor.empty()) {
    throw Error(fmt::format("long_factor is set but schedule {} does not use it", to_string(type)));
  }

  require_positive(spec.factor, "factor");
  require_positive(spec.attention_factor, "attention_factor");
  require_float32_factor(spec.attention_factor, "attention_factor");
  require_positive(spec.beta_fast, "beta_fast");
  require_positive(spec.beta_slow, "beta_slow");
  require_positive(spec.low_freq_factor, "low_freq_factor");
  require_positive(spec.high_freq_factor, "high_freq_factor");
  require_positive(spec.monotone_scale, "monotone_scale");
  if (spec.mscale) require_finite(*spec.mscale, "mscale");
  if (spec.mscale_all_dim) require_finite(*spec.mscale_all_dim, "mscale_all_dim");
  require_length(spec.original_max_position, "original_max_position");
  require_length(spec.max_position, "max_position");

  if (uses(type, {linear, ntk, dynamic, yarn, llama3}) && !spec.factor) {
    throw Error(fmt::format("schedule {} needs factor", to_string(type)));
  }
  if (uses(type, {ntk, dynamic}) && r <= 2) {
    throw Error(fmt::format(
        "rotary_dim={} must be > 2 for schedule {} (its base exponent is r/(r-2))", r,
        to_string(type)));
  }
  if (uses(type, {dynamic, yarn, llama3, longrope}) && spec.original_length() == 0) {
    throw Error(fmt::format("schedule {} needs original_max_position or max_position",
                            to_string(type)));
  }
  if (type == yarn) {
    const double fast = spec.beta_fast.value_or(32.0);
    const double slow = spec.beta_slow.value_or(1.0);
    if (fast <= slow) {
      throw Error(fmt::format("beta_fast={} must exceed beta_slow={}", fast, slow));
    }
  }
  if (type == llama3) {
    if (!spec.low_freq_factor) throw Error("schedule llama3 needs low_freq_factor");
    if (!spec.high_freq_factor) throw Error("schedule llama3 needs high_freq_factor");
    // Equal factors are allowed (Llama 4 Scout): two bands, no smoothing (see make_schedule).
    if (*spec.low_freq_factor > *spec.high_freq_factor) {
      throw Error(fmt::format("low_freq_factor={} must be <= high_freq_factor={}",
                              *spec.low_freq_factor, *spec.high_freq_factor));
    }
  }
  if (type == longrope) {
    const auto pairs = static_cast<size_t>(r / 2);
    for (const auto* list : {&spec.short_factor, &spec.long_factor}) {
      const char* name = list == &spec.short_factor ? "short_factor" : "long_factor";
      if (list->size() != pairs) {
        throw Error(fmt::format("{} has {} values but rotary_dim/2={}", name, list->size(), pairs));
      }
      for (size_t i = 0; i < list->size(); ++i) {
        const double v = (*list)[i];
        if (!std::isfinite(v) || v <= 0) {
          throw Error(fmt::format("{}[{}]={} must be finite and > 0", name, i, v));
        }
      }
    }
    if (spec.original_length() < 2) {
      throw Error(fmt::format("original_max_position={} must be >= 2 for schedule longrope",
                              spec.original_length()));
    }
  }
  if (type == monotone) {
    if (!spec.max_length) throw Error("schedule monotone needs max_length");
    if (*spec.max_length < 2 || *spec.max_length > max_position_limit) {
      throw Error(fmt::format("max_length={} must be in [2, 2^31]", *spec.max_length));
    }
  }
}

}  // namespace rotary
