// `rotary demo`: the main job on a built-in default model (Llama-3.1-8B).
#pragma once

#include <cstdint>
#include <ostream>

namespace rotary::cli {

struct DemoOptions {
  uint64_t seed = 20240723;
};

/// Builds the schedule and a 131072-position table, rotates a prefill and a decode step, checks
/// every result against an independent quad-precision computation, and prints a report.
/// Returns 0 when every check holds, 1 otherwise.
int run_demo(const DemoOptions& options, std::ostream& out);

}  // namespace rotary::cli
