#include "schedules/registry.hpp"

#include <fmt/format.h>

#include "rotary/error.hpp"

namespace rotary::detail {

const ScheduleEntry& schedule_entry(ScheduleType type) {
  const auto index = static_cast<int64_t>(type);
  if (index < 0 || index >= static_cast<int64_t>(kScheduleEntries.size())) {
    throw Error(fmt::format("schedule={} is not a schedule type", index));
  }
  return kScheduleEntries[static_cast<size_t>(index)]();
}

}  // namespace rotary::detail
