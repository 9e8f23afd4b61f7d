// exact_cos_sin against MPFR at 256 bits, in double: the stage before the float rounding.
#include <cmath>
#include <random>

#include "rotary/angle.hpp"
#include "rotary/schedule.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

// The double results must be within 2 double ulps (relative) of the exact value, plus a tiny
// absolute term for values that are themselves near zero.
constexpr double kRelative = 0x1p-51;
constexpr double kAbsolute = 0x1p-90;

void check(int64_t p, double f, double& worst) {
  const CosSin got = exact_cos_sin(p, f);
  const test::Exact want = test::mpfr_cos_sin(p, f);
  for (auto [g, w, name] : {std::tuple{got.cos, want.cos, "cos"}, std::tuple{got.sin, want.sin, "sin"}}) {
    const double err = std::fabs(g - w);
    const double bound = kRelative * std::fabs(w) + kAbsolute;
    worst = std::max(worst, err / bound);
    ASSERT_LE(err, bound) << name << " position " << p << " inv_freq " << f << " got " << g
                          << " want " << w;
  }
}

TEST(ExactCosSin, RandomPositionsAndFrequencies) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> position(0, max_position_limit - 1);
  std::uniform_real_distribution<double> log_freq(-30.0, 3.0);
  double worst = 0;
  for (int n = 0; n < 20000; ++n) check(position(rng), std::exp(log_freq(rng)), worst);
  std::printf("worst exact_cos_sin error: %.3f of the bound\n", worst);
}

TEST(ExactCosSin, AdversarialPositions) {
  double worst = 0;
  for (double f : {1.0, 0.8659643233600653, 0.7498942093324559, 0x1.921fb54442d18p+0,
                   3.14159265358979, 1e-4, 123.456}) {
    for (int64_t p : test::near_quarter_turns(f, max_position_limit)) {
      for (int64_t q : {p - 1, p, p + 1}) {
        if (q >= 0 && q < max_position_limit) check(q, f, worst);
      }
    }
    for (int k = 0; k < 31; ++k) {
      for (int64_t q : {(int64_t{1} << k) - 1, int64_t{1} << k, (int64_t{1} << k) + 1}) {
        if (q < max_position_limit) check(q, f, worst);
      }
    }
  }
  check(max_position_limit - 1, 1.0, worst);
  check(max_position_limit - 1, max_inv_freq, worst);
  check(0, 1.0, worst);
  std::printf("worst exact_cos_sin error (adversarial): %.3f of the bound\n", worst);
}

TEST(ExactCosSin, FloatProductIsNotEnough) {
  // Why this exists: a float32 angle at p = 2^31 - 1 misses by a large fraction of a radian.
  const int64_t p = max_position_limit - 1;
  const float angle = static_cast<float>(p) * 1.0f;
  const test::Exact want = test::mpfr_cos_sin(p, 1.0);
  EXPECT_GT(std::fabs(std::cos(static_cast<double>(angle)) - want.cos), 1e-3);
  EXPECT_LT(std::fabs(exact_cos_sin(p, 1.0).cos - want.cos), 1e-15);
}

}  // namespace
}  // namespace rotary
