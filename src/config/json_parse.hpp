// Internal: JSON from users (config.json, .safetensors headers), parsed with a nesting limit and
// described in error messages without recursion.
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "rotary/error.hpp"
#include "../text.hpp"

namespace rotary::detail {

/// Deepest nesting of arrays and objects accepted in user JSON. Real configs nest 4 levels
/// (text_config.rope_parameters.full_attention.long_factor); anything far deeper is hostile, and
/// would make recursive code (copies, dump) overflow the stack.
inline constexpr int kMaxJsonDepth = 64;

/// The nesting depth of `text` if it stays within kMaxJsonDepth; throws rotary::Error naming
/// `what` and the byte offset otherwise. One pass, no recursion; strings (and escapes in them) are
/// skipped, so brackets inside strings do not count. Malformed text is left to the parser.
inline void check_json_depth(std::string_view text, std::string_view what) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        throw Error(fmt::format("{} nests arrays/objects deeper than {} levels (at byte {})", what,
                                kMaxJsonDepth, i));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

/// Parses user JSON: depth checked first (check_json_depth), then nlohmann's iterative parser.
/// Throws rotary::Error "<what> is not valid JSON: ..." (the parser's message, excerpted).
inline nlohmann::json parse_json(std::string_view text, std::string_view what) {
  check_json_depth(text, what);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{} is not valid JSON: {}", what, excerpt(e.what(), 200)));
  }
}

/// A JSON value for an error message, never recursing: scalars as JSON text (strings excerpted),
/// arrays and objects by their size ("a list of 3 items", "an object of 2 keys").
inline std::string describe(const nlohmann::json& v) {
  if (v.is_string()) return "'" + excerpt(v.get_ref<const std::string&>()) + "'";
  if (v.is_array()) return fmt::format("a list of {} item{}", v.size(), v.size() == 1 ? "" : "s");
  if (v.is_object()) return fmt::format("an object of {} key{}", v.size(), v.size() == 1 ? "" : "s");
  return excerpt(v.dump());  // null, boolean or number: a few characters
}

}  // namespace rotary::detail
