// detail::cos_sin_of_product (src/math/exact_angle.hpp), the one scalar exact cos/sin of host and
// device code, against the Highway lanes (CosSinLanes, reached through detail::cos_sin_row) on
// every target this build compiles (hwy::SetSupportedTargetsForTest): the same bits for every
// argument, over a million random ones and the awkward ones (angles near multiples of π/2 and
// of π/4, exact ties of the quadrant's rounding, position 0, inv_freq 0, subnormal frequencies,
// the ends of the range). Then what that buys: a Table holds bit for bit the float rows that the
// kernels compute on the fly, on every target; and golden bits, certified by MPFR, that the former
// libm-based evaluation (glibc's sincos of the reduced angle) rounds to the other float.
#include <hwy/tests/hwy_gtest.h>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "cpu/cpu.hpp"
#include "math/exact_angle.hpp"
#include "rotary/angle.hpp"
#include "rotary/schedule.hpp"
#include "rotary/table.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

// Equal bits, or both NaN (arguments outside the contract give NaN on every path).
bool same(double a, double b) {
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}
bool same(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

struct Arguments {
  std::vector<double> position;
  std::vector<double> inv_freq;
  void add(double p, double f) {
    position.push_back(p);
    inv_freq.push_back(f);
  }
};

constexpr double kPio2 = 0x1.921fb54442d18p+0;
constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;

// Positions x whose product with 2/π (as the reduction rounds it) is exactly m + 1/2: k's
// rounding is a tie there, which round-half-even and round-half-away settle differently.
void add_quadrant_ties(Arguments& a) {
  std::mt19937_64 rng(5);
  int found = 0;
  for (int n = 0; n < 200000 && found < 400; ++n) {
    const double target = static_cast<double>(rng() % (uint64_t{1} << (1 + n % 31))) + 0.5;
    double x = target / kTwoOverPi;
    for (int step = 0; step < 4; ++step) x = std::nextafter(x, 0.0);
    for (int step = 0; step < 9; ++step, x = std::nextafter(x, INFINITY)) {
      if (x * kTwoOverPi == target && x < static_cast<double>(max_position_limit)) {
        a.add(x, 1.0);
        ++found;
        break;
      }
    }
  }
}

// Over a million (position, inv_freq): whole and fractional positions in [0, 2^31), frequencies
// log-uniform over [1e-9, max_inv_freq], and the awkward arguments.
const Arguments& arguments() {
  static const Arguments a = [] {
    Arguments out;
    std::mt19937_64 rng(2026);
    std::uniform_int_distribution<int64_t> whole(0, max_position_limit - 1);
    std::uniform_real_distribution<double> real(0.0, static_cast<double>(max_position_limit));
    std::uniform_real_distribution<double> small(0.0, 64.0);
    std::uniform_real_distribution<double> log_freq(std::log(1e-9), std::log(max_inv_freq));
    auto freq = [&] { return std::min(std::exp(log_freq(rng)), max_inv_freq); };
    for (int n = 0; n < 500000; ++n) out.add(static_cast<double>(whole(rng)), freq());
    for (int n = 0; n < 200000; ++n) out.add(std::min(real(rng), 0x1.fffffffp+30), freq());
    for (int n = 0; n < 100000; ++n) out.add(small(rng), freq());
    // Near odd multiples of π/4: p f ≈ (m + 1/2) π/2, where k flips between two quarter turns
    // and |r| is largest; the frequency and its two neighbours.
    for (int n = 0; n < 100000; ++n) {
      const auto p = static_cast<double>(whole(rng) + 1);
      const double m = std::floor(p * freq() / kPio2);
      const double f = (m + 0.5) * kPio2 / p;
      for (double g : {std::nextafter(f, 0.0), f, std::nextafter(f, INFINITY)}) out.add(p, g);
    }
    // Near multiples of π/2 (r tiny, the cancellation the double-double reduction is for).
    for (double f :
         {1.0, 0.5, kPio2, 3.0, 1e-4, 123.456, 0.8659643233600653, 0.0625, max_inv_freq}) {
      for (int64_t p : test::near_quarter_turns(f, max_position_limit)) {
        for (int64_t q : {p - 1, p, p + 1}) {
          if (q >= 0 && q < max_position_limit) out.add(static_cast<double>(q), f);
        }
      }
    }
    // The doubles nearest m π/2 and their neighbours: r is a few ulps of the angle, so the
    // result's last bits come from the reduction's low-order terms (r's low part included).
    for (int m = 1; m <= 20000; ++m) {
      const double x = std::fma(m, kPio2, m * 0x1.1a62633145c07p-54);
      for (double y : {std::nextafter(x, 0.0), x, std::nextafter(x, INFINITY)}) {
        out.add(y, 1.0);
        out.add(1.0, y);
      }
    }
    add_quadrant_ties(out);
    // Ends of the range: position 0, inv_freq 0, the largest angle, subnormal frequencies.
    const double last = static_cast<double>(max_position_limit - 1);
    for (double f : {0.0, 1e-9, 1.0, max_inv_freq, 5e-324, 1e-310, 0x1p-1022}) {
      for (double p : {0.0, 0.5, 1.0, 2.0, 131071.0, last}) out.add(p, f);
    }
    // Outside the contract: NaN on every path.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    for (auto [p, f] : {std::pair{nan, 1.0}, std::pair{1.0, nan}, std::pair{inf, 1.0},
                        std::pair{1.0, inf}, std::pair{inf, 0.0}}) {
      out.add(p, f);
    }
    return out;
  }();
  return a;
}

