// Tables: the 1 ulp contract against MPFR for every schedule over [0, 2^31), and the container.
#include <algorithm>
#include <random>

#include "rotary/table.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

constexpr double kTableUlps = 1.0;  // DESIGN.md §3

struct Named {
  const char* name;
  Spec spec;
  std::optional<int64_t> seq_len;
};

std::vector<Named> every_schedule() {
  std::vector<double> short_f(64), long_f(64);
  for (int i = 0; i < 64; ++i) {
    short_f[static_cast<size_t>(i)] = 1.0 + 0.05 * i;
    long_f[static_cast<size_t>(i)] = 1.0 + 0.9 * i;
  }
  return {
      {"default", Spec{.head_dim = 128}, {}},
      {"linear", Spec{.head_dim = 128, .schedule = ScheduleType::linear, .factor = 4.0}, {}},
      {"ntk", Spec{.head_dim = 128, .schedule = ScheduleType::ntk, .factor = 8.0}, {}},
      {"dynamic", Spec{.head_dim = 128, .schedule = ScheduleType::dynamic, .factor = 2.0,
                       .max_position = 4096}, 65536},
      {"yarn", Spec{.head_dim = 128, .base = 1e6, .schedule = ScheduleType::yarn, .factor = 4.0,
                    .original_max_position = 32768}, {}},
      {"llama3", Spec{.head_dim = 128, .base = 500000, .schedule = ScheduleType::llama3,
                      .factor = 8.0, .original_max_position = 8192, .low_freq_factor = 1.0,
                      .high_freq_factor = 4.0}, {}},
      {"longrope", Spec{.head_dim = 128, .schedule = ScheduleType::longrope,
                        .original_max_position = 4096, .max_position = 131072,
                        .short_factor = short_f, .long_factor = long_f}, 131072},
      {"monotone", Spec{.head_dim = 128, .schedule = ScheduleType::monotone, .max_length = 1 << 20}, {}},
      {"partial", Spec{.head_dim = 80, .rotary_dim = 32, .base = 10000}, {}},
  };
}

