// The precision doctor (rotary/doctor.hpp) against emulations written here, not by the code under test:
// transformers' float32 angle fl32(f * fl32(p)) in plain float arithmetic against the exact p * inv_freq
// in __float128 (exact: 31 + 53 bits), scanned position by position; bf16 cos/sin from MPFR, rounded to
// bf16 here; wrap distances from MPFR's 2π; the schedules' bands from DESIGN.md §2's formulas.
#include <fmt/format.h>
#include <mpfr.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <optional>
#include <tuple>
#include <vector>

#include "rotary/apply.hpp"
#include "rotary/doctor.hpp"
#include "rotary/hf_config.hpp"
#include "rotary/schedule.hpp"
#include "rotary/table.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

// The contexts the brute-force scans run over: past the first stray of every model below, short
// enough to scan every position of every pair in __float128.
constexpr int64_t kContext = 70000;

// |fl32(f * fl32(p)) - p * theta|: transformers' freqs = inv_freq.float() @ position_ids.float(), one
// float32 product, against the exact product.
double angle_error(float f, double theta, int64_t p) {
  const float angle32 = f * static_cast<float>(p);
  const __float128 exact = static_cast<__float128>(p) * static_cast<__float128>(theta);
  const __float128 d = static_cast<__float128>(angle32) - exact;
  return static_cast<double>(d < 0 ? -d : d);
}

struct Emulated {
  std::vector<std::optional<int64_t>> first;  // per pair, the first p with error > threshold
  std::vector<double> at_last;                // per pair, the error at context - 1
};

Emulated emulate_float32(const Schedule& s, int64_t context) {
  Emulated out;
  for (size_t j = 0; j < s.inv_freq.size(); ++j) {
    const float f = s.inv_freq_hf32[j];
    std::optional<int64_t> first;
    for (int64_t p = 0; p < context && !first; ++p) {
      if (angle_error(f, s.inv_freq[j], p) > doctor_threshold_rad) first = p;
    }
    out.first.push_back(first);
    out.at_last.push_back(angle_error(f, s.inv_freq[j], context - 1));
  }
  return out;
}

void expect_float32_drift_matches(const DoctorReport& r, const std::string& what) {
  const Emulated e = emulate_float32(r.schedule, r.positions);
  const Float32DriftReport& d = r.float32_drift;
  EXPECT_EQ(d.threshold_rad, 1e-3);
  EXPECT_EQ(d.last_position, r.positions - 1) << what;
  ASSERT_EQ(d.first_position_per_pair.size(), e.first.size()) << what;
  std::optional<int64_t> first;
  int64_t first_pair = -1, worst = 0;
  for (size_t j = 0; j < e.first.size(); ++j) {
    EXPECT_EQ(d.first_position_per_pair[j], e.first[j]) << what << " pair " << j;
    EXPECT_EQ(d.rad_at_context_per_pair[j], e.at_last[j]) << what << " pair " << j;  // both the rounded exact error
    if (e.first[j] && (!first || *e.first[j] < *first)) {
      first = e.first[j];
      first_pair = static_cast<int64_t>(j);
    }
    if (e.at_last[j] > e.at_last[static_cast<size_t>(worst)]) worst = static_cast<int64_t>(j);
  }
  EXPECT_EQ(d.first_position, first) << what;
  EXPECT_EQ(d.first_pair, first_pair) << what;
  EXPECT_EQ(d.max_rad_at_context, e.at_last[static_cast<size_t>(worst)]) << what;
  EXPECT_EQ(d.worst_pair_at_context, worst) << what;
  // `rotary info`'s drift line measures the same error at the same position.
  EXPECT_EQ(d.max_rad_at_context, hf_float32_drift(r.schedule, d.last_position).max_angle_error) << what;
}

