// Numbers in and out of the CLI's text: strict parsing (the whole text must be one number; errors
// echo at most ~100 characters of it), and the finiteness --json output needs.
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

/// JSON has no inf or nan: throws rotary::Error "<what>=inf is not finite; --json prints only finite
/// numbers" unless `value` is finite. Call before printing a number as JSON.
void require_finite_for_json(double value, std::string_view what);
/// `value` rounded to `digits` decimals, for JSON output a reader can scan (123.4, not 123.4000000000001).
double json_rounded(double value, int digits);

}  // namespace rotary::cli
