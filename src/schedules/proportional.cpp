// proportional (Gemma 4 full attention, partial_rotary_factor p): the frequencies base^(-2j/head_dim)
// of the whole head, the first floor(p * head_dim / 2) turning and the rest 0, then divided by
// factor if given (transformers' _compute_proportional_rope_parameters).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "rotary/error.hpp"
#include "schedules/common.hpp"
#include "schedules/entry.hpp"

namespace rotary::detail {
namespace {

// transformers spaces the frequencies over the whole head.
void check(const Spec& spec) {
  if (spec.resolved_rotary_dim() != spec.head_dim) {
    throw Error(fmt::format("rotary_dim={} must equal head_dim={} for schedule proportional "
                            "(partial_rotary_factor={} picks the pairs that turn)",
                            spec.resolved_rotary_dim(), spec.head_dim, *spec.partial_rotary_factor), "rotary_dim");
  }
}

// The pairs that turn, int(p * head_dim // 2) as transformers writes it (rotary_dim == head_dim).
size_t turning(const Spec& spec) {
  const int64_t rotary_dim = spec.resolved_rotary_dim();
  const auto pairs = static_cast<size_t>(std::floor(*spec.partial_rotary_factor * static_cast<double>(rotary_dim) / 2.0));
  return std::min(pairs, static_cast<size_t>(rotary_dim / 2));
}

Frequencies derive(const Spec& spec, std::optional<int64_t>) {
  std::vector<double> inv_freq = unscaled_inv_freq(spec, spec.base);
  std::fill(inv_freq.begin() + static_cast<std::ptrdiff_t>(turning(spec)), inv_freq.end(), 0.0);
  if (spec.factor) {
    for (double& f : inv_freq) f /= *spec.factor;
  }
  return {inv_freq};
}

// rope_angles float32 frequencies, then zeros (transformers' 1/inf), divided by factor (default 1).
std::vector<float> hf_float32(const Spec& spec, std::optional<int64_t>, const std::vector<double>&) {
  std::vector<float> out = reciprocals(hf_powers_of(spec, f32(spec.base)));
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(turning(spec)), out.end(), 0.0f);
  if (spec.factor) {
    for (float& f : out) f = f / f32(*spec.factor);
  }
  return out;
}

// partial_rotary_factor is read with the head's width (the config reader keeps rotary_dim =
// head_dim for a schedule that takes it).
void read_config(RopeDict& dict, Spec& spec) { dict.read(spec, "factor"); }

}  // namespace

const ScheduleEntry& proportional_schedule() {
  static const ScheduleEntry entry{
      .info = {.name = "proportional", .type = ScheduleType::proportional,
               .doc = "Gemma 4: frequencies over the whole head, the first floor(p*head_dim/2) nonzero",
               .required = {{"partial_rotary_factor"}}, .optional = {"factor"}, .per_frequency = false,
               .check = check},
      .derive = derive,
      .hf_float32 = hf_float32,
      .rope_types = {"proportional"},
      .rope_keys = {"factor"},
      .read_config = read_config,
      .hazards = nullptr,
  };
  return entry;
}

}  // namespace rotary::detail
