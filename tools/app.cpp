#include "app.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <new>

#include "../src/text.hpp"
#include "rotary/error.hpp"

namespace rotary::cli {
namespace {

using detail::excerpt;

// Before CLI11 sees the arguments: a first word that is no subcommand is named as such.
void refuse_unknown_subcommand(CLI::App& app, int argc, const char* const* argv) {
  if (argc < 2 || argv[1][0] == '-') return;
  const std::string word = argv[1];
  std::string known;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == word) return;
    known += (known.empty() ? "" : ", ") + sub->get_name();
  }
  throw Error(fmt::format("unknown subcommand '{}' (known: {})", excerpt(word), known));
}

// After a parse error: arguments no option took are named first, in command-line order, each
// excerpted (CLI11's own message lists them last to first, whole, and cut to a prefix loses the option).
void refuse_unexpected_arguments(const CLI::App& app, std::string_view tool) {
  const CLI::App* command = &app;
  for (const CLI::App* sub : app.get_subcommands()) {
    if (!sub->remaining().empty()) command = sub;
  }
  const std::vector<std::string> extra = command->remaining();
  if (extra.empty()) return;
  const std::string name = command == &app ? std::string(tool) : std::string(tool) + " " + command->get_name();
  std::string message = fmt::format("{} '{}' for '{}'", extra[0].starts_with('-') ? "unknown option" : "unexpected argument",
                                    excerpt(extra[0]), name);
  constexpr size_t kShown = 3;
  for (size_t i = 1; i < extra.size() && i <= kShown; ++i) {
    message += fmt::format("{}'{}'", i == 1 ? " (then " : ", ", excerpt(extra[i]));
  }
  if (extra.size() > kShown + 1) message += fmt::format(" and {} more", extra.size() - kShown - 1);
  if (extra.size() > 1) message += ")";
  throw Error(message);
}

// An option given an empty value (`--offset ""`) is an error, never its default: a script whose
// variable came out empty would otherwise run with a setting it did not ask for.
void refuse_empty_values(const CLI::App& app) {
  for (const CLI::App* command : app.get_subcommands()) {
    for (const CLI::Option* option : command->get_options()) {
      if (option->get_type_size() == 0 || option->count() == 0) continue;  // flags; not given
      for (const std::string& value : option->results()) {
        if (value.empty()) {
          throw Error(fmt::format("{}='' is empty (leave the option out for its default)", option->get_name()));
        }
      }
    }
  }
}

}  // namespace

// The longest line of an error message, whatever a library or system message holds.
constexpr size_t kMaxMessageChars = 2000;

// `message` as one line of bounded length: control bytes written as \xHH (a message keeps at most
// ~100 characters of any user value, but a system's or a dependency's message may hold anything).
std::string one_line(std::string_view message) {
  std::string out;
  for (size_t i = 0; i < message.size() && out.size() < kMaxMessageChars; ++i) {
    const auto c = static_cast<unsigned char>(message[i]);
    if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (out.size() >= kMaxMessageChars) out += fmt::format("... ({} bytes)", message.size());
  return out;
}

// "a,b,c" -> {"a", "b", "c"}; empty text leaves `into` (the defaults) as it is.
void split_list(const std::string& text, std::vector<std::string>& into) {
  if (text.empty()) return;
  into.clear();
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    into.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

bool parse_app(CLI::App& app, std::string_view tool, int argc, const char* const* argv, std::ostream& out) {
  refuse_unknown_subcommand(app, argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help
      out << app.help(app.get_subcommands().empty() ? "" : app.get_subcommands()[0]->get_name());
      return false;
    }
    refuse_unexpected_arguments(app, tool);
    std::string message = e.what();
    if (auto nl = message.find('\n'); nl != std::string::npos) message.resize(nl);
    throw Error(excerpt(message, 300));  // CLI11 quotes the user's arguments
  }
  refuse_empty_values(app);
  return true;
}

int run_guarded(std::string_view tool, std::ostream& err, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    err << tool << ": error: " << one_line(e.what()) << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    err << tool << ": error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    err << tool << ": error: " << one_line(e.what()) << "\n";
    return 1;
  }
}

}  // namespace rotary::cli