std::vector<int64_t> positions_to_check(const Schedule& schedule, uint64_t seed) {
  std::vector<int64_t> out = {0, 1, 2, 3, 4095, 4096, 8191, 8192, 32768, 131071, 131072, 1 << 20,
                              max_position_limit - 2, max_position_limit - 1};
  for (int k = 1; k < 31; ++k) {
    out.push_back((int64_t{1} << k) - 1);
    out.push_back((int64_t{1} << k) + 1);
  }
  // Near multiples of π/2 for the first (fastest) pairs, where cos or sin is smallest.
  for (size_t i = 0; i < std::min<size_t>(4, schedule.inv_freq.size()); ++i) {
    for (int64_t p : test::near_quarter_turns(schedule.inv_freq[i], max_position_limit - 1)) {
      out.push_back(p);
      if (p > 0) out.push_back(p - 1);
      out.push_back(p + 1);
    }
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> any(0, max_position_limit - 1);
  for (int n = 0; n < 400; ++n) out.push_back(any(rng));
  return out;
}

TEST(TableAccuracy, EverySchedulePositionsUpTo2Pow31) {
  double worst_overall = 0;
  for (const Named& c : every_schedule()) {
    const Schedule schedule = make_schedule(c.spec, c.seq_len);
    const std::vector<int64_t> positions = positions_to_check(schedule, 11);
    const Table table = Table::at(schedule, positions);
    double worst = 0;
    int64_t worst_position = 0;
    int64_t worst_pair = 0;
    for (int64_t row = 0; row < table.rows(); ++row) {
      for (int64_t i = 0; i < table.pairs(); ++i) {
        const double f = schedule.inv_freq[static_cast<size_t>(i)];
        const int64_t p = table.position(row);
        for (bool sine : {false, true}) {
          const float stored = sine ? table.sin_row(row)[i] : table.cos_row(row)[i];
          const double ulps = test::table_error_ulps(stored, p, f, schedule.attention_factor, sine);
          if (ulps > worst) {
            worst = ulps;
            worst_position = p;
            worst_pair = i;
          }
          ASSERT_LE(ulps, kTableUlps) << c.name << (sine ? " sin" : " cos") << " position " << p
                                      << " pair " << i << " stored " << stored;
        }
      }
    }
    std::printf("%-9s %4zu positions x %2lld pairs: worst %.4f ulp (position %lld, pair %lld)\n",
                c.name, positions.size(), static_cast<long long>(table.pairs()), worst,
                static_cast<long long>(worst_position), static_cast<long long>(worst_pair));
    worst_overall = std::max(worst_overall, worst);
  }
  std::printf("worst table error over every schedule: %.4f ulp\n", worst_overall);
}

TEST(TableAccuracy, AttentionFactorIsInsideTheRounding) {
  const Schedule schedule = make_schedule(Spec{.head_dim = 64, .base = 1e6, .schedule = ScheduleType::yarn,
                                               .factor = 16.0, .original_max_position = 4096});
  ASSERT_GT(schedule.attention_factor, 1.2);
  const Table table = Table::range(schedule, max_position_limit - 300, 300);
  for (int64_t row = 0; row < table.rows(); ++row) {
    for (int64_t i = 0; i < table.pairs(); ++i) {
      ASSERT_LE(test::table_error_ulps(table.cos_row(row)[i], table.position(row),
                                       schedule.inv_freq[static_cast<size_t>(i)],
                                       schedule.attention_factor, false),
                kTableUlps);
    }
  }
}

TEST(Table, RangeAndListAgree) {
  const Schedule schedule = make_schedule(Spec{.head_dim = 16});
  const Table range = Table::range(schedule, 1000, 50);
  std::vector<int64_t> listed = {1049, 1000, 1020, 1020};
  const Table list = Table::at(schedule, listed);
  EXPECT_EQ(range.rows(), 50);
  EXPECT_EQ(range.position(7), 1007);
  EXPECT_EQ(list.position(0), 1049);
  for (int64_t r = 0; r < list.rows(); ++r) {
    const int64_t rr = *range.row_of(list.position(r));
    for (int64_t i = 0; i < 8; ++i) {
      EXPECT_EQ(list.cos_row(r)[i], range.cos_row(rr)[i]);
      EXPECT_EQ(list.sin_row(r)[i], range.sin_row(rr)[i]);
    }
  }
  EXPECT_EQ(*list.row_of(1049), 0);
  EXPECT_EQ(*list.row_of(1000), 1);
  EXPECT_TRUE(list.row_of(1020).has_value());
  EXPECT_FALSE(list.row_of(1001).has_value());
  EXPECT_FALSE(range.row_of(999).has_value());
  EXPECT_FALSE(range.row_of(1050).has_value());
  std::vector<float> c(8), s(8);
  table_row(schedule, 1033, c.data(), s.data());
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(c[static_cast<size_t>(i)], range.cos_row(33)[i]);
    EXPECT_EQ(s[static_cast<size_t>(i)], range.sin_row(33)[i]);
  }
}

TEST(Table, Errors) {
  const Schedule schedule = make_schedule(Spec{.head_dim = 16});
  EXPECT_ROTARY_ERROR(Table::range(schedule, -1, 4), "first=-1 must be in [0, 2^31)");
  EXPECT_ROTARY_ERROR(Table::range(schedule, 0, -4), "count=-4 must be in [0, 2^31 - first]");
  EXPECT_ROTARY_ERROR(Table::range(schedule, max_position_limit - 2, 3), "count=3");
  const std::vector<int64_t> bad = {0, 5, max_position_limit};
  EXPECT_ROTARY_ERROR(Table::at(schedule, bad), "position=2147483648 must be in [0, 2^31)");
  Schedule broken = schedule;
  broken.inv_freq.resize(3);
  EXPECT_ROTARY_ERROR(Table::range(broken, 0, 4), "inv_freq has 3 values but rotary_dim/2=8");
  std::vector<float> c(8), s(8);
  EXPECT_ROTARY_ERROR(table_row(schedule, -3, c.data(), s.data()), "position=-3");
  EXPECT_EQ(Table::range(schedule, 5, 0).rows(), 0);
}

