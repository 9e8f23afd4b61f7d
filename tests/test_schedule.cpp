// Schedules against formulas written out here, independently of src/schedule.cpp.
#include <cmath>
#include <numbers>

#include "rotary/schedule.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

constexpr double kPi = std::numbers::pi;
// Relative tolerance for double formulas evaluated in a different order (pow vs exp/log).
constexpr double kRel = 1e-14;

#define EXPECT_REL(actual, expected) \
  EXPECT_NEAR((actual), (expected), kRel * std::fabs(expected)) << "pair " << i

// default_i = base^(-2i/r), written as exp(-(2i/r) ln base).
double plain(double base, int64_t r, int64_t i) {
  return std::exp(-(2.0 * static_cast<double>(i) / static_cast<double>(r)) * std::log(base));
}

TEST(Schedule, DefaultUsesRotaryDimNotHeadDim) {
  const Schedule s = make_schedule(Spec{.head_dim = 128, .rotary_dim = 32, .base = 10000});
  ASSERT_EQ(s.inv_freq.size(), 16u);
  for (int64_t i = 0; i < 16; ++i) EXPECT_REL(s.inv_freq[i], plain(10000, 32, i));
  EXPECT_EQ(s.inv_freq[0], 1.0);
  EXPECT_EQ(s.attention_factor, 1.0);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.rotary_dim, 32);
}

TEST(Schedule, LinearDividesEveryFrequency) {
  const Schedule s = make_schedule(
      Spec{.head_dim = 64, .schedule = ScheduleType::linear, .factor = 4.0});
  for (int64_t i = 0; i < 32; ++i) EXPECT_REL(s.inv_freq[i], plain(10000, 64, i) / 4.0);
}

TEST(Schedule, NtkKeepsHighestAndDividesLowestByFactor) {
  const double s = 8.0;
  const Schedule ntk =
      make_schedule(Spec{.head_dim = 128, .schedule = ScheduleType::ntk, .factor = s});
  // base' = base * s^(r/(r-2)); written out per pair
  const double base2 = 10000.0 * std::pow(s, 128.0 / 126.0);
  for (int64_t i = 0; i < 64; ++i) EXPECT_REL(ntk.inv_freq[i], plain(base2, 128, i));
  EXPECT_EQ(ntk.inv_freq[0], 1.0);
  // The NTK-aware property: the lowest frequency is interpolated exactly by s.
  const size_t i = 63;
  EXPECT_NEAR(ntk.inv_freq[i], plain(10000, 128, 63) / s, 1e-13 * plain(10000, 128, 63) / s);
}

TEST(Schedule, DynamicBelowAndAboveOriginalLength) {
  const Spec spec{.head_dim = 64, .schedule = ScheduleType::dynamic, .factor = 2.0,
                  .max_position = 4096};
  for (std::optional<int64_t> n : {std::optional<int64_t>{}, std::optional<int64_t>{100},
                                   std::optional<int64_t>{4096}}) {
    const Schedule below = make_schedule(spec, n);
    for (int64_t i = 0; i < 32; ++i) EXPECT_REL(below.inv_freq[i], plain(10000, 64, i));
  }
  const int64_t n = 16384;
  const Schedule above = make_schedule(spec, n);
  const double growth = 2.0 * 16384.0 / 4096.0 - 1.0;  // s n / L - (s - 1) = 7
  const double base2 = 10000.0 * std::pow(growth, 64.0 / 62.0);
  for (int64_t i = 0; i < 32; ++i) EXPECT_REL(above.inv_freq[i], plain(base2, 64, i));
  const size_t i = 31;
  EXPECT_NEAR(above.inv_freq[i], plain(10000, 64, 31) / 7.0, 1e-13);
}

// Qwen2.5-7B-Instruct's model card YaRN: rope_theta 1e6, head_dim 128, factor 4, original 32768.
TEST(Schedule, YarnRampWrittenOut) {
  for (bool truncate : {true, false}) {
    Spec spec{.head_dim = 128, .base = 1e6, .schedule = ScheduleType::yarn, .factor = 4.0,
              .original_max_position = 32768};
    if (!truncate) spec.truncate = false;
    const Schedule s = make_schedule(spec);
    // corr(k) = r ln(L / (k 2π)) / (2 ln base)
    auto corr = [](double k) { return 128.0 * std::log(32768.0 / (k * 2 * kPi)) / (2 * std::log(1e6)); };
    double low = corr(32.0);
    double high = corr(1.0);
    if (truncate) {
      low = std::floor(low);
      high = std::ceil(high);
      EXPECT_EQ(low, 23.0);  // corr(32) = 23.60..., corr(1) = 39.65...
      EXPECT_EQ(high, 40.0);
    }
    for (int64_t i = 0; i < 64; ++i) {
      const double d = plain(1e6, 128, i);
      double expected;
      if (i <= low) expected = d;            // ramp 0: pure extrapolation (kept)
      else if (i >= high) expected = d / 4;  // ramp 1: pure interpolation
      else {
        const double ramp = (static_cast<double>(i) - low) / (high - low);
        expected = d / 4 * ramp + d * (1 - ramp);
      }
      EXPECT_REL(s.inv_freq[i], expected);
    }
    EXPECT_NEAR(s.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-15);
  }
}

