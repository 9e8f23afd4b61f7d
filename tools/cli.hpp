// The `rotary` command-line tool as a function, so tests can drive it without a process.
#pragma once

#include <ostream>

namespace rotary::cli {

/// Runs the tool. Returns the exit status: 0 on success, 2 on bad input (one line on `err`).
int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace rotary::cli
