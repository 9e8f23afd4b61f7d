#include "rotary/build.hpp"

#include <hwy/targets.h>

#include <cstdint>

#include "cpu/cpu.hpp"
#include "kernel/backend.hpp"

namespace rotary {

BuildInfo build_info() {
  BuildInfo info{.version = ROTARY_VERSION_STRING, .cpu_target = "", .cpu_targets = {}, .backends = {}};
  // Highway numbers its targets so that a lower bit is a better one: the lowest bit first.
  for (int64_t compiled = HWY_TARGETS; compiled != 0; compiled &= compiled - 1) {
    info.cpu_targets.emplace_back(hwy::TargetName(compiled & -compiled));
  }
  info.cpu_target = detail::dispatched_target();  // asked of the dispatch the kernels go through
  for (const detail::BackendEntry& entry : detail::backends()) {
    if (entry.available()) info.backends.emplace_back(entry.name);
  }
  return info;
}

}  // namespace rotary