TEST(Schedule, YarnAttentionFactorVariants) {
  Spec spec{.head_dim = 64, .schedule = ScheduleType::yarn, .factor = 40.0,
            .original_max_position = 4096};
  // DeepSeek-V3 style: mscale 1, mscale_all_dim 1 -> ratio 1
  spec.mscale = 1.0;
  spec.mscale_all_dim = 1.0;
  EXPECT_DOUBLE_EQ(make_schedule(spec).attention_factor, 1.0);
  spec.mscale = 0.707;
  spec.mscale_all_dim = 1.0;
  EXPECT_NEAR(make_schedule(spec).attention_factor,
              (0.1 * 0.707 * std::log(40.0) + 1) / (0.1 * std::log(40.0) + 1), 1e-15);
  // Hugging Face treats mscale 0 as absent: get_mscale(s, 1)
  spec.mscale = 0.0;
  EXPECT_NEAR(make_schedule(spec).attention_factor, 0.1 * std::log(40.0) + 1, 1e-15);
  spec.mscale.reset();
  spec.mscale_all_dim.reset();
  spec.attention_factor = 0.5;
  EXPECT_EQ(make_schedule(spec).attention_factor, 0.5);
  // factor <= 1: get_mscale is 1
  spec.attention_factor.reset();
  spec.factor = 1.0;
  EXPECT_EQ(make_schedule(spec).attention_factor, 1.0);
}

TEST(Schedule, YarnZeroWidthRamp) {
  // With L = 5 both correction dims clamp to 0 (corr(1) = -0.79 -> ceil -0 -> 0; corr(32) < 0 ->
  // max(.., 0) = 0): low == high, so high becomes 0.001 — pair 0 kept, every other pair interpolated.
  auto corr = [](double k) { return 64.0 * std::log(5.0 / (k * 2 * kPi)) / (2 * std::log(10000.0)); };
  ASSERT_EQ(std::max(std::floor(corr(32.0)), 0.0), 0.0);
  ASSERT_EQ(std::ceil(corr(1.0)), 0.0);
  const Schedule s = make_schedule(Spec{.head_dim = 64, .schedule = ScheduleType::yarn,
                                        .factor = 2.0, .original_max_position = 5});
  for (int64_t i = 0; i < 32; ++i) {
    const double d = plain(10000, 64, i);
    EXPECT_REL(s.inv_freq[i], i == 0 ? d : d / 2);
  }
}

