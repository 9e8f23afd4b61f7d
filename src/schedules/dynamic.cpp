// dynamic (transformers' dynamic NTK, factor s, at sequence length n): when n > L, the default
// frequencies of base' = base * (s*n/L - (s-1))^(r/(r-2)); else the default ones (DESIGN.md §2).
#include <cmath>

#include <fmt/format.h>

#include "rotary/error.hpp"
#include "rotary/schedule.hpp"
#include "schedules/common.hpp"
#include "schedules/entry.hpp"
#include "schedules/hazards.hpp"

namespace rotary::detail {
namespace {

Frequencies derive(const Spec& spec, std::optional<int64_t> seq_len) {
  const int64_t original = spec.original_length();
  double base = spec.base;
  if (seq_len && *seq_len > original) {
    const double s = *spec.factor;
    const double growth = s * static_cast<double>(*seq_len) / static_cast<double>(original) - (s - 1.0);
    base = ntk_base(spec.base, growth, spec.resolved_rotary_dim());
  }
  require_finite_base(spec, base);
  return {unscaled_inv_freq(spec, base)};
}

// _compute_dynamic_ntk_parameters' base: at init (no sequence length; transformers also restores
// the init frequencies below L) in Python doubles, factor * L / L - (factor - 1) == 1 for the usual
// factors; past L from a tensor seq_len, so in float32, the power of a float32 tensor by a Python
// float being torch's std::pow(float, double), i.e. a double pow rounded once.
float hf_dynamic_base(const Spec& spec, std::optional<int64_t> seq_len) {
  const int64_t rotary_dim = spec.resolved_rotary_dim();
  const double s = *spec.factor;
  const auto original = spec.original_length();
  const double exponent = static_cast<double>(rotary_dim) / static_cast<double>(rotary_dim - 2);
  if (!seq_len || *seq_len <= original) {
    const double L = static_cast<double>(original);
    return f32(spec.base * std::pow(s * L / L - (s - 1.0), exponent));
  }
  float growth = f32(s) * static_cast<float>(*seq_len);
  growth = growth / static_cast<float>(original);
  growth = growth - f32(s - 1.0);
  return f32(spec.base) * f32(std::pow(static_cast<double>(growth), exponent));
}

std::vector<float> hf_float32(const Spec& spec, std::optional<int64_t> seq_len, const std::vector<double>&) {
  return reciprocals(hf_powers_of(spec, hf_dynamic_base(spec, seq_len)));
}

void read_config(RopeDict& dict, Spec& spec) {
  dict.read(spec, "factor");
  if (!spec.factor) throw Error(fmt::format("{}factor is required for rope_type dynamic", dict.prefix()));
  spec.max_position = dict.max_position("dynamic");  // transformers compares n with max_position_embeddings
}

void hazards(const Spec& spec, const DoctorReport& r, std::vector<Hazard>& out) {
  const int64_t original = spec.original_length();
  if (r.positions <= original) return;
  const double before = make_schedule(spec, original).inv_freq.back();
  out.push_back({"dynamic_ntk_switch", original,
                 fmt::format("transformers' dynamic NTK base grows once the sequence is longer than {} tokens (the "
                             "lowest frequency x{:.3g} at {}): every key cached at a shorter length changes; {}",
                             original, r.schedule.inv_freq.back() / before, r.positions, one_schedule_fix(r))});
}

}  // namespace

const ScheduleEntry& dynamic_schedule() {
  static const ScheduleEntry entry{
      .info = {.name = "dynamic", .type = ScheduleType::dynamic,
               .doc = "dynamic NTK: the base grows with the sequence length past L",
               .required = {{"factor"}, {"original_max_position", "max_position"}}, .optional = {},
               .per_frequency = false, .check = check_rotary_dim_above_two},
      .derive = derive,
      .hf_float32 = hf_float32,
      .rope_types = {"dynamic"},
      .rope_keys = {"factor"},
      .read_config = read_config,
      .hazards = hazards,
  };
  return entry;
}

}  // namespace rotary::detail