// bf16 round to nearest even of a finite float, written out.
uint16_t bf16_of(float x) {
  const auto u = std::bit_cast<uint32_t>(x);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The first p (p + 1 < context) where some turning pair's bf16 cos and sin equal those of p + 1, and
// the lowest such pair; cos and sin times the factor from MPFR, rounded to float then bf16.
std::pair<std::optional<int64_t>, int64_t> emulate_bf16(const Schedule& s, int64_t context) {
  auto row = [&](int64_t p) {
    std::vector<std::pair<uint16_t, uint16_t>> out;
    for (const double theta : s.inv_freq) {
      const test::Exact e = test::mpfr_cos_sin(p, theta, s.attention_factor);
      out.emplace_back(bf16_of(static_cast<float>(e.cos)), bf16_of(static_cast<float>(e.sin)));
    }
    return out;
  };
  auto previous = row(0);
  for (int64_t p = 0; p + 1 < context; ++p) {
    const auto next = row(p + 1);
    for (size_t j = 0; j < next.size(); ++j) {
      if (s.inv_freq[j] > 0 && next[j] == previous[j]) return {p, static_cast<int64_t>(j)};
    }
    previous = next;
  }
  return {std::nullopt, -1};
}

// ceil(2π / theta) with MPFR's π at 256 bits.
double mpfr_wrap_distance(double theta) {
  mpfr_t x;
  mpfr_init2(x, 256);
  mpfr_const_pi(x, MPFR_RNDN);
  mpfr_mul_ui(x, x, 2, MPFR_RNDN);
  mpfr_div_d(x, x, theta, MPFR_RNDN);
  mpfr_ceil(x, x);
  const double out = mpfr_get_d(x, MPFR_RNDN);
  mpfr_clear(x);
  return out;
}

void expect_wrap_matches(const DoctorReport& r, const std::string& what) {
  ASSERT_EQ(r.wrap_distance.size(), r.schedule.inv_freq.size()) << what;
  std::vector<int64_t> wrapping;
  for (size_t j = 0; j < r.wrap_distance.size(); ++j) {
    const double theta = r.schedule.inv_freq[j];
    if (theta == 0) {
      EXPECT_FALSE(r.wrap_distance[j]) << what << " pair " << j;
      continue;
    }
    ASSERT_TRUE(r.wrap_distance[j]) << what << " pair " << j;
    const double d = mpfr_wrap_distance(theta);
    EXPECT_EQ(*r.wrap_distance[j], d) << what << " pair " << j;
    EXPECT_GE(d * theta, 2 * M_PI * (1 - 1e-15));  // one turn at d
    EXPECT_LT((d - 1) * theta, 2 * M_PI);          // not yet at d - 1
    if (d <= static_cast<double>(r.positions - 1)) wrapping.push_back(static_cast<int64_t>(j));
  }
  EXPECT_EQ(r.wrapping_pairs, wrapping) << what;
}

const Hazard* find(const DoctorReport& r, const std::string& kind) {
  for (const Hazard& h : r.hazards) {
    if (h.kind == kind) return &h;
  }
  return nullptr;
}

// ---- against the emulations: default, YaRN, llama3 and LongRoPE models ----

struct ModelCase {
  const char* preset;
  ScheduleType schedule;
};

void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.preset; }

class DoctorModels : public ::testing::TestWithParam<ModelCase> {};

