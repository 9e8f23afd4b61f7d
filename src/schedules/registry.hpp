// Internal: every schedule, one entry each (entry.hpp), in ScheduleType order. A new schedule is its
// ScheduleType value, its file src/schedules/<name>.cpp, and one line here and one in
// kScheduleEntries.
#pragma once

#include <array>
#include <cstddef>

#include "schedules/entry.hpp"

namespace rotary::detail {

const ScheduleEntry& default_schedule();       // default.cpp
const ScheduleEntry& linear_schedule();        // linear.cpp
const ScheduleEntry& ntk_schedule();           // ntk.cpp
const ScheduleEntry& dynamic_schedule();       // dynamic.cpp
const ScheduleEntry& yarn_schedule();          // yarn.cpp
const ScheduleEntry& llama3_schedule();        // llama3.cpp
const ScheduleEntry& longrope_schedule();      // longrope.cpp
const ScheduleEntry& monotone_schedule();      // monotone.cpp
const ScheduleEntry& proportional_schedule();  // proportional.cpp

/// Entry i describes ScheduleType(i) (tests/test_schedule_registry.cpp checks each entry's type).
/// Functions returning a function-local static, so an entry is ready whenever it is first asked for.
inline constexpr std::array kScheduleEntries = {
    &default_schedule, &linear_schedule,   &ntk_schedule,      &dynamic_schedule,     &yarn_schedule,
    &llama3_schedule,  &longrope_schedule, &monotone_schedule, &proportional_schedule,
};
static_assert(kScheduleEntries.size() == static_cast<size_t>(ScheduleType::last) + 1,
              "one entry per ScheduleType: a new value of the enum needs its entry here");

}  // namespace rotary::detail
