// The `rotary-dev` tool as a function, so tests can drive it without a process.
#pragma once

#include <ostream>

namespace rotary::cli {

/// Runs `rotary-dev` (demo, bench). Returns the exit status: 0 on success, 2 on bad input (one
/// line on `err`), 1 on other failures.
int run_dev(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace rotary::cli
