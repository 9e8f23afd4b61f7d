// yarn (YaRN, factor s): a ramp over the pairs between extrapolation (default_i) and interpolation
// (default_i / s), and an mscale attention factor (DESIGN.md §2).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "rotary/error.hpp"
#include "schedules/common.hpp"
#include "schedules/entry.hpp"
#include "schedules/hazards.hpp"

namespace rotary::detail {
namespace {

// YaRN's get_mscale: 1 for s <= 1, else 0.1 * m * ln(s) + 1.
double get_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// The (fractional) pair index whose wavelength completes `rotations` turns over L tokens.
double correction_dim(double rotations, int64_t rotary_dim, double base, double original) {
  return static_cast<double>(rotary_dim) * std::log(original / (rotations * two_pi)) / (2.0 * std::log(base));
}

// The ramp runs from pair `low` (ramp 0: extrapolation) to pair `high` (ramp 1: interpolation).
struct Range {
  double low;
  double high;
};

Range ramp_range(const Spec& spec) {
  const int64_t r = spec.resolved_rotary_dim();
  const double original = static_cast<double>(spec.original_length());
  double low = correction_dim(spec.beta_fast.value_or(32.0), r, spec.base, original);
  double high = correction_dim(spec.beta_slow.value_or(1.0), r, spec.base, original);
  if (spec.truncate.value_or(true)) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(r - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  return {low, high};
}

void check(const Spec& spec) {
  const double fast = spec.beta_fast.value_or(32.0);
  const double slow = spec.beta_slow.value_or(1.0);
  if (fast < slow) throw Error(fmt::format("beta_fast={} must be >= beta_slow={}", fast, slow), "beta_fast");
}

Frequencies derive(const Spec& spec, std::optional<int64_t>) {
  Frequencies out{unscaled_inv_freq(spec, spec.base)};
  const double s = *spec.factor;
  const auto [low, high] = ramp_range(spec);
  for (size_t i = 0; i < out.inv_freq.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation_weight = 1.0 - ramp;
    const double d = out.inv_freq[i];
    out.inv_freq[i] = (d / s) * (1.0 - extrapolation_weight) + d * extrapolation_weight;
  }
  // Hugging Face tests `if mscale and mscale_all_dim`: a zero counts as absent.
  if (spec.mscale && spec.mscale_all_dim && *spec.mscale != 0 && *spec.mscale_all_dim != 0) {
    out.attention_factor = get_mscale(s, *spec.mscale) / get_mscale(s, *spec.mscale_all_dim);
  } else {
    out.attention_factor = get_mscale(s, 1.0);
  }
  return out;
}

// _compute_yarn_parameters: 1/pos_freqs and 1/(factor * pos_freqs) mixed by a float32 ramp over
// arange(r/2), whose ends are the Python doubles of ramp_range.
std::vector<float> hf_float32(const Spec& spec, std::optional<int64_t>, const std::vector<double>&) {
  const std::vector<float> powers = hf_powers_of(spec, f32(spec.base));
  const float s = f32(*spec.factor);
  const auto [low, high] = ramp_range(spec);
  const float low32 = f32(low);
  const float width = f32(high - low);
  std::vector<float> out(powers.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const float extrapolation = 1.0f / powers[i];
    const float interpolation = 1.0f / (s * powers[i]);
    const float ramp = std::clamp((static_cast<float>(i) - low32) / width, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    out[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return out;
}

// L from the dict, else max_position_embeddings; the factor explicit, else max/L (transformers
// >= 4.56 prefers the explicit one, with a note when they differ).
void read_config(RopeDict& dict, Spec& spec) {
  const int64_t max_pos = dict.max_position("yarn");
  dict.read(spec, "original_max_position");
  const std::optional<int64_t> original = spec.original_max_position;
  spec.original_max_position = original.value_or(max_pos);
  dict.read(spec, "factor");
  if (original) {
    const double implicit = static_cast<double>(max_pos) / static_cast<double>(*original);
    if (!spec.factor) {
      spec.factor = implicit;
    } else if (*spec.factor != implicit) {
      dict.note(fmt::format(
          "explicit factor {} differs from max_position_embeddings/original_max_position_embeddings = {}; "
          "the explicit factor is used (transformers >= 4.56, PR #40320; earlier versions used the ratio)",
          *spec.factor, implicit));
    }
  }
  if (!spec.factor) throw Error(fmt::format("{}factor is required for rope_type yarn", dict.prefix()));
  // transformers: `beta_fast or 32` — a zero counts as absent.
  dict.read(spec, "beta_fast");
  dict.read(spec, "beta_slow");
  if (spec.beta_fast == 0.0) spec.beta_fast.reset();
  if (spec.beta_slow == 0.0) spec.beta_slow.reset();
  for (const char* field : {"mscale", "mscale_all_dim", "truncate", "attention_factor"}) dict.read(spec, field);
}

void hazards(const Spec& spec, const DoctorReport& r, std::vector<Hazard>& out) {
  const int64_t original = spec.original_length();
  out.push_back({"yarn_ramp", original,
                 fmt::format("YaRN stretches the original length {} by factor {}: {}; cos and sin carry "
                             "attention_factor {:.6g}: apply it once, never again to cached keys",
                             original, *spec.factor, frequency_bands(spec, r.schedule), r.schedule.attention_factor)});
}

}  // namespace

const ScheduleEntry& yarn_schedule() {
  static const ScheduleEntry entry{
      .info = {.name = "yarn", .type = ScheduleType::yarn,
               .doc = "YaRN: a ramp between interpolation and extrapolation, mscale attention factor",
               .required = {{"factor"}, {"original_max_position", "max_position"}},
               .optional = {"beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"},
               .per_frequency = false,
               .check = check},
      .derive = derive,
      .hf_float32 = hf_float32,
      .rope_types = {"yarn"},
      .rope_keys = {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                    "mscale", "mscale_all_dim", "truncate"},
      .read_config = read_config,
      .hazards = hazards,
  };
  return entry;
}

}  // namespace rotary::detail
