// `rotary bench`: RoPE against a memcpy of the same bytes, measured in one process.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace rotary::cli {

struct BenchOptions {
  /// Also "rerotate" and "switch" (cached keys moved by rerotate / switch_schedule), only when named:
  /// they add about a third to the default run's minutes.
  std::vector<std::string> cases = {"prefill_q", "prefill_k", "decode", "batched_decode", "mrope"};
  std::vector<std::string> dtypes = {"f32", "f16", "bf16"};
  std::vector<std::string> pairings = {"half", "interleaved"};
  /// apply's angles; rerotate's rows use its own cos/sin ("caller"), switch's "on_the_fly".
  std::vector<std::string> angles = {"table", "on_the_fly"};
  std::vector<std::string> placement = {"inplace", "outofplace"};
  std::vector<int> threads;  ///< empty: 1 and all
  int reps = 15;             ///< timed repetitions per side, after warm-up; medians reported
  bool json = false;
  uint64_t seed = 1;
};

/// Validates the options (throws rotary::Error naming the bad value), runs, prints a table or JSON.
/// Each row carries its speed target (a ratio to memcpy; for `mrope`, to the same call with one
/// stream; rerotate and switch, prefill's; target_of in tools/bench.cpp) and whether the measured
/// median meets it.
int run_bench(const BenchOptions& options, std::ostream& out);

}  // namespace rotary::cli