// The scalar header's results, computed once (they do not depend on the target).
const std::vector<CosSin>& scalar_results() {
  static const std::vector<CosSin> out = [] {
    const Arguments& a = arguments();
    std::vector<CosSin> r(a.position.size());
    for (size_t i = 0; i < r.size(); ++i) {
      r[i] = detail::cos_sin_of_product(a.position[i], a.inv_freq[i]);
    }
    return r;
  }();
  return out;
}

class ExactAngleLanes : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(ExactAngleLanes);

TEST_P(ExactAngleLanes, ScalarEqualsEveryLaneBitForBit) {
  const Arguments& a = arguments();
  const std::vector<CosSin>& want = scalar_results();
  ASSERT_GE(want.size(), size_t{1000000});
  // 1021 pairs a row (odd): every row goes through the K-vector loop, the one-vector loop and
  // the padded tail of CosSinRowImpl.
  constexpr size_t kRow = 1021;
  std::vector<double> c(kRow), s(kRow);
  int64_t mismatches = 0;
  for (size_t first = 0; first < want.size(); first += kRow) {
    const size_t count = std::min(kRow, want.size() - first);
    detail::cos_sin_row(0.0, a.position.data() + first, a.inv_freq.data() + first,
                        static_cast<int64_t>(count), 1.0, c.data(), s.data());
    for (size_t j = 0; j < count; ++j) {
      const CosSin& w = want[first + j];
      if (same(c[j], w.cos) && same(s[j], w.sin)) continue;
      if (++mismatches <= 5) {
        ADD_FAILURE() << std::hexfloat << "position " << a.position[first + j] << " inv_freq "
                      << a.inv_freq[first + j] << ": lanes (" << c[j] << ", " << s[j]
                      << "), scalar (" << w.cos << ", " << w.sin << ")";
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << want.size() << " arguments";
}

// The library's entry points are the header compiled with the library's flags (on x86 CPUs with
// FMA, its copy that uses the instruction; this file's copy calls libm's fma on baseline x86-64).
TEST(ExactAngle, LibraryEntriesAreTheScalar) {
  const Arguments& a = arguments();
  const std::vector<CosSin>& want = scalar_results();
  for (size_t i = 0; i < want.size(); ++i) {
    const double p = a.position[i];
    const double f = a.inv_freq[i];
    const CosSin real = exact_cos_sin_real(p, f);
    ASSERT_TRUE(same(real.cos, want[i].cos) && same(real.sin, want[i].sin))
        << std::hexfloat << "exact_cos_sin_real(" << p << ", " << f << ")";
    if (p == std::floor(p) && p >= 0 && p < static_cast<double>(max_position_limit)) {
      const CosSin whole = exact_cos_sin(static_cast<int64_t>(p), f);
      ASSERT_TRUE(same(whole.cos, want[i].cos) && same(whole.sin, want[i].sin))
          << std::hexfloat << "exact_cos_sin(" << p << ", " << f << ")";
    }
    if (f == 1.0) {
      const CosSin angle = cos_sin_of(p);
      ASSERT_TRUE(same(angle.cos, want[i].cos) && same(angle.sin, want[i].sin))
          << std::hexfloat << "cos_sin_of(" << p << ")";
    }
  }
}

TEST(ExactAngle, RoundHalfEvenIgnoresTheRoundingMode) {
  // Highway's Round (the lanes' k) rounds to nearest even whatever the dynamic rounding mode.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<double, double>> cases = {
      {0.5, 0.0}, {1.5, 2.0}, {2.5, 2.0}, {3.5, 4.0}, {-0.5, -0.0}, {-1.5, -2.0}, {-2.5, -2.0},
      {0.25, 0.0}, {-0.25, -0.0}, {0.0, 0.0}, {-0.0, -0.0}, {0.49999999999999994, 0.0},
      {0.5000000000000001, 1.0}, {3.7, 4.0}, {-3.7, -4.0}, {2147483647.5, 2147483648.0},
      {0x1.fffffffffffffp+51, 0x1p+52}, {0x1.ffffffffffffep+51, 0x1.ffffffffffffep+51},
      {0x1.ffffffffffffdp+51, 0x1.ffffffffffffcp+51},
      {0x1p+52, 0x1p+52}, {0x1.0000000000001p+52, 0x1.0000000000001p+52}, {1e300, 1e300},
      {-1e300, -1e300}, {inf, inf}, {-inf, -inf}, {nan, nan}};
  for (int mode : {FE_TONEAREST, FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
    ASSERT_EQ(std::fesetround(mode), 0);
    for (auto [x, want] : cases) {
      volatile double in = x;  // evaluated at run time, in this rounding mode
      const double got = detail::ieee::round_half_even(in);
      EXPECT_TRUE(same(got, want)) << std::hexfloat << "x " << x << " got " << got << " want "
                                   << want << " rounding mode " << mode;
    }
  }
  std::fesetround(FE_TONEAREST);
}

// Arguments whose exact cos or sin lies within a billionth of a float ulp of the midpoint between
// two floats (search: f = RN(acos(m)/p) or RN(asin(m)/p) for float midpoints m). glibc's sincos of
// the reduced angle (the former evaluation) put the double on the midpoint or past it, and the
// float rounded the wrong way; these are the polynomial's bits, which MPFR says round correctly.
struct Golden {
  int64_t position;
  double inv_freq;
  double cos;
  double sin;
  bool sine;  // which of the two is near a midpoint
};
constexpr Golden kGolden[] = {
    {1, 0x1.79e1788c457edp-1, 0x1.7ac4dafffffffp-1, 0x1.587f30a1b9a82p-1, false},
    {1000003, 0x1.bd78d60402eb7p-21, 0x1.59a0a50000001p-1, 0x1.79bccccf118abp-1, false},
    {8191, 0x1.ab403a5ea2209p-14, 0x1.57e18d0000001p-1, 0x1.7b53ff48b7efp-1, false},
    {3, 0x1.d5f2c5cf490c2p-3, 0x1.8b660bff7f03dp-1, 0x1.4546710000001p-1, true},
    {1000003, 0x1.97f196cf418e5p-21, 0x1.732aa62d1a8cbp-1, 0x1.60acb10000001p-1, true},
    {2147483647, 0x1.83a82ea42f85ap-32, 0x1.741f58335b7a5p-1, 0x1.5faa76fffffffp-1, true},
};

// The same bits on every machine: these are the values, not just close to them.
TEST(ExactAngleBits, GoldenValuesOnEveryMachine) {
  for (const Golden& g : kGolden) {
    const CosSin got = exact_cos_sin(g.position, g.inv_freq);
    EXPECT_TRUE(same(got.cos, g.cos) && same(got.sin, g.sin))
        << std::hexfloat << "position " << g.position << " inv_freq " << g.inv_freq << " got ("
        << got.cos << ", " << got.sin << ") want (" << g.cos << ", " << g.sin << ")";
  }
}

// A schedule whose pair i has kGolden[i]'s frequency.
Schedule golden_schedule() {
  Schedule s;
  for (const Golden& g : kGolden) s.inv_freq.push_back(g.inv_freq);
  s.head_dim = s.rotary_dim = 2 * static_cast<int64_t>(s.inv_freq.size());
  return s;
}

TEST(ExactAngleBits, TablesRoundNearMidpointsCorrectly) {
  const Schedule s = golden_schedule();
  std::vector<int64_t> positions;
  for (const Golden& g : kGolden) positions.push_back(g.position);
  const Table table = Table::at(s, positions);
  for (size_t i = 0; i < std::size(kGolden); ++i) {
    const Golden& g = kGolden[i];
    const auto row = static_cast<int64_t>(i);
    const float stored = g.sine ? table.sin_row(row)[row] : table.cos_row(row)[row];
    const double ulps = test::table_error_ulps(stored, g.position, g.inv_freq, 1.0, g.sine);
    EXPECT_LT(ulps, 0.5) << (g.sine ? "sin" : "cos") << " position " << g.position
                         << std::hexfloat << " inv_freq " << g.inv_freq << " stored " << stored;
  }
}

struct Named {
  const char* name;
  Schedule schedule;
};

std::vector<Named> table_schedules() {
  return {
      // Llama-3.1-8B
      {"llama3", make_schedule(Spec{.head_dim = 128, .base = 500000,
                                    .schedule = ScheduleType::llama3, .factor = 8.0,
                                    .original_max_position = 8192, .low_freq_factor = 1.0,
                                    .high_freq_factor = 4.0})},
      // Qwen2.5-7B-Instruct with YaRN x4: attention_factor 0.1 ln 4 + 1, not 1
      {"yarn", make_schedule(Spec{.head_dim = 128, .base = 1e6, .schedule = ScheduleType::yarn,
                                  .factor = 4.0, .original_max_position = 32768})},
      // GPT-J-6B: 64 of 256 channels rotated
      {"partial", make_schedule(Spec{.head_dim = 256, .rotary_dim = 64, .base = 10000})},
      // 50 pairs: a multiple of no vector width
      {"odd pairs", make_schedule(Spec{.head_dim = 100, .base = 1e6})},
      {"near midpoints", golden_schedule()},
  };
}

// Rows to check: the first positions, the last ones, and scattered ones (random, near quarter
// turns of the fastest pair, 2^k ± 1, the golden positions).
std::vector<Table> tables_of(const Schedule& s) {
  std::vector<int64_t> scattered;
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<int64_t> any(0, max_position_limit - 1);
  for (int n = 0; n < 3000; ++n) scattered.push_back(any(rng));
  for (int64_t p : test::near_quarter_turns(s.inv_freq[0], max_position_limit)) {
    scattered.push_back(p);
  }
  for (int k = 1; k < 31; ++k) {
    scattered.push_back((int64_t{1} << k) - 1);
    scattered.push_back((int64_t{1} << k) + 1);
  }
  for (const Golden& g : kGolden) scattered.push_back(g.position);
  std::vector<Table> out;
  out.push_back(Table::range(s, 0, 1024));
  out.push_back(Table::range(s, max_position_limit - 1024, 1024));
  out.push_back(Table::at(s, scattered));
  return out;
}

TEST_P(ExactAngleLanes, TablesAreTheOnTheFlyFloatRows) {
  for (const Named& n : table_schedules()) {
    const Schedule& s = n.schedule;
    const int64_t pairs = s.pairs();
    std::vector<float> c(static_cast<size_t>(pairs)), sn(c);
    for (const Table& table : tables_of(s)) {
      for (int64_t row = 0; row < table.rows(); ++row) {
        const int64_t p = table.position(row);
        for (float sign : {1.0f, -1.0f}) {
          detail::cos_sin_row_f32(static_cast<double>(p), nullptr, s.inv_freq.data(), pairs,
                                  s.attention_factor, sign, c.data(), sn.data());
          for (int64_t i = 0; i < pairs; ++i) {
            const auto u = static_cast<size_t>(i);
            const float tc = table.cos_row(row)[i];
            const float ts = table.sin_row(row)[i];
            ASSERT_TRUE(same(c[u], tc) && same(sn[u], sign * ts))
                << n.name << " position " << p << " pair " << i << " sign " << sign
                << std::hexfloat << ": on the fly (" << c[u] << ", " << sn[u] << "), table ("
                << tc << ", " << ts << ")";
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace rotary
