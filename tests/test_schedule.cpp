// Schedules against formulas written out here, independently of src/schedule.cpp.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

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
  EXPECT_ROTARY_ERROR(validate(s), "inv_freq[2]=-1 must be finite, >= 0");
  s.inv_freq[2] = 1e7;
  EXPECT_ROTARY_ERROR(validate(s), "inv_freq[2]=10000000 must be finite, >= 0 and <= 2^20");
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
      "inv_freq[0]=999999999.9999999 must be finite, >= 0 and <= 2^20");
}

// ---- The descriptor: stream layouts, proportional, channels ---------------------------------------
// Each model's map is written out here from its transformers code, as angles: for positions
// (stream 0, 1, 2) = (pos[0], pos[1], pos[2]), the angle the model gives pair j, compared with the
// descriptor's inv_freq[j] * pos[stream_of(j)].

// Positions far apart, so a pair reading the wrong stream cannot match by accident.
constexpr double kPos[3] = {3.0, 1009.0, 1000003.0};

void expect_angles(const Schedule& s, const std::vector<double>& expected) {
  ASSERT_EQ(static_cast<int64_t>(expected.size()), s.pairs());
  for (int64_t i = 0; i < s.pairs(); ++i) {
    EXPECT_REL(s.inv_freq[i] * kPos[s.stream_of(i)], expected[i]);
  }
}

std::vector<int> runs(std::initializer_list<std::pair<int, int>> stream_count) {
  std::vector<int> out;
  for (const auto& [stream, count] : stream_count) out.insert(out.end(), count, stream);
  return out;
}

// Qwen2-VL apply_multimodal_rotary_pos_emb: cos [.., 128] (= cat(freqs, freqs)) split by
// mrope_section * 2 = [16,24,24,16,24,24]; chunk i takes stream i % 3. Pair j is channels
// (j, j + 64).
TEST(Descriptor, Qwen2VLSectionsSplitCosOverTheHead) {
  const Schedule s = make_schedule(Spec{.head_dim = 128, .base = 1000000, .stream_layout = StreamLayout::sections,
                                        .sections = {16, 24, 24}});
  EXPECT_EQ(s.streams, 3);
  EXPECT_EQ(s.pair_stream, runs({{0, 16}, {1, 24}, {2, 24}}));
  EXPECT_EQ(s.stream_of(15), 0);
  EXPECT_EQ(s.stream_of(16), 1);
  EXPECT_EQ(s.stream_of(39), 1);
  EXPECT_EQ(s.stream_of(40), 2);
  std::vector<int> channel_stream;
  const int doubled[] = {16, 24, 24, 16, 24, 24};
  for (int chunk = 0; chunk < 6; ++chunk) channel_stream.insert(channel_stream.end(), doubled[chunk], chunk % 3);
  std::vector<double> expected(64);
  for (int64_t i = 0; i < 64; ++i) {
    const auto [a, b] = s.channels(i);
    EXPECT_EQ(a, i);
    EXPECT_EQ(b, i + 64);
    EXPECT_EQ(channel_stream[a], channel_stream[b]) << i;
    expected[i] = plain(1000000, 128, i) * kPos[channel_stream[a]];
  }
  expect_angles(s, expected);
}

// Qwen3-VL apply_interleaved_mrope: freqs_t = freqs[0]; for dim, offset in (1, 1), (2, 2):
// freqs_t[..., offset:mrope_section[dim]*3:3] = freqs[dim, ..., same].
TEST(Descriptor, Qwen3VLInterleavedOverwrite) {
  const Schedule s = make_schedule(Spec{.head_dim = 128, .base = 5000000,
                                        .stream_layout = StreamLayout::interleaved_sections,
                                        .sections = {24, 20, 20}});
  std::vector<int> stream(64, 0);
  const int section[] = {24, 20, 20};
  for (int dim = 1; dim <= 2; ++dim) {
    for (int idx = dim; idx < section[dim] * 3 && idx < 64; idx += 3) stream[idx] = dim;
  }
  EXPECT_EQ(s.pair_stream, stream);
  const std::vector<int> head = {0, 1, 2, 0, 1, 2, 0, 1, 2};
  EXPECT_EQ(std::vector<int>(s.pair_stream.begin(), s.pair_stream.begin() + 9), head);
  const std::vector<int> tail = {1, 2, 0, 0, 0, 0};  // pairs 58..63: 58 < 60, 59 < 60, then t
  EXPECT_EQ(std::vector<int>(s.pair_stream.begin() + 58, s.pair_stream.end()), tail);
  for (int a = 0; a < 3; ++a) EXPECT_EQ(std::count(stream.begin(), stream.end(), a), section[a]);
  std::vector<double> expected(64);
  for (int64_t i = 0; i < 64; ++i) expected[i] = plain(5000000, 128, i) * kPos[stream[i]];
  expect_angles(s, expected);
}