TEST(Schedule, Llama3BandEdges) {
  // Llama-3.1-8B
  const Spec spec{.head_dim = 128, .base = 500000, .schedule = ScheduleType::llama3, .factor = 8.0,
                  .original_max_position = 8192, .low_freq_factor = 1.0, .high_freq_factor = 4.0};
  const Schedule s = make_schedule(spec);
  int kept = 0, scaled = 0, smooth = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const double d = plain(500000, 128, i);
    const double wavelength = 2 * kPi / d;
    if (wavelength < 8192.0 / 4.0) {
      EXPECT_REL(s.inv_freq[i], d);
      ++kept;
    } else if (wavelength > 8192.0 / 1.0) {
      EXPECT_REL(s.inv_freq[i], d / 8);
      ++scaled;
    } else {
      const double t = (8192.0 / wavelength - 1.0) / (4.0 - 1.0);
      EXPECT_REL(s.inv_freq[i], (1 - t) * d / 8 + t * d);
      EXPECT_GT(s.inv_freq[i], d / 8);
      EXPECT_LT(s.inv_freq[i], d);
      ++smooth;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(scaled, 0);
  EXPECT_GT(smooth, 0);
  EXPECT_EQ(kept + scaled + smooth, 64);
  // Continuity of the blend at both band edges: t = 1 at λ = L/hf, t = 0 at λ = L/lf.
  auto blend = [](double d, double wavelength) {
    const double t = (8192.0 / wavelength - 1.0) / 3.0;
    return (1 - t) * d / 8 + t * d;
  };
  EXPECT_NEAR(blend(1.0, 2048.0), 1.0, 1e-15);
  EXPECT_NEAR(blend(1.0, 8192.0), 1.0 / 8, 1e-15);
}

// The low_freq_factor for which L / low_freq_factor equals `wavelength` exactly in double.
double factor_on_wavelength(double original, double wavelength) {
  double f = original / wavelength;
  for (int step = 0; step < 64 && original / f != wavelength; ++step) {
    f = std::nextafter(f, original / f > wavelength ? INFINITY : 0.0);
  }
  return f;
}

// Which band a wavelength exactly on an edge falls in, as transformers' comparisons decide:
// λ < L/hf (strict) kept, λ > L/lf (strict) divided, otherwise smoothed.
TEST(Schedule, Llama3WavelengthExactlyOnABandEdge) {
  const double wavelength = 2 * kPi;  // pair 0: inv_freq = base^0 = 1 for any base
  const double original = 8192;
  const double on_edge = factor_on_wavelength(original, wavelength);
  ASSERT_EQ(original / on_edge, wavelength);
  Spec spec{.head_dim = 8, .schedule = ScheduleType::llama3, .factor = 8.0, .original_max_position = 8192};
  // λ == L/lf, lf < hf: neither λ < L/hf nor λ > L/lf, so smoothed with t = 0: divided by s.
  spec.low_freq_factor = on_edge;
  spec.high_freq_factor = 4 * on_edge;
  EXPECT_NEAR(make_schedule(spec).inv_freq[0], 1.0 / 8, 1e-15);
  // λ == L/hf, lf < hf: smoothed with t = 1: kept.
  spec.low_freq_factor = on_edge / 4;
  spec.high_freq_factor = on_edge;
  EXPECT_NEAR(make_schedule(spec).inv_freq[0], 1.0, 1e-15);
  // lf == hf: the smoothing band is λ == L/lf alone, where transformers divides 0 by 0 (NaN).
  spec.low_freq_factor = spec.high_freq_factor = on_edge;
  EXPECT_ROTARY_ERROR(make_schedule(spec),
                      " equals high_freq_factor and pair 0's wavelength 2*pi/inv_freq equals "
                      "original_max_position/low_freq_factor=6.283185307179586 exactly");
  // One ulp either side, lf == hf: two bands, kept below L/lf and divided above.
  const double below = std::nextafter(on_edge, INFINITY), above = std::nextafter(on_edge, 0.0);
  ASSERT_LT(original / below, wavelength);
  ASSERT_GT(original / above, wavelength);
  spec.low_freq_factor = spec.high_freq_factor = below;
  EXPECT_EQ(make_schedule(spec).inv_freq[0], 1.0 / 8);
  spec.low_freq_factor = spec.high_freq_factor = above;
  EXPECT_EQ(make_schedule(spec).inv_freq[0], 1.0);
}

// A computed attention_factor must be a normal float32, as an explicit one must (test_spec).
TEST(Schedule, ComputedAttentionFactorOutsideFloat32IsRefused) {
  Spec spec{.head_dim = 64, .schedule = ScheduleType::yarn, .factor = 4.0, .original_max_position = 4096,
            .mscale = 1e300, .mscale_all_dim = 1.0};
  EXPECT_ROTARY_ERROR(make_schedule(spec), "schedule yarn computes attention_factor=1.21751143713058");
  EXPECT_ROTARY_ERROR(make_schedule(spec), "e+299 from factor=4, mscale=1e+300, mscale_all_dim=1: it must round to "
                                           "a normal float32, in [2^-126, 3.40282347e+38]");
  spec.mscale = 1.0;
  spec.mscale_all_dim = 1e300;  // 1.14 / 1.4e299: underflows float32
  EXPECT_ROTARY_ERROR(make_schedule(spec), "from factor=4, mscale=1, mscale_all_dim=1e+300: it must round to");
  spec.mscale_all_dim = 1e30;  // 1.14 / 1.4e29 = 8.2e-30: a normal float32
  EXPECT_NEAR(make_schedule(spec).attention_factor, (0.1 * std::log(4.0) + 1) / (0.1 * 1e30 * std::log(4.0) + 1),
              1e-44);
}

TEST(Schedule, LongropeShortLongAndAttentionFactor) {
  // Phi-3-mini-128k-instruct shape: L = 4096, M = 131072 -> sqrt(1 + ln 32 / ln 4096) = sqrt(17/12).
  Spec spec{.head_dim = 8, .schedule = ScheduleType::longrope, .original_max_position = 4096,
            .max_position = 131072};
  spec.short_factor = {1.0, 1.5, 2.0, 2.5};
  spec.long_factor = {1.0, 4.0, 16.0, 64.0};
  const Schedule short_s = make_schedule(spec, 4096);
  const Schedule long_s = make_schedule(spec, 4097);
  const Schedule unset = make_schedule(spec);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_REL(short_s.inv_freq[i], plain(10000, 8, i) / spec.short_factor[i]);
    EXPECT_REL(long_s.inv_freq[i], plain(10000, 8, i) / spec.long_factor[i]);
    EXPECT_REL(unset.inv_freq[i], short_s.inv_freq[i]);
  }
  EXPECT_NEAR(short_s.attention_factor, std::sqrt(17.0 / 12.0), 1e-15);
  EXPECT_NEAR(long_s.attention_factor, std::sqrt(17.0 / 12.0), 1e-15);
  spec.max_position.reset();  // M = L: no scaling
  EXPECT_EQ(make_schedule(spec).attention_factor, 1.0);
  spec.attention_factor = 1.25;
  EXPECT_EQ(make_schedule(spec).attention_factor, 1.25);
}

