#include "rotary/table.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cpu/cpu.hpp"
#include "kernel/args.hpp"
#include "rotary/angle.hpp"
#include "rotary/error.hpp"

namespace rotary {

std::string_view to_string(AngleMode mode) {
  switch (mode) {
    case AngleMode::exact: return "exact";
    case AngleMode::hf_float32: return "hf_float32";
  }
  return "?";
}

namespace {

void check_position(int64_t position, const char* what) {
  if (position < 0 || position >= max_position_limit) {
    throw Error(fmt::format("{}={} must be in [0, 2^31)", what, position));
  }
}

void check_mode(AngleMode mode) {
  if (mode != AngleMode::exact && mode != AngleMode::hf_float32) {
    throw Error(fmt::format("mode={} is not exact or hf_float32", static_cast<int>(mode)));
  }
}

// 8 * rows * pairs bytes within max_table_bytes, before anything is allocated.
void check_size(int64_t rows, int64_t pairs) {
  int64_t values = 0;
  if (__builtin_mul_overflow(rows, pairs, &values) || values > max_table_bytes / 8) {
    throw Error(fmt::format("a table of {} rows x {} pairs exceeds max_table_bytes=2^36 (8 bytes per "
                            "pair and row); build one of the positions in use, or use no table",
                            rows, pairs));
  }
}

// What hf_float32 angles need of Schedule::inv_freq_hf32, checked before a row is formed: empty or
// one value per pair, each finite, >= 0 and <= max_inv_freq.
void check_inv_freq_hf32(const Schedule& schedule, AngleMode mode) {
  if (mode == AngleMode::hf_float32) detail::check_hf_float32_frequencies(schedule);
}

}  // namespace

namespace detail {

void check_hf_float32_frequencies(const Schedule& schedule) {
  const auto& hf32 = schedule.inv_freq_hf32;
  if (hf32.empty()) return;
  if (static_cast<int64_t>(hf32.size()) != schedule.pairs()) {
    throw Error(fmt::format("inv_freq_hf32 has {} values but rotary_dim/2={} (empty: the float32 "
                            "nearest inv_freq)", hf32.size(), schedule.pairs()));
  }
  for (size_t i = 0; i < hf32.size(); ++i) {
    if (!(hf32[i] >= 0 && hf32[i] <= max_inv_freq)) {
      throw Error(fmt::format("inv_freq_hf32[{}]={} (transformers' float32 inv_freq) must be finite, "
                              ">= 0 and <= 2^20 for hf_float32 angles",
                              i, std::isnan(hf32[i]) ? std::fabs(hf32[i]) : hf32[i]));  // "nan", never "-nan"
    }
  }
}

}  // namespace detail

namespace {

// Pair i's frequency in transformers' float32 pipeline: the Schedule's own (make_schedule computes
// transformers' float32 inv_freq), else the float32 nearest inv_freq (a Schedule built by hand).
float hf_float32_frequency(const Schedule& schedule, size_t i) {
  return schedule.inv_freq_hf32.empty() ? static_cast<float>(schedule.inv_freq[i]) : schedule.inv_freq_hf32[i];
}

void fill_row(const Schedule& schedule, int64_t position, float* cos_out, float* sin_out,
              AngleMode mode) {
  const double factor = schedule.attention_factor;
  const int64_t pairs = schedule.pairs();
  if (mode == AngleMode::hf_float32) {
    const auto p32 = static_cast<float>(position);
    const auto g32 = static_cast<float>(factor);
    for (int64_t i = 0; i < pairs; ++i) {
      const float angle = hf_float32_frequency(schedule, static_cast<size_t>(i)) * p32;
      const CosSin cs = cos_sin_of(angle);
      cos_out[i] = static_cast<float>(cs.cos) * g32;
      sin_out[i] = static_cast<float>(cs.sin) * g32;
    }
    return;
  }
  // The vectorised exact row apply computes on the fly: the same bits as exact_cos_sin pair by pair
  // times factor, rounded once to float (test_exact_angle), about 20 times faster.
  detail::cos_sin_row_f32(static_cast<double>(position), nullptr, schedule.inv_freq.data(), pairs, factor, 1.0f,
                          cos_out, sin_out);
}

}  // namespace

Table::Table(const Schedule& schedule, int64_t rows) : schedule_(schedule), rows_(rows) {
  validate(schedule);
  check_size(rows, schedule.pairs());
  const auto size = static_cast<size_t>(rows * schedule.pairs());
  cos_.resize(size);
  sin_.resize(size);
}

Table Table::range(const Schedule& schedule, int64_t first, int64_t count, AngleMode mode) {
  check_mode(mode);
  check_inv_freq_hf32(schedule, mode);
  check_position(first, "first");
  if (count < 0 || count > max_position_limit - first) {
    throw Error(fmt::format("count={} must be in [0, 2^31 - first] with first={}", count, first));
  }
  Table table(schedule, count);
  table.mode_ = mode;
  table.first_ = first;
  table.fill();
  return table;
}

Table Table::at(const Schedule& schedule, std::span<const int64_t> positions, AngleMode mode) {
  check_mode(mode);
  check_inv_freq_hf32(schedule, mode);
  for (int64_t p : positions) check_position(p, "position");
  // Consecutive positions are a range: row_of is then O(1) instead of a binary search.
  bool consecutive = !positions.empty();
  for (size_t i = 1; consecutive && i < positions.size(); ++i) {
    consecutive = positions[i] == positions[0] + static_cast<int64_t>(i);
  }
  if (consecutive) return range(schedule, positions[0], static_cast<int64_t>(positions.size()), mode);
  Table table(schedule, static_cast<int64_t>(positions.size()));
  table.mode_ = mode;
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
  auto fill_one = [&](int64_t row) {
    fill_row(schedule_, position(row), cos_.data() + row * pairs, sin_.data() + row * pairs, mode_);
  };
  // Below this many angles (~60 us of exact cos/sin) a fork/join gains little, and on a loaded
  // machine waiting for a team can take milliseconds (measured: 8 ms for 5 rows once in 41).
  constexpr int64_t kParallelAngles = int64_t{1} << 10;
  if (rows_ * pairs < kParallelAngles) {
    for (int64_t row = 0; row < rows_; ++row) fill_one(row);
    return;
  }
  const int team = detail::useful_threads(0, rows_);
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t row = 0; row < rows_; ++row) fill_one(row);
}