TEST_P(DoctorModels, FiguresMatchTheEmulation) {
  const ModelRope model = load_preset(GetParam().preset);
  ASSERT_EQ(model.spec.schedule, GetParam().schedule);
  const DoctorReport r = doctor(model, kContext);
  EXPECT_EQ(r.context, kContext);
  EXPECT_EQ(r.context_source, "given");
  EXPECT_EQ(r.positions, kContext);
  EXPECT_EQ(r.schedule, make_schedule(model.spec, kContext));  // LongRoPE: the long factors
  expect_float32_drift_matches(r, GetParam().preset);
  ASSERT_TRUE(r.float32_drift.first_position) << "every model here strays before " << kContext;
  const auto [bf16_first, bf16_pair] = emulate_bf16(r.schedule, kContext);
  EXPECT_EQ(r.bf16_resolution.first_position, bf16_first);
  EXPECT_EQ(r.bf16_resolution.pair, bf16_pair);
  expect_wrap_matches(r, GetParam().preset);
  // One hazard per finding, at its position.
  ASSERT_NE(find(r, "float32_drift"), nullptr);
  EXPECT_EQ(find(r, "float32_drift")->position, r.float32_drift.first_position);
  EXPECT_NE(find(r, "float32_drift")->detail.find("angles='exact'"), std::string::npos);
  ASSERT_NE(find(r, "bf16_resolution"), nullptr);
  EXPECT_EQ(find(r, "bf16_resolution")->position, bf16_first);
  ASSERT_NE(find(r, "wrap"), nullptr);
  EXPECT_EQ(find(r, "wrap")->position, 7);  // pair 0 turns by 1 rad: ceil(2π) = 7
  EXPECT_NE(find(r, "wrap")->detail.find("schedule='monotone', max_length=70000"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Presets, DoctorModels,
                         ::testing::Values(ModelCase{"llama-3-8b", ScheduleType::default_},
                                           ModelCase{"qwen2.5-7b-instruct", ScheduleType::yarn},
                                           ModelCase{"llama-3.1-8b", ScheduleType::llama3},
                                           ModelCase{"phi-3.5-mini-instruct", ScheduleType::longrope}),
                         [](const auto& param_info) {
                           std::string name = param_info.param.preset;
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

// A tiny head over a short context: pairs that never stray (null), a factor != 1 in the bf16 values.
TEST(Doctor, TinyHeadsMatchTheEmulation) {
  const std::vector<Spec> specs = {
      Spec{.head_dim = 16},
      Spec{.head_dim = 8, .schedule = ScheduleType::yarn, .factor = 16, .original_max_position = 1024},
      Spec{.head_dim = 4, .base = 16000},  // pair 1 turns 1/126 rad per position: its bf16 values never repeat
      // cos and sin times 2^-126: subnormal floats and bf16 values, whose cells are 2^-133 wide
      Spec{.head_dim = 4, .base = 16000, .attention_factor = 0x1p-126},
  };
  for (const Spec& spec : specs) {
    const DoctorReport r = doctor(spec, {.context = 20000});
    const std::string what = std::string(to_string(spec.schedule)) + fmt::format(" head_dim {}", spec.head_dim);
    expect_float32_drift_matches(r, what);
    const auto [first, pair] = emulate_bf16(r.schedule, 20000);
    EXPECT_EQ(r.bf16_resolution.first_position, first) << what;
    EXPECT_EQ(r.bf16_resolution.pair, pair) << what;
    expect_wrap_matches(r, what);
  }
  const DoctorReport yarn = doctor(specs[1], {.context = 20000});
  EXPECT_NE(yarn.schedule.attention_factor, 1.0);
  const DoctorReport never = doctor(specs[2], {.context = 20000});
  EXPECT_FALSE(never.bf16_resolution.first_position);
  EXPECT_EQ(never.bf16_resolution.pair, -1);
  EXPECT_EQ(find(never, "bf16_resolution"), nullptr);
  EXPECT_TRUE(doctor(specs[3], {.context = 20000}).bf16_resolution.first_position);
}

// A wrap distance beyond the double range (a subnormal inv_freq) is unset, as for inv_freq 0: JSON
// holds no inf.
TEST(Doctor, WrapDistancesBeyondDoublesAreUnset) {
  const Spec spec{.head_dim = 4, .schedule = ScheduleType::linear, .factor = 1e308};
  const DoctorReport r = doctor(spec, {.context = 100});
  ASSERT_LT(r.schedule.inv_freq[0], 0x1p-1022);
  EXPECT_FALSE(r.wrap_distance[0]);
  EXPECT_FALSE(r.wrap_distance[1]);
  const auto j = nlohmann::json::parse(to_json(r));
  EXPECT_TRUE(j["wrap_distance"][0].is_null());
  const auto [first, pair] = emulate_bf16(r.schedule, 100);
  EXPECT_EQ(r.bf16_resolution.first_position, first);
  EXPECT_EQ(r.bf16_resolution.pair, pair);
}

// Past 2^24, fl32(p) itself rounds: the first stray of a slow pair lies there (the bound the doctor
// brackets it with doubles its position term).
TEST(Doctor, Float32DriftPast2To24MatchesTheEmulation) {
  const Spec spec{.head_dim = 2, .schedule = ScheduleType::linear, .factor = 2000};
  const DoctorReport r = doctor(spec, {.context = int64_t{1} << 25});
  ASSERT_TRUE(r.float32_drift.first_position);
  const int64_t first = *r.float32_drift.first_position;
  EXPECT_GT(first, int64_t{1} << 24);
  const float f = r.schedule.inv_freq_hf32[0];
  const double theta = r.schedule.inv_freq[0];
  EXPECT_GT(angle_error(f, theta, first), 1e-3);
  for (int64_t p = 0; p < first; ++p) {
    if (angle_error(f, theta, p) > 1e-3) FAIL() << "strays at " << p << " before " << first;
  }
  // pair 0 of a default head turns by exactly 1 rad (f = theta = 1): 0 error up to 2^24, 1 rad at 2^24 + 1
  const DoctorReport unit = doctor(Spec{.head_dim = 8}, {.context = int64_t{1} << 25});
  EXPECT_EQ(unit.float32_drift.first_position_per_pair[0], (int64_t{1} << 24) + 1);
  EXPECT_EQ(angle_error(1.0f, 1.0, (int64_t{1} << 24) + 1), 1.0);
}

// The whole range: a context of 2^31 is examined to position 2^31 - 1.
TEST(Doctor, AContextOf2To31IsExaminedToTheLastPosition) {
  const DoctorReport r = doctor(Spec{.head_dim = 8}, {.context = max_position_limit});
  EXPECT_EQ(r.float32_drift.last_position, max_position_limit - 1);
  EXPECT_EQ(r.float32_drift.max_rad_at_context, hf_float32_drift(r.schedule, max_position_limit - 1).max_angle_error);
  for (size_t j = 0; j < r.float32_drift.first_position_per_pair.size(); ++j) {
    const auto& first = r.float32_drift.first_position_per_pair[j];
    ASSERT_TRUE(first) << "pair " << j;  // far past 2^24 every pair strays
    EXPECT_GT(angle_error(r.schedule.inv_freq_hf32[j], r.schedule.inv_freq[j], *first), 1e-3);
    EXPECT_LE(angle_error(r.schedule.inv_freq_hf32[j], r.schedule.inv_freq[j], *first - 1), 1e-3);
  }
}

// ---- the schedules' switch points ----

TEST(Doctor, LongRopeSwitchesAtTheOriginalLength) {
  const ModelRope phi = load_preset("phi-3.5-mini-instruct");  // L = 4096, 131072
  const DoctorReport r = doctor(phi);
  EXPECT_EQ(r.context, 131072);
  EXPECT_EQ(r.context_source, "max_position_embeddings");
  EXPECT_EQ(r.schedule, make_schedule(phi.spec, 131072));
  const Hazard* h = find(r, "longrope_switch");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->position, 4096);
  EXPECT_NE(h->detail.find("longer than 4096 tokens"), std::string::npos) << h->detail;
  EXPECT_NE(h->detail.find("seq_len=131072"), std::string::npos) << h->detail;
  // A context inside the original length never switches: the short factors throughout.
  const DoctorReport short_context = doctor(phi, 4096);
  EXPECT_EQ(find(short_context, "longrope_switch"), nullptr);
  EXPECT_EQ(short_context.schedule, make_schedule(phi.spec, 4096));
  EXPECT_NE(short_context.schedule.inv_freq, r.schedule.inv_freq);
}

TEST(Doctor, DynamicNtkGrowsItsBasePastTheOriginalLength) {
  const Spec spec{.head_dim = 128, .schedule = ScheduleType::dynamic, .factor = 4, .max_position = 4096};
  const DoctorReport r = doctor(spec, {.context = 16384});
  const Hazard* h = find(r, "dynamic_ntk_switch");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->position, 4096);
  // base' = base (s n / L - (s - 1))^(r / (r - 2)) = 10000 * 13^(64/63): the lowest frequency scales by
  // (13^(64/63))^(-126/128)
  const double ratio = std::pow(std::pow(13.0, 128.0 / 126.0), -126.0 / 128.0);
  EXPECT_NE(h->detail.find(fmt::format("x{:.3g} at 16384", ratio)), std::string::npos) << h->detail;
  EXPECT_EQ(find(doctor(spec, {.context = 4096}), "dynamic_ntk_switch"), nullptr);
}

TEST(Doctor, YarnRampIsTheFormulasPairRange) {
  // Qwen2.5: r = 128, base 1e6, L = 32768, factor 4, beta_fast 32, beta_slow 1 (DESIGN.md §2):
  // corr(k) = r ln(L / (2πk)) / (2 ln base); pairs <= floor(corr(32)) keep, >= ceil(corr(1)) divided.
  auto corr = [](double k) { return 128 * std::log(32768 / (k * 2 * M_PI)) / (2 * std::log(1e6)); };
  const auto low = static_cast<int>(std::floor(corr(32))), high = static_cast<int>(std::ceil(corr(1)));
  const DoctorReport r = doctor(load_preset("qwen2.5-7b-instruct"));
  EXPECT_EQ(r.context, 131072);
  EXPECT_EQ(r.context_source, "factor 4 x original length 32768");
  const Hazard* h = find(r, "yarn_ramp");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->position, 32768);
  const std::string bands = fmt::format("pairs 0-{} keep their frequencies, pairs {}-{} blend, pairs {}-63 are divided by factor 4",
                                        low, low + 1, high - 1, high);
  EXPECT_NE(h->detail.find(bands), std::string::npos) << h->detail << "\nwant: " << bands;
  EXPECT_NE(h->detail.find(fmt::format("attention_factor {:.6g}", 0.1 * std::log(4.0) + 1)), std::string::npos);
}

TEST(Doctor, Llama3BandsAreItsWavelengthBands) {
  // Llama-3.1: base 500000, r = 128, L = 8192, lf = 1, hf = 4: wavelength 2π/default_i below L/4 kept,
  // above L divided by 8, between smoothed.
  int kept = -1, divided = 64;
  for (int i = 0; i < 64; ++i) {
    const double wavelength = 2 * M_PI * std::pow(500000.0, 2.0 * i / 128);
    if (wavelength < 8192 / 4.0) kept = i;
    if (wavelength > 8192 && divided == 64) divided = i;
  }
  const DoctorReport r = doctor(load_preset("llama-3.1-8b"));
  EXPECT_EQ(r.context, 131072);
  const Hazard* h = find(r, "llama3_bands");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->position, 8192);
  const std::string bands = fmt::format("pairs 0-{} keep their frequencies, pairs {}-{} blend, pairs {}-63 are divided by factor 8",
                                        kept, kept + 1, divided - 1, divided);
  EXPECT_NE(h->detail.find(bands), std::string::npos) << h->detail << "\nwant: " << bands;
}

