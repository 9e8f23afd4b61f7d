// Internal: a user's text as it may appear in an error message.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace rotary::detail {

/// Longest excerpt of a user's value that an error message echoes.
inline constexpr size_t kMaxEchoedChars = 100;

/// `text` fit for one line of an error message: at most kMaxEchoedChars characters of it (then
/// "... (N bytes)"), with NUL, control and non-ASCII bytes written as \xHH, so a 4 MB list, a NUL
/// byte or a newline in a user's value never makes a 4 MB, cut or multi-line message. No quotes added.
inline std::string excerpt(std::string_view text, size_t limit = kMaxEchoedChars) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  size_t shown = 0;
  for (; shown < text.size() && shown < limit; ++shown) {
    const auto c = static_cast<unsigned char>(text[shown]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else if (c == '\\') {
      out += "\\\\";
    } else {
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  if (shown < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace rotary::detail
