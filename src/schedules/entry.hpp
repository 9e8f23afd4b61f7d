// Internal: one schedule, whole — what validate requires of a Spec that names it, its formula and
// its replay of transformers' float32 arithmetic. Each schedule is one such entry in its own file
// (src/schedules/<name>.cpp); registry.hpp lists them in ScheduleType order.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "rotary/spec.hpp"
#include "rotary/spec_fields.hpp"

namespace rotary::detail {

/// What a schedule derives from a Spec at a sequence length (DESIGN.md §2).
struct Frequencies {
  std::vector<double> inv_freq;   ///< rotary_dim/2 values (make_schedule checks them)
  double attention_factor = 1.0;  ///< the computed factor; an explicit Spec::attention_factor wins
};

/// One schedule. The function members are plain pointers; nullptr where the comment allows it.
struct ScheduleEntry {
  /// Name, doc line, the fields it requires and takes, whether it composes with the axial stream
  /// layouts, its rules across fields (spec_fields.hpp; schedules() and validate read it).
  ScheduleInfo info;

  /// The formula: inv_freq and the computed attention factor of a Spec that passed validate, at
  /// `seq_len` (unset: n <= L). The unscaled frequencies come from unscaled_inv_freq (common.hpp),
  /// which lays them out for the stream layout. Throws rotary::Error naming the value when the
  /// settings give no usable frequencies (make_schedule checks the rest).
  Frequencies (*derive)(const Spec& spec, std::optional<int64_t> seq_len);
  /// transformers' own float32 inv_freq for the same settings (Schedule::inv_freq_hf32; the rules
  /// of the replay are in common.hpp); `exact` is derive's inv_freq. A schedule transformers lacks
  /// gives float32_nearest(exact).
  std::vector<float> (*hf_float32)(const Spec& spec, std::optional<int64_t> seq_len,
                                   const std::vector<double>& exact);
};

/// The entry of `type`; throws rotary::Error "schedule=N is not a schedule type" otherwise.
const ScheduleEntry& schedule_entry(ScheduleType type);

}  // namespace rotary::detail