TEST(Doctor, MonotoneNeverWrapsAndStaticSchedulesHaveNoSwitch) {
  const DoctorReport r = doctor(Spec{.head_dim = 64, .schedule = ScheduleType::monotone, .max_length = 4096});
  EXPECT_EQ(r.context, 4096);
  EXPECT_EQ(r.context_source, "max_length");
  EXPECT_TRUE(r.wrapping_pairs.empty());
  EXPECT_EQ(find(r, "wrap"), nullptr);
  EXPECT_GT(*r.wrap_distance[0], 4095);
  for (const Hazard& h : r.hazards) EXPECT_TRUE(h.kind == "bf16_resolution" || h.kind == "float32_drift") << h.kind;
}

TEST(Doctor, PairsThatNeverTurnAreLeftOut) {
  // Gemma 4's proportional RoPE: pairs past floor(p * head_dim / 2) have inv_freq 0.
  const Spec spec{.head_dim = 16, .schedule = ScheduleType::proportional, .partial_rotary_factor = 0.25};
  const DoctorReport r = doctor(spec, {.context = 3000});
  ASSERT_EQ(r.wrap_distance.size(), 8u);
  for (size_t j = 2; j < 8; ++j) {
    EXPECT_EQ(r.schedule.inv_freq[j], 0.0);
    EXPECT_FALSE(r.wrap_distance[j]) << j;
    EXPECT_FALSE(r.float32_drift.first_position_per_pair[j]) << j;
    EXPECT_EQ(r.float32_drift.rad_at_context_per_pair[j], 0.0) << j;
  }
  expect_wrap_matches(r, "proportional");
  const auto [first, pair] = emulate_bf16(r.schedule, 3000);
  EXPECT_EQ(r.bf16_resolution.first_position, first);
  EXPECT_EQ(r.bf16_resolution.pair, pair);
}