// GLM-4.1V (glm4v apply_multimodal_rotary_pos_emb): partial rotary 0.5, cos over r = 64 split by
// [8,12,12] * 2 with chunk i -> stream i % 3, then cos[..., :32].repeat_interleave(2): channels
// 2j, 2j+1 get cos index j.
TEST(Descriptor, Glm4VSectionsOverInterleavedHalfHead) {
  const Schedule s = make_schedule(Spec{.head_dim = 128, .rotary_dim = 64, .pairing = Pairing::interleaved,
                                        .stream_layout = StreamLayout::sections, .sections = {8, 12, 12}});
  std::vector<int> cos_stream;
  const int doubled[] = {8, 12, 12, 8, 12, 12};
  for (int chunk = 0; chunk < 6; ++chunk) cos_stream.insert(cos_stream.end(), doubled[chunk], chunk % 3);
  std::vector<double> expected(32);
  for (int64_t i = 0; i < 32; ++i) {
    EXPECT_EQ(s.channels(i), std::make_pair(2 * i, 2 * i + 1));
    expected[i] = plain(10000, 64, i) * kPos[cos_stream[i]];
  }
  EXPECT_EQ(s.pair_stream, runs({{0, 8}, {1, 12}, {2, 12}}));
  expect_angles(s, expected);
}

// ERNIE-4.5-VL (ernie4_5_vl_moe): inv_freq_3d[:44] = cat(f[:44][0::2], f[:44][1::2]),
// inv_freq_3d[44:] = f[44:]; freqs = position[stream] * inv_freq_3d; recomposition_to_3d splits by
// [22,22,20] taking chunk i from stream (i+1) % 3 (h, w, t), stacks h and w pairwise, appends t and
// repeat_interleaves by 2 (interleaved pairing).
TEST(Descriptor, Ernie45VLAlternatingHeightWidthThenTime) {
  const Schedule s = make_schedule(Spec{.head_dim = 128, .base = 500000, .pairing = Pairing::interleaved,
                                        .stream_layout = StreamLayout::alternating_sections,
                                        .sections = {22, 22, 20}});
  std::vector<double> f(64), f3d(64);
  for (int64_t i = 0; i < 64; ++i) f[i] = plain(500000, 128, i);
  for (int k = 0; k < 22; ++k) {
    f3d[k] = f[2 * k];
    f3d[22 + k] = f[2 * k + 1];
  }
  for (int i = 44; i < 64; ++i) f3d[i] = f[i];
  std::vector<double> expected;
  for (int k = 0; k < 22; ++k) {
    expected.push_back(kPos[1] * f3d[k]);       // freq_h from chunk 0, stream 1
    expected.push_back(kPos[2] * f3d[22 + k]);  // freq_w from chunk 1, stream 2
  }
  for (int i = 44; i < 64; ++i) expected.push_back(kPos[0] * f3d[i]);  // freq_t, stream 0
  expect_angles(s, expected);
  EXPECT_EQ(s.streams, 3);
  const std::vector<int> head = {1, 2, 1, 2};
  EXPECT_EQ(std::vector<int>(s.pair_stream.begin(), s.pair_stream.begin() + 4), head);
  EXPECT_EQ(s.stream_of(42), 1);
  EXPECT_EQ(s.stream_of(43), 2);
  EXPECT_EQ(s.stream_of(44), 0);
  const int64_t i = 43;
  EXPECT_REL(s.inv_freq[i], f[i]);  // the global frequencies, unpermuted
}

// Qwen2-VL vision (VisionRotaryEmbedding(head_dim // 2)): inv_freq = θ^(-arange(0, 40, 2) / 40);
// rot_pos_emb = full[(h, w)].flatten(1) = [h * inv (20), w * inv (20)]; emb = cat(x, x): half.
TEST(Descriptor, QwenViTAxialRestartsTheIndexPerAxis) {
  const Schedule s = make_schedule(Spec{.head_dim = 80, .stream_layout = StreamLayout::axial, .sections = {20, 20}});
  std::vector<double> expected(40);
  for (int64_t k = 0; k < 20; ++k) {
    const double inv = std::pow(10000.0, -static_cast<double>(2 * k) / 40.0);
    expected[k] = kPos[0] * inv;
    expected[20 + k] = kPos[1] * inv;
  }
  expect_angles(s, expected);
  EXPECT_EQ(s.streams, 2);
  EXPECT_EQ(s.pair_stream, runs({{0, 20}, {1, 20}}));
  EXPECT_EQ(s.inv_freq[0], 1.0);
  EXPECT_EQ(s.inv_freq[20], 1.0);
  EXPECT_EQ(s.channels(25), std::make_pair(int64_t{25}, int64_t{65}));
}

