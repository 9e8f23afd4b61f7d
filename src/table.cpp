#include "rotary/table.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "rotary/angle.hpp"
#include "rotary/error.hpp"

namespace rotary {
namespace {

void check_position(int64_t position, const char* what) {
  if (position < 0 || position >= max_position_limit) {
    throw Error(fmt::format("{}={} must be in [0, 2^31)", what, position));
  }
}

void fill_row(const Schedule& schedule, int64_t position, float* cos_out, float* sin_out) {
  const double factor = schedule.attention_factor;
  const int64_t pairs = schedule.pairs();
  for (int64_t i = 0; i < pairs; ++i) {
    const CosSin cs = exact_cos_sin(position, schedule.inv_freq[static_cast<size_t>(i)]);
    // One rounding to float: the double product carries ~2^-52 relative error.
    cos_out[i] = static_cast<float>(cs.cos * factor);
    sin_out[i] = static_cast<float>(cs.sin * factor);
  }
}

}  // namespace

Table::Table(const Schedule& schedule, int64_t rows) : schedule_(schedule), rows_(rows) {
  validate(schedule);
  const auto size = static_cast<size_t>(rows * schedule.pairs());
  cos_.resize(size);
  sin_.resize(size);
}

Table Table::range(const Schedule& schedule, int64_t first, int64_t count) {
  check_position(first, "first");
  if (count < 0 || count > max_position_limit - first) {
    throw Error(fmt::format("count={} must be in [0, 2^31 - first] with first={}", count, first));
  }
  Table table(schedule, count);
  table.first_ = first;
  table.fill();
  return table;
}

Table Table::at(const Schedule& schedule, std::span<const int64_t> positions) {
  for (int64_t p : positions) check_position(p, "position");
  Table table(schedule, static_cast<int64_t>(positions.size()));
  table.is_range_ = false;
  table.positions_.assign(positions.begin(), positions.end());
  table.lookup_.reserve(positions.size());
  for (size_t row = 0; row < positions.size(); ++row) {
    table.lookup_.emplace_back(positions[row], static_cast<int64_t>(row));
  }
  std::sort(table.lookup_.begin(), table.lookup_.end());
  table.fill();
  return table;
}

std::optional<int64_t> Table::row_of(int64_t position) const {
  if (is_range_) {
    if (position < first_ || position - first_ >= rows_) return std::nullopt;
    return position - first_;
  }
  auto it = std::lower_bound(lookup_.begin(), lookup_.end(), std::pair<int64_t, int64_t>{position, 0});
  if (it == lookup_.end() || it->first != position) return std::nullopt;
  return it->second;
}

void Table::fill() {
  const int64_t pairs = schedule_.pairs();
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows_; ++row) {
    fill_row(schedule_, position(row), cos_.data() + row * pairs, sin_.data() + row * pairs);
  }
}

void table_row(const Schedule& schedule, int64_t position, float* cos_out, float* sin_out) {
  validate(schedule);
  check_position(position, "position");
  fill_row(schedule, position, cos_out, sin_out);
}

}  // namespace rotary