// ---- the context ----

TEST(Doctor, DefaultContextIsTheModelsOwn) {
  const std::vector<std::tuple<std::string, int64_t, std::string>> cases = {
      {"qwen2.5-7b-instruct", 131072, "factor 4 x original length 32768"},
      {"llama-3.1-8b", 131072, "max_position_embeddings"},
      {"llama-3.2-1b", 131072, "max_position_embeddings"},  // not factor 32 x 8192
      {"deepseek-v3", 163840, "max_position_embeddings"},
      {"llama-3-8b", 8192, "max_position_embeddings"},
      {"gemma-3-4b-it", 131072, "max_position_embeddings"}};  // linear: its max_position_embeddings
  for (const auto& [preset, length, source] : cases) {
    const ModelRope model = load_preset(preset);
    const ContextLength c = context_length(model.spec, model.max_position_embeddings);
    EXPECT_EQ(c.length, length) << preset;
    EXPECT_EQ(c.source, source) << preset;
    const DoctorReport r = doctor(model);
    EXPECT_EQ(r.context, length) << preset;
    EXPECT_EQ(r.context_source, source) << preset;
    EXPECT_EQ(r.positions, length) << preset;
  }
  // A stretched length beyond rotary's positions: examined up to 2^31 - 1, the context as stated.
  const Spec far{.head_dim = 8, .schedule = ScheduleType::yarn, .factor = 1e9, .max_position = 2048};
  EXPECT_EQ(context_length(far).length, int64_t{2048} * 1000000000);
  const DoctorReport r = doctor(far);
  EXPECT_EQ(r.context, int64_t{2048} * 1000000000);
  EXPECT_EQ(r.positions, max_position_limit);
  EXPECT_EQ(r.float32_drift.last_position, max_position_limit - 1);
  EXPECT_EQ(context_length(Spec{.head_dim = 8, .schedule = ScheduleType::yarn, .factor = 1e300,
                                .max_position = 4096}).length, int64_t{1} << 62);
  EXPECT_EQ(context_length(Spec{.head_dim = 8}).length, 0);  // states none
  EXPECT_EQ(context_length(Spec{.head_dim = 8, .schedule = ScheduleType::linear, .factor = 4}, 4096).source,
            "max_position_embeddings");
}

