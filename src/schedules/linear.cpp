// linear (position interpolation, factor s): inv_freq = default_i / s (DESIGN.md §2).
#include <fmt/format.h>

#include "rotary/error.hpp"
#include "schedules/common.hpp"
#include "schedules/entry.hpp"

namespace rotary::detail {
namespace {

Frequencies derive(const Spec& spec, std::optional<int64_t>) {
  std::vector<double> inv_freq = unscaled_inv_freq(spec, spec.base);
  for (double& f : inv_freq) f /= *spec.factor;
  return {inv_freq};
}

// _compute_linear_scaling_rope_parameters: the default float32 inv_freq / factor.
std::vector<float> hf_float32(const Spec& spec, std::optional<int64_t>, const std::vector<double>&) {
  std::vector<float> out = reciprocals(hf_powers_of(spec, f32(spec.base)));
  for (float& f : out) f = f / f32(*spec.factor);
  return out;
}

void read_config(RopeDict& dict, Spec& spec) {
  dict.read(spec, "factor");
  if (!spec.factor) throw Error(fmt::format("{}factor is required for rope_type linear", dict.prefix()));
}

}  // namespace

const ScheduleEntry& linear_schedule() {
  static const ScheduleEntry entry{
      .info = {.name = "linear", .type = ScheduleType::linear, .doc = "position interpolation: default / factor",
               .required = {{"factor"}}, .optional = {}, .per_frequency = true, .check = nullptr},
      .derive = derive,
      .hf_float32 = hf_float32,
      .rope_types = {"linear"},
      .rope_keys = {"factor"},
      .read_config = read_config,
      .hazards = nullptr,
  };
  return entry;
}

}  // namespace rotary::detail
