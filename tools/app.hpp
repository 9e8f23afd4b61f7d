// What the two command-line tools share: `rotary` (the user's) and `rotary-dev` (demo and bench):
// strict parsing of a CLI11 app and one-line errors with the exit statuses the README gives.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}

namespace rotary::cli {

/// `message` as one line of bounded length: control bytes written as \xHH.
std::string one_line(std::string_view message);

/// "a,b,c" -> {"a", "b", "c"}; empty text leaves `into` (the defaults) as it is.
void split_list(const std::string& text, std::vector<std::string>& into);

/// Parses argv into `app` (one subcommand required), refusing an unknown subcommand, arguments no
/// option took (named in command-line order) and empty option values; throws rotary::Error.
/// Returns false when --help was printed to `out` (nothing to run).
bool parse_app(CLI::App& app, std::string_view tool, int argc, const char* const* argv, std::ostream& out);

/// Runs `body`, turning exceptions into "<tool>: error: <one line>" on `err` and the exit status:
/// 2 for bad input (rotary::Error), 1 otherwise.
int run_guarded(std::string_view tool, std::ostream& err, const std::function<int()>& body);

}  // namespace rotary::cli