// He & Xu's requirement c3: for every pair, (distance * inv_freq) mod 2π grows strictly with the
// distance over the whole window. Checked here by direct evaluation.
bool angle_difference_monotone(double inv_freq, int64_t window, int64_t* first_drop) {
  double previous = -1;
  for (int64_t distance = 0; distance < window; ++distance) {
    const double angle = std::fmod(static_cast<double>(distance) * inv_freq, 2 * kPi);
    if (angle <= previous) {
      *first_drop = distance;
      return false;
    }
    previous = angle;
  }
  return true;
}

TEST(Schedule, MonotoneSatisfiesC3OverTheWindow) {
  const int64_t window = 8192;
  const Schedule mono = make_schedule(
      Spec{.head_dim = 128, .schedule = ScheduleType::monotone, .max_length = window});
  for (size_t i = 0; i < mono.inv_freq.size(); ++i) {
    int64_t drop = -1;
    EXPECT_TRUE(angle_difference_monotone(mono.inv_freq[i], window, &drop))
        << "pair " << i << " wraps at distance " << drop;
  }
  // One constant scales every default frequency.
  for (int64_t i = 0; i < 64; ++i) {
    EXPECT_REL(mono.inv_freq[i] / plain(10000, 128, i), mono.inv_freq[0]);
  }
  // The default frequencies break c3: pair 0 (θ = 1 rad/token) wraps at distance 7.
  const Schedule plain_s = make_schedule(Spec{.head_dim = 128});
  int64_t drop = -1;
  EXPECT_FALSE(angle_difference_monotone(plain_s.inv_freq[0], window, &drop));
  EXPECT_EQ(drop, 7);
  // An explicit c inside the bound is used as given.
  const Schedule explicit_c = make_schedule(Spec{.head_dim = 128, .schedule = ScheduleType::monotone,
                                                 .max_length = window, .monotone_scale = 1e-4});
  EXPECT_DOUBLE_EQ(explicit_c.inv_freq[0], 1e-4);
}

TEST(Schedule, ValidateHandBuiltSchedule) {
  Schedule s = make_schedule(Spec{.head_dim = 8});
  EXPECT_NO_THROW(validate(s));
  s.inv_freq.pop_back();
  EXPECT_ROTARY_ERROR(validate(s), "inv_freq has 3 values but rotary_dim/2=4");
  s = make_schedule(Spec{.head_dim = 8});
  s.inv_freq[2] = -1;
  EXPECT_ROTARY_ERROR(validate(s), "inv_freq[2]=-1 must be finite, > 0");
  s.inv_freq[2] = 1e7;
  EXPECT_ROTARY_ERROR(validate(s), "inv_freq[2]=10000000 must be finite, > 0 and <= 2^20");
  s = make_schedule(Spec{.head_dim = 8});
  s.attention_factor = 0;
  EXPECT_ROTARY_ERROR(validate(s), "attention_factor=0 must be finite and > 0");
  for (const double outside : {1e39, 1e-40, 1e-50}) {
    s = make_schedule(Spec{.head_dim = 8});
    s.attention_factor = outside;
    EXPECT_ROTARY_ERROR(validate(s), "must round to a normal float32, in [2^-126, 3.40282347e+38]");
  }
  s = make_schedule(Spec{.head_dim = 8});
  s.rotary_dim = 10;
  EXPECT_ROTARY_ERROR(validate(s), "rotary_dim=10 must be even, > 0 and <= head_dim=8");
  // Enums from a hand-built (or C) schedule: a value outside the enum is named by number.
  s = make_schedule(Spec{.head_dim = 8});
  s.pairing = static_cast<Pairing>(7);
  EXPECT_ROTARY_ERROR(validate(s), "pairing=7 is not interleaved or half");
  s = make_schedule(Spec{.head_dim = 8});
  s.type = static_cast<ScheduleType>(-1);
  EXPECT_ROTARY_ERROR(validate(s), "type=-1 is not a schedule type");
}

TEST(Schedule, OutOfRangeFrequencyIsAnError) {
  EXPECT_ROTARY_ERROR(
      make_schedule(Spec{.head_dim = 8, .schedule = ScheduleType::linear, .factor = 1e-9}),
      "inv_freq[0]=999999999.9999999 must be finite, > 0 and <= 2^20");
}

}  // namespace
}  // namespace rotary