void table_row(const Schedule& schedule, int64_t position, float* cos_out, float* sin_out,
               AngleMode mode) {
  validate(schedule);
  check_mode(mode);
  check_inv_freq_hf32(schedule, mode);
  check_position(position, "position");
  if (cos_out == nullptr || sin_out == nullptr) throw Error("table_row: cos_out or sin_out is null");
  fill_row(schedule, position, cos_out, sin_out, mode);
}

Float32Drift hf_float32_drift(const Schedule& schedule, int64_t position) {
  validate(schedule);
  check_inv_freq_hf32(schedule, AngleMode::hf_float32);
  check_position(position, "position");
  const auto pairs = static_cast<size_t>(schedule.pairs());
  std::vector<float> exact_c(pairs), exact_s(pairs), f32_c(pairs), f32_s(pairs);
  fill_row(schedule, position, exact_c.data(), exact_s.data(), AngleMode::exact);
  fill_row(schedule, position, f32_c.data(), f32_s.data(), AngleMode::hf_float32);
  Float32Drift drift;
  const auto p = static_cast<double>(position);
  for (size_t i = 0; i < pairs; ++i) {
    const double f = schedule.inv_freq[i];
    const double angle32 = hf_float32_frequency(schedule, i) * static_cast<float>(position);
    // exact p*f = hi + lo; error = (angle32 - hi) - lo, the first difference exact (Sterbenz-close)
    const double hi = p * f;
    const double lo = std::fma(p, f, -hi);
    const double error = std::fabs((angle32 - hi) - lo);
    if (error > drift.max_angle_error) {
      drift.max_angle_error = error;
      drift.worst_pair = static_cast<int64_t>(i);
    }
    for (auto [a, b] : {std::pair{exact_c[i], f32_c[i]}, std::pair{exact_s[i], f32_s[i]}}) {
      const double ulp = std::max(std::ldexp(1.0, std::ilogb(std::max(std::fabs(a), 0x1p-126f)) - 23), 0x1p-149);
      drift.max_ulps = std::max(drift.max_ulps, std::fabs(static_cast<double>(a) - b) / ulp);
    }
  }
  return drift;
}

}  // namespace rotary