TEST(Doctor, BadContextsAreRefused) {
  const Spec spec{.head_dim = 8};
  for (const int64_t context : {int64_t{0}, int64_t{-1}, max_position_limit + 1}) {
    EXPECT_ROTARY_ERROR(doctor(spec, {.context = context}),
                        fmt::format("context={} must be in [1, 2^31] (positions 0 .. context-1)", context));
  }
  EXPECT_ROTARY_ERROR(doctor(spec), "context is needed: the settings state no length");
  EXPECT_ROTARY_ERROR(doctor(Spec{.head_dim = 7}, {.context = 10}), "head_dim");  // the spec's own rules first
  // One position: nothing to compare, nothing strays.
  const DoctorReport one = doctor(spec, {.context = 1});
  EXPECT_FALSE(one.float32_drift.first_position);
  EXPECT_FALSE(one.bf16_resolution.first_position);
  EXPECT_TRUE(one.wrapping_pairs.empty());
  EXPECT_TRUE(one.hazards.empty());
}

// ---- printing ----

TEST(Doctor, JsonHoldsTheReport) {
  const DoctorReport r = doctor(load_preset("llama-3.1-8b"));
  const auto j = nlohmann::ordered_json::parse(to_json(r));
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"context", "context_source", "positions", "schedule", "float32_drift",
                                            "bf16_resolution", "wrap_distance", "wrapping_pairs", "hazards"}));
  EXPECT_EQ(j["context"], 131072);
  EXPECT_EQ(j["schedule"], "llama3");
  const auto& d = j["float32_drift"];
  EXPECT_EQ(d["threshold_rad"].get<double>(), 1e-3);
  EXPECT_EQ(d["first_position"], *r.float32_drift.first_position);
  EXPECT_EQ(d["max_rad_at_context"].get<double>(), r.float32_drift.max_rad_at_context);  // round trip
  ASSERT_EQ(d["first_position_per_pair"].size(), 64u);
  EXPECT_TRUE(d["first_position_per_pair"][0].is_null());  // pair 0 turns by 1 rad: exact below 2^24
  ASSERT_EQ(j["wrap_distance"].size(), 64u);
  EXPECT_EQ(j["wrap_distance"][0], 7);
  EXPECT_TRUE(j["wrap_distance"][0].is_number_integer());
  ASSERT_EQ(j["hazards"].size(), r.hazards.size());
  for (size_t i = 0; i < r.hazards.size(); ++i) {
    EXPECT_EQ(j["hazards"][i]["kind"], r.hazards[i].kind);
    EXPECT_EQ(j["hazards"][i]["position"], *r.hazards[i].position);
    EXPECT_EQ(j["hazards"][i]["detail"], r.hazards[i].detail);
  }
  const auto none = nlohmann::json::parse(to_json(doctor(Spec{.head_dim = 8}, {.context = 1})));
  EXPECT_TRUE(none["float32_drift"]["first_position"].is_null());
  EXPECT_TRUE(none["bf16_resolution"]["first_position"].is_null());
  EXPECT_TRUE(none["hazards"].empty());
}

