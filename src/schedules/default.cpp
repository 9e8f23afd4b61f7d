// default: inv_freq = base^(-2i/r) (DESIGN.md §2). transformers: rope_type "default", and "mrope"
// (Qwen2-VL's M-RoPE: the streams come from mrope_section, the frequencies are the default ones).
#include "schedules/common.hpp"
#include "schedules/entry.hpp"

namespace rotary::detail {
namespace {

Frequencies derive(const Spec& spec, std::optional<int64_t>) { return {unscaled_inv_freq(spec, spec.base)}; }

// The models' compute_default_rope_parameters: 1 / base ** (arange(0, r, 2) / r).
std::vector<float> hf_float32(const Spec& spec, std::optional<int64_t>, const std::vector<double>&) {
  return reciprocals(hf_powers_of(spec, f32(spec.base)));
}

}  // namespace

const ScheduleEntry& default_schedule() {
  static const ScheduleEntry entry{
      .info = {.name = "default", .type = ScheduleType::default_, .doc = "inv_freq = base^(-2i/r)",
               .required = {}, .optional = {}, .per_frequency = true, .check = nullptr},
      .derive = derive,
      .hf_float32 = hf_float32,
      .rope_types = {"default", "mrope"},
      .rope_keys = {},
      .read_config = nullptr,
      .hazards = nullptr,
  };
  return entry;
}

}  // namespace rotary::detail