// Pixtral (PixtralRotaryEmbedding): freqs = θ^(-arange(0, 64, 2) / 64); [h * freqs[::2],
// w * freqs[1::2]]; emb = cat(x, x): half pairing over the head.
TEST(Descriptor, PixtralEvenFrequenciesToHeightOddToWidth) {
  const Schedule s = make_schedule(
      Spec{.head_dim = 64, .stream_layout = StreamLayout::axial_even_odd, .sections = {16, 16}});
  std::vector<double> freqs(32), expected;
  for (int64_t i = 0; i < 32; ++i) freqs[i] = plain(10000, 64, i);
  for (int i = 0; i < 32; i += 2) expected.push_back(kPos[0] * freqs[i]);
  for (int i = 1; i < 32; i += 2) expected.push_back(kPos[1] * freqs[i]);
  expect_angles(s, expected);
  EXPECT_EQ(s.pair_stream, runs({{0, 16}, {1, 16}}));
  const int64_t i = 16;
  EXPECT_REL(s.inv_freq[i], freqs[1]);
}

// Llama 4 vision (Llama4VisionRotaryEmbedding), head_dim 88: freq_dim = 44, rope_freq =
// θ^(-arange(0, 44, 2)[:22] / 44); cat([x * rope_freq rep 2, y * rope_freq rep 2])[..., ::2] =
// [x * rope_freq (22), y * rope_freq (22)] on complex (interleaved) pairs. Positions are x+1, y+1.
TEST(Descriptor, Llama4VisionAxialInterleaved) {
  const Schedule s = make_schedule(Spec{.head_dim = 88, .pairing = Pairing::interleaved,
                                        .stream_layout = StreamLayout::axial, .sections = {22, 22}});
  std::vector<double> rope_freq(22), expected;
  for (int k = 0; k < 22; ++k) rope_freq[k] = std::pow(10000.0, -static_cast<double>(2 * k) / 44.0);
  for (int axis = 0; axis < 2; ++axis) {
    for (int k = 0; k < 22; ++k) expected.push_back(kPos[axis] * rope_freq[k]);
  }
  expect_angles(s, expected);
  EXPECT_EQ(s.channels(22), std::make_pair(int64_t{44}, int64_t{45}));
}

// Gemma 4 vision (apply_multidimensional_rope, head_dim 72, θ = 100): the head splits in 2 blocks
// of 36, each rotate_half'd with inv_freq = 100^(-arange(0, 36, 2) / 36), block 0 by x, block 1 by y.
TEST(Descriptor, Gemma4VisionBlockHalfAxial) {
  const Schedule s = make_schedule(Spec{.head_dim = 72, .base = 100, .blocks = 2,
                                        .stream_layout = StreamLayout::axial, .sections = {18, 18}});
  EXPECT_EQ(s.channel_layout(), ChannelLayout::block_half);
  EXPECT_EQ(s.blocks, 2);
  std::vector<double> expected;
  for (int block = 0; block < 2; ++block) {
    for (int64_t i = 0; i < 18; ++i) {
      const int64_t j = block * 18 + i;
      EXPECT_EQ(s.channels(j), std::make_pair(block * 36 + i, block * 36 + i + 18)) << j;
      expected.push_back(kPos[block] * std::pow(100.0, -static_cast<double>(2 * i) / 36.0));
    }
  }
  expect_angles(s, expected);
}

// transformers' _compute_proportional_rope_parameters: rope_angles = int(p * head_dim // 2);
// inv_freq = 1 / base^(arange(0, 2*rope_angles, 2) / head_dim), then head_dim//2 - rope_angles
// zeros; inv_freq /= factor (default 1).
std::vector<double> proportional(double base, int64_t head_dim, double p, double factor) {
  const auto rope_angles = static_cast<int64_t>(std::floor(p * static_cast<double>(head_dim) / 2));
  std::vector<double> out(static_cast<size_t>(head_dim / 2), 0.0);
  for (int64_t j = 0; j < rope_angles; ++j) {
    out[j] = 1.0 / std::pow(base, static_cast<double>(2 * j) / static_cast<double>(head_dim)) / factor;
  }
  return out;
}