TEST(Doctor, TextHasOneLinePerCheck) {
  const std::string text = to_text(doctor(Spec{.head_dim = 64, .schedule = ScheduleType::monotone, .max_length = 4096}));
  EXPECT_EQ(text.find("rotary doctor: schedule monotone, 32 pairs, context 4096 (max_length)\n"), 0u) << text;
  EXPECT_NE(text.find("\nfloat32_drift: none: transformers' float32 angles stay within 0.001 rad"), std::string::npos);
  EXPECT_NE(text.find("\nbf16_resolution at "), std::string::npos) << text;
  EXPECT_NE(text.find("\nwrap: none: every pair stays under one turn"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4);
}

// The doctor answers within a second for 1M-token contexts: timed here and printed (no assertion on
// a shared machine's time).
TEST(Doctor, OneMillionTokensTiming) {
  for (const char* preset : {"llama-3.1-8b", "qwen2.5-7b-instruct", "phi-3.5-mini-instruct"}) {
    const auto start = std::chrono::steady_clock::now();
    const DoctorReport r = doctor(load_preset(preset), int64_t{1} << 20);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::cout << fmt::format("[ timing ] doctor({}, context 2^20): {:.1f} ms\n", preset, ms);
    EXPECT_EQ(r.positions, int64_t{1} << 20);
  }
}

// xPos: the reach is 80 gamma / |ln(2/7)| (pair 0's zeta = 2/7, rotary_dim-independent), written out
// here from the formula; apply itself refuses the position the doctor names and serves the one before.
TEST(Doctor, XposRangeNamesTheFirstRefusedPositionAndACentreThatServes) {
  const double gamma = 64;
  const double reach = 80 * gamma / std::fabs(std::log(2.0 / 7.0));
  Spec spec{.head_dim = 16, .xpos_scale_base = gamma};
  const int64_t context = 10000;
  ASSERT_LT(reach, context);
  const DoctorReport r = doctor(spec, {.context = context});
  const Hazard* h = find(r, "xpos_range");
  ASSERT_NE(h, nullptr);
  const auto first_refused = static_cast<int64_t>(std::floor(reach)) + 1;
  EXPECT_EQ(h->position, first_refused);
  EXPECT_NE(h->detail.find("no one centre serves 10000 positions"), std::string::npos) << h->detail;
  EXPECT_NE(to_text(r).find("xpos_range at " + std::to_string(first_refused)), std::string::npos);

  const Schedule schedule = make_schedule(spec);
  std::vector<float> q(16, 1.0f);
  const auto call = [&](int64_t position) {
    const int64_t p = position;
    ApplyArgs args{.q = TensorView{.data = q.data(), .dtype = DType::f32, .shape = {1, 1, 1, 16}, .strides = {16, 16, 16, 1}},
                   .positions = Positions::per_token(std::span<const int64_t>(&p, 1))};
    apply(schedule, args);
  };
  EXPECT_NO_THROW(call(first_refused - 1));
  EXPECT_ROTARY_ERROR(call(first_refused), "beyond xPos's reach");

  // A context within 2 * reach: a centre at its middle serves it all, and the hazard says so.
  const DoctorReport shorter = doctor(spec, {.context = 5000});
  const Hazard* s = find(shorter, "xpos_range");
  ASSERT_NE(s, nullptr);
  EXPECT_NE(s->detail.find("xpos_center=2499.5 serves the whole context"), std::string::npos) << s->detail;
  spec.xpos_center = 2499.5;
  EXPECT_EQ(find(doctor(spec, {.context = 5000}), "xpos_range"), nullptr);
}

}  // namespace
}  // namespace rotary
