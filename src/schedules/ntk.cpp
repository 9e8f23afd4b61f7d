// ntk (static NTK-aware, factor s): the default frequencies of base' = base * s^(r/(r-2))
// (DESIGN.md §2). transformers has no static NTK rope_type.
#include "schedules/common.hpp"
#include "schedules/entry.hpp"

namespace rotary::detail {
namespace {

Frequencies derive(const Spec& spec, std::optional<int64_t>) {
  const double base = ntk_base(spec.base, *spec.factor, spec.resolved_rotary_dim());
  require_finite_base(spec, base);
  return {unscaled_inv_freq(spec, base)};
}

}  // namespace

const ScheduleEntry& ntk_schedule() {
  static const ScheduleEntry entry{
      .info = {.name = "ntk", .type = ScheduleType::ntk, .doc = "static NTK-aware: base * factor^(r/(r-2))",
               .required = {{"factor"}}, .optional = {}, .per_frequency = false,
               .check = check_rotary_dim_above_two},
      .derive = derive,
      .hf_float32 = float32_nearest,
      .rope_types = {},
      .rope_keys = {},
      .read_config = nullptr,
      .hazards = nullptr,
  };
  return entry;
}

}  // namespace rotary::detail