TEST(Descriptor, ProportionalGemma4FullAttention) {
  // Gemma 4 full attention: global_head_dim 512, partial_rotary_factor 0.25, rope_theta 1e6.
  const Schedule s = make_schedule(Spec{.head_dim = 512, .base = 1e6, .schedule = ScheduleType::proportional,
                                        .partial_rotary_factor = 0.25});
  const std::vector<double> expected = proportional(1e6, 512, 0.25, 1.0);
  ASSERT_EQ(s.inv_freq.size(), 256u);
  for (size_t i = 0; i < 256; ++i) EXPECT_REL(s.inv_freq[i], expected[i]);
  EXPECT_GT(s.inv_freq[63], 0.0);
  EXPECT_EQ(s.inv_freq[64], 0.0);  // int(0.25 * 512 // 2) = 64 pairs turn
  EXPECT_EQ(s.inv_freq[255], 0.0);
  EXPECT_EQ(s.rotary_dim, 512);
  EXPECT_EQ(s.attention_factor, 1.0);
}

TEST(Descriptor, ProportionalRoundsLikePythonAndDividesByFactor) {
  // 0.58 * 100 = 57.99999999999999 in double: Python's int(p * D // 2) gives 28, not 29.
  Schedule s = make_schedule(Spec{.head_dim = 100, .schedule = ScheduleType::proportional,
                                  .partial_rotary_factor = 0.58});
  EXPECT_GT(s.inv_freq[27], 0.0);
  EXPECT_EQ(s.inv_freq[28], 0.0);
  // 0.3 * 12 = 3.5999999999999996: one pair; p = 1 turns every pair like default.
  s = make_schedule(Spec{.head_dim = 12, .schedule = ScheduleType::proportional, .partial_rotary_factor = 0.3});
  EXPECT_EQ(s.inv_freq, std::vector<double>({1.0, 0, 0, 0, 0, 0}));
  s = make_schedule(Spec{.head_dim = 64, .schedule = ScheduleType::proportional, .factor = 4.0,
                         .partial_rotary_factor = 1.0});
  const std::vector<double> expected = proportional(10000, 64, 1.0, 4.0);
  for (int64_t i = 0; i < 32; ++i) EXPECT_REL(s.inv_freq[i], expected[i]);
}

TEST(Descriptor, OffsetAndBlocksCopiedSingleStreamHasNoMap) {
  const Schedule nope_first = make_schedule(Spec{.head_dim = 128, .rotary_dim = 64, .rotary_offset = 64});
  EXPECT_EQ(nope_first.rotary_offset, 64);
  EXPECT_EQ(nope_first.channels(0), std::make_pair(int64_t{64}, int64_t{96}));
  EXPECT_EQ(nope_first.streams, 1);
  EXPECT_TRUE(nope_first.pair_stream.empty());
  for (int64_t i = 0; i < 32; ++i) EXPECT_REL(nope_first.inv_freq[i], plain(10000, 64, i));
  const Schedule blocks = make_schedule(Spec{.head_dim = 64, .blocks = 4});
  EXPECT_EQ(blocks.blocks, 4);
  EXPECT_EQ(blocks.channel_layout(), ChannelLayout::block_half);
  EXPECT_EQ(blocks.channels(8), std::make_pair(int64_t{16}, int64_t{24}));
}

TEST(Descriptor, SchedulesScaleTheLayoutsFrequencies) {
  // Sections keep the global frequencies: any schedule scales them as for one stream.
  Spec spec{.head_dim = 128, .schedule = ScheduleType::yarn, .factor = 4.0, .original_max_position = 4096};
  const Schedule single = make_schedule(spec);
  spec.stream_layout = StreamLayout::interleaved_sections;
  spec.sections = {24, 20, 20};
  EXPECT_EQ(make_schedule(spec).inv_freq, single.inv_freq);
  // Axial frequencies restart per axis; linear divides each.
  const Schedule axial = make_schedule(Spec{.head_dim = 80, .schedule = ScheduleType::linear, .factor = 2.0,
                                            .stream_layout = StreamLayout::axial, .sections = {20, 20}});
  for (int64_t k = 0; k < 20; ++k) {
    const int64_t i = k;
    EXPECT_REL(axial.inv_freq[k], std::pow(10000.0, -static_cast<double>(2 * k) / 40.0) / 2.0);
    EXPECT_EQ(axial.inv_freq[20 + k], axial.inv_freq[k]) << i;
  }
}

}  // namespace
}  // namespace rotary
