// Strict text -> number parsing for the CLI: the whole text must be one number.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rotary::cli {

/// Throws rotary::Error "--option='text' is not a number" (or integer).
double parse_double(std::string_view text, std::string_view option);
int64_t parse_int(std::string_view text, std::string_view option);
/// Comma-separated lists; empty items are errors.
std::vector<double> parse_double_list(std::string_view text, std::string_view option);
std::vector<int64_t> parse_int_list(std::string_view text, std::string_view option);

}  // namespace rotary::cli
