// rotary/build.hpp: the version and the CPU kernels' Highway targets.
#include "rotary/build.hpp"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernel/backend.hpp"
#include "math/hd.hpp"
#include "rotary/rotary.h"
#include "rotary/rotary.hpp"
#include "support/oracle.hpp"

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

namespace rotary {
namespace {

// The backend table: every entry runs the same call to the same bits (the reference's), build_info
// lists the available ones by the names apply's Backend has, and `automatic` is the CPU's.
TEST(Backends, EveryEntryRunsTheSameCallToTheSameBitsAndBuildInfoListsThem) {
  const Schedule s = make_schedule(Spec{.head_dim = 48, .rotary_dim = 32, .pairing = Pairing::interleaved,
                                        .schedule = ScheduleType::yarn, .factor = 4.0,
                                        .original_max_position = 2048});
  const std::vector<int64_t> positions = {0, 7, 4096, 131071, 2147483647, 99};
  std::vector<float> q0(2 * 3 * 5 * 48), k0(2 * 3 * 2 * 48);
  for (size_t i = 0; i < q0.size(); ++i) q0[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  for (size_t i = 0; i < k0.size(); ++i) k0[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i)));
  auto run = [&](Backend backend) {
    std::vector<float> q = q0, k = k0;
    apply(s, ApplyArgs{.q = TensorView::bshd(q.data(), DType::f32, 2, 3, 5, 48),
                       .k = TensorView::bshd(k.data(), DType::f32, 2, 3, 2, 48),
                       .positions = Positions::per_token(positions), .backend = backend});
    q.insert(q.end(), k.begin(), k.end());
    return q;
  };
  const std::vector<float> reference = run(Backend::reference);
  std::vector<std::string> names;
  for (const detail::BackendEntry& entry : detail::backends()) {
    ASSERT_TRUE(entry.available()) << entry.name;
    EXPECT_EQ(run(entry.backend), reference) << entry.name;
    names.emplace_back(entry.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"reference", "cpu"}));
  EXPECT_EQ(build_info().backends, names);
  EXPECT_EQ(detail::backend_entry(Backend::automatic).backend, Backend::cpu);
  EXPECT_ROTARY_ERROR(detail::backend_entry(static_cast<Backend>(7)), "backend=7 is not automatic, reference or cpu");
}

// ROTARY_DASSERT checks invariants in the sanitizer build (ROTARY_DEBUG_ASSERTS), and compiles to
// nothing elsewhere (the condition not even evaluated).
TEST(DebugAssert, ChecksOnlyInTheSanitizerBuild) {
  int evaluated = 0;
  [[maybe_unused]] const auto count = [&] { return ++evaluated > 0; };
  ROTARY_DASSERT(count());
#if defined(ROTARY_DEBUG_ASSERTS)
  EXPECT_EQ(evaluated, 1);
  EXPECT_DEATH(ROTARY_DASSERT(evaluated == 7), "internal invariant broken: evaluated == 7");
#else
  EXPECT_EQ(evaluated, 0);
#endif
}

}  // namespace
}  // namespace rotary
