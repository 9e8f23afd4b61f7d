// rotary/build.hpp: the version and the CPU kernels' Highway targets.
#include "rotary/build.hpp"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cstdint>

#include "rotary/rotary.h"

namespace rotary {
namespace {

TEST(BuildInfo, NamesTheVersionAndTheCpuTargetInUse) {
  const BuildInfo info = build_info();
  EXPECT_EQ(info.version, rotary_version());  // the C ABI's, from the same CMake project version
  // Every target compiled in, best (lowest bit) first.
  std::vector<std::string> compiled;
  for (int bit = 0; bit < 63; ++bit) {
    if ((HWY_TARGETS >> bit) & 1) compiled.emplace_back(hwy::TargetName(int64_t{1} << bit));
  }
  EXPECT_EQ(info.cpu_targets, compiled);
  // The dispatch runs the best compiled target this CPU supports.
  const int64_t usable = hwy::SupportedTargets() & HWY_TARGETS;
  ASSERT_NE(usable, 0);
  EXPECT_EQ(info.cpu_target, hwy::TargetName(usable & -usable));
}

// Under a mock of the CPU's targets (Highway's test hook), the dispatch, and so build_info, follow.
TEST(BuildInfo, FollowsTheTargetTheDispatchPicks) {
  const int64_t portable = int64_t{1} << (63 - __builtin_clzll(static_cast<uint64_t>(HWY_TARGETS)));
  hwy::SetSupportedTargetsForTest(portable);
  const std::string target = build_info().cpu_target;
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_EQ(target, hwy::TargetName(portable));
  EXPECT_EQ(build_info().cpu_target, hwy::TargetName((hwy::SupportedTargets() & HWY_TARGETS) &
                                                     -(hwy::SupportedTargets() & HWY_TARGETS)));
}

}  // namespace
}  // namespace rotary
