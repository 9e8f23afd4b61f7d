#include "parse.hpp"

#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "../src/text.hpp"
#include "rotary/error.hpp"

namespace rotary::cli {

double parse_double(std::string_view text, std::string_view option) {
  double value = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (text.size() > 1 && first[0] == '+' && first[1] != '-') ++first;
  auto [ptr, ec] = std::from_chars(first, last, value);
  if (text.empty() || ec != std::errc() || ptr != last) {
    throw Error(fmt::format("{}='{}' is not a number", option, detail::excerpt(text)));
  }
  return value;
}

int64_t parse_int(std::string_view text, std::string_view option) {
  int64_t value = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (text.size() > 1 && first[0] == '+' && first[1] != '-') ++first;
  auto [ptr, ec] = std::from_chars(first, last, value);
  if (text.empty() || ec != std::errc() || ptr != last) {
    throw Error(fmt::format("{}='{}' is not an integer in [-2^63, 2^63)", option, detail::excerpt(text)));
  }
  return value;
}

namespace {
template <class T, class F>
std::vector<T> parse_list(std::string_view text, std::string_view option, F parse_one) {
  std::vector<T> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string_view item =
        text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (item.empty()) {
      throw Error(fmt::format("{}='{}' has an empty item at {}", option, detail::excerpt(text), out.size()));
    }
    out.push_back(parse_one(item, option));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}
}  // namespace

std::vector<double> parse_double_list(std::string_view text, std::string_view option) {
  return parse_list<double>(text, option, parse_double);
}

std::vector<int64_t> parse_int_list(std::string_view text, std::string_view option) {
  return parse_list<int64_t>(text, option, parse_int);
}

void require_finite_for_json(double value, std::string_view what) {
  if (!std::isfinite(value)) {
    throw Error(fmt::format("{}={} is not finite; --json prints only finite numbers", what, value));
  }
}

double json_rounded(double value, int digits) {
  const double scale = std::pow(10.0, digits);
  const double r = std::round(value * scale) / scale;
  return std::isfinite(r) ? r : value;
}

}  // namespace rotary::cli