TEST(Table, RefusesTablesBeyondTheSizeLimitBeforeAllocating) {
  static_assert(max_table_bytes == int64_t{1} << 36);
  // Every position of a 128-wide head: 2^31 rows x 64 pairs x 8 bytes = 1 TiB.
  const Schedule wide = make_schedule(Spec{.head_dim = 128});
  EXPECT_ROTARY_ERROR(Table::range(wide, 0, max_position_limit),
                      "a table of 2147483648 rows x 64 pairs exceeds max_table_bytes=2^36");
  // At the limit: 2^36 / 8 = 2^33 values; 2^27 rows of 64 pairs is exactly that, one more is not.
  EXPECT_ROTARY_ERROR(Table::range(wide, 0, (int64_t{1} << 27) + 1), "134217729 rows x 64 pairs");
  // The widest head a Spec allows.
  EXPECT_ROTARY_ERROR(Table::range(make_schedule(Spec{.head_dim = 1 << 20}), 0, 1 << 30),
                      "1073741824 rows x 524288 pairs exceeds");
}

TEST(Table, EnumsOutOfRangeAreNamedByNumber) {
  const Schedule schedule = make_schedule(Spec{.head_dim = 16});
  const auto bad = static_cast<AngleMode>(7);
  EXPECT_ROTARY_ERROR(Table::range(schedule, 0, 4, bad), "mode=7 is not exact or hf_float32");
  EXPECT_ROTARY_ERROR(Table::at(schedule, std::vector<int64_t>{1, 2}, bad), "mode=7 is not exact or hf_float32");
  std::vector<float> c(8), s(8);
  EXPECT_ROTARY_ERROR(table_row(schedule, 3, c.data(), s.data(), bad), "mode=7");
  EXPECT_ROTARY_ERROR(table_row(schedule, 3, nullptr, s.data()), "cos_out or sin_out is null");
}

}  // namespace
}  // namespace rotary

namespace rotary {
namespace {

// --angles hf-float32, written out: angle = fl32(inv_freq_hf32 * fl32(p)); value = fl32(fl32(cos angle) * fl32(g)),
// with cos of the float angle from MPFR (position 1, frequency = the float angle: an exact product).
TEST(TableHfFloat32, MatchesTheWrittenOutFloat32Formula) {
  const Schedule s = make_schedule(Spec{.head_dim = 64, .base = 500000, .schedule = ScheduleType::yarn,
                                        .factor = 8.0, .original_max_position = 8192});
  const std::vector<int64_t> positions = {0, 1, 4095, 8191, 131071, 1000003, max_position_limit - 1};
  const Table t = Table::at(s, positions, AngleMode::hf_float32);
  EXPECT_EQ(t.mode(), AngleMode::hf_float32);
  int differing_from_exact = 0;
  const Table exact = Table::at(s, positions);
  for (int64_t r = 0; r < t.rows(); ++r) {
    for (int64_t i = 0; i < t.pairs(); ++i) {
      const float angle = s.inv_freq_hf32[static_cast<size_t>(i)] * static_cast<float>(positions[r]);
      const test::Exact e = test::mpfr_cos_sin(1, static_cast<double>(angle));
      const float g = static_cast<float>(s.attention_factor);
      EXPECT_EQ(t.cos_row(r)[i], static_cast<float>(e.cos) * g) << "position " << positions[r] << " pair " << i;
      EXPECT_EQ(t.sin_row(r)[i], static_cast<float>(e.sin) * g) << "position " << positions[r] << " pair " << i;
      differing_from_exact += t.cos_row(r)[i] != exact.cos_row(r)[i];
    }
  }
  EXPECT_GT(differing_from_exact, 20);  // the float32 pipeline really is different at long range
  const Float32Drift drift = hf_float32_drift(s, 131071);
  EXPECT_GT(drift.max_angle_error, 1e-4);
  EXPECT_LT(drift.max_angle_error, 1e-1);
  EXPECT_EQ(hf_float32_drift(s, 0).max_angle_error, 0.0);
}

}  // namespace
}  // namespace rotary
