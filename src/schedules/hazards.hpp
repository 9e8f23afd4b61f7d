// Internal: the doctor's phrases that the schedules' own hazards (ScheduleEntry::hazards) share.
#pragma once

#include <string>

#include "rotary/doctor.hpp"
#include "rotary/schedule.hpp"
#include "rotary/spec.hpp"

namespace rotary::detail {

/// How the schedule changed each pair against the unscaled frequencies of the same head, in runs:
/// "pairs 0-10 keep their frequencies, pairs 11-22 blend, pairs 23-31 are divided by factor 4"
/// (exact comparisons: yarn and llama3 keep a pair's frequency or divide it by s bit for bit,
/// make_schedule's arithmetic). Needs spec.factor.
std::string frequency_bands(const Spec& spec, const Schedule& schedule);

/// The fix for a schedule that changes with the sequence length: "resolve one schedule for the
/// whole sequence: seq_len=N (...)", N the positions the report examined.
std::string one_schedule_fix(const DoctorReport& report);

}  // namespace rotary::detail
