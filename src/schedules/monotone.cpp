// monotone (He & Xu, "A Simple Derivation of RoPE for LLMs"; max length N): every default frequency
// times one constant c with (N-1) * c * inv_freq[0] < 2π, so each pair's angle difference grows
// strictly with distance over the whole window (DESIGN.md §2). transformers has no such rope_type.
#include <fmt/format.h>

#include "rotary/error.hpp"
#include "rotary/schedule.hpp"
#include "schedules/common.hpp"
#include "schedules/entry.hpp"

namespace rotary {

double monotone_default_scale(int64_t max_length, double first_inv_freq) {
  return detail::two_pi * (1.0 - 0x1p-10) / (static_cast<double>(max_length - 1) * first_inv_freq);
}

namespace detail {
namespace {

Frequencies derive(const Spec& spec, std::optional<int64_t>) {
  std::vector<double> inv_freq = unscaled_inv_freq(spec, spec.base);
  const int64_t n = *spec.max_length;
  const double first = inv_freq.empty() ? 1.0 : inv_freq[0];
  const double c = spec.monotone_scale.value_or(monotone_default_scale(n, first));
  if (static_cast<double>(n - 1) * c * first >= two_pi) {
    throw Error(fmt::format(
        "monotone_scale={} breaks (max_length-1)*c*inv_freq[0] < 2*pi for max_length={}; "
        "the largest allowed is below {}",
        c, n, two_pi / (static_cast<double>(n - 1) * first)), "monotone_scale");
  }
  for (double& f : inv_freq) f *= c;
  return {inv_freq};
}

}  // namespace

const ScheduleEntry& monotone_schedule() {
  static const ScheduleEntry entry{
      .info = {.name = "monotone", .type = ScheduleType::monotone,
               .doc = "every frequency times c, angles monotone over max_length tokens",
               .required = {{"max_length"}}, .optional = {"monotone_scale"}, .per_frequency = true, .check = nullptr},
      .derive = derive,
      .hf_float32 = float32_nearest,
      .rope_types = {},
      .rope_keys = {},
      .read_config = nullptr,
      .hazards = nullptr,
  };
  return entry;
}

}  // namespace detail
}  // namespace rotary
