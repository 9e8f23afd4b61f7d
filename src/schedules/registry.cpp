#include "schedules/registry.hpp"

#include <fmt/format.h>

#include "rotary/error.hpp"

namespace rotary::detail {

const ScheduleEntry& schedule_entry(ScheduleType type) {
  const auto index = static_cast<int64_t>(type);
  if (index < 0 || index >= static_cast<int64_t>(kScheduleEntries.size())) {
    throw Error(fmt::format("schedule={} is not a schedule type", index), "schedule");
  }
  return kScheduleEntries[static_cast<size_t>(index)]();
}

const ScheduleEntry* find_rope_type(std::string_view rope_type) {
  for (const auto entry : kScheduleEntries) {
    for (const std::string_view name : entry().rope_types) {
      if (name == rope_type) return &entry();
    }
  }
  return nullptr;
}

}  // namespace rotary::detail
