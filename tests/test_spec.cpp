// Spec validation: every rule has a test that checks the message.
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "rotary/error.hpp"
#include "rotary/schedule.hpp"
#include "rotary/spec.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Spec base_spec() { return Spec{.head_dim = 128}; }

TEST(Spec, AcceptsDefaultAndResolvesRotaryDim) {
  Spec s = base_spec();
  EXPECT_NO_THROW(validate(s));
  EXPECT_EQ(s.resolved_rotary_dim(), 128);
  s.rotary_dim = 32;
  EXPECT_EQ(s.resolved_rotary_dim(), 32);
}

TEST(Spec, HeadDimAndRotaryDim) {
  EXPECT_ROTARY_ERROR(validate(Spec{.head_dim = 0}), "head_dim=0 must be > 0");
  EXPECT_ROTARY_ERROR(validate(Spec{.head_dim = -4}), "head_dim=-4 must be > 0");
  EXPECT_ROTARY_ERROR(validate(Spec{.head_dim = 63}), "rotary_dim=63 must be even and <= head_dim=63");
  EXPECT_ROTARY_ERROR(validate(Spec{.head_dim = 64, .rotary_dim = 63}), "rotary_dim=63 must be even");
  EXPECT_ROTARY_ERROR(validate(Spec{.head_dim = 128, .rotary_dim = 130}),
                      "rotary_dim=130 exceeds head_dim=128");
  EXPECT_ROTARY_ERROR(validate(Spec{.head_dim = 128, .rotary_dim = -2}), "rotary_dim=-2 must be > 0");
}

TEST(Spec, Base) {
  EXPECT_ROTARY_ERROR(validate(Spec{.head_dim = 8, .base = 1.0}), "base=1 must be > 1");
  EXPECT_ROTARY_ERROR(validate(Spec{.head_dim = 8, .base = 0.5}), "base=0.5 must be > 1");
  EXPECT_ROTARY_ERROR(validate(Spec{.head_dim = 8, .base = kNaN}), "base=nan must be finite");
  EXPECT_ROTARY_ERROR(validate(Spec{.head_dim = 8, .base = kInf}), "base=inf must be finite");
}

TEST(Spec, Factor) {
  Spec s = base_spec();
  s.schedule = ScheduleType::linear;
  EXPECT_ROTARY_ERROR(validate(s), "schedule linear needs factor");
  for (double bad : {0.0, -2.0}) {
    s.factor = bad;
    EXPECT_ROTARY_ERROR(validate(s), "must be > 0");
  }
  s.factor = kNaN;
  EXPECT_ROTARY_ERROR(validate(s), "factor=nan must be finite");
  s.factor = kInf;
  EXPECT_ROTARY_ERROR(validate(s), "factor=inf must be finite");
  s.factor = 2.0;
  EXPECT_NO_THROW(validate(s));
}

TEST(Spec, FieldsTheScheduleDoesNotUseAreRejected) {
  Spec s = base_spec();
  s.factor = 2.0;
  EXPECT_ROTARY_ERROR(validate(s), "factor is set but schedule default does not use it");
  s = base_spec();
  s.schedule = ScheduleType::linear;
  s.factor = 2.0;
  s.beta_fast = 16;
  EXPECT_ROTARY_ERROR(validate(s), "beta_fast is set but schedule linear does not use it");
  s = base_spec();
  s.short_factor = {1.0};
  EXPECT_ROTARY_ERROR(validate(s), "short_factor is set but schedule default");
  s = base_spec();
  s.max_length = 100;
  EXPECT_ROTARY_ERROR(validate(s), "max_length is set but schedule default");
  s = base_spec();
  s.low_freq_factor = 1;
  EXPECT_ROTARY_ERROR(validate(s), "low_freq_factor is set but schedule default");
}

TEST(Spec, NeedsOriginalLength) {
  for (ScheduleType t : {ScheduleType::dynamic, ScheduleType::yarn, ScheduleType::llama3}) {
    Spec s = base_spec();
    s.schedule = t;
    s.factor = 4.0;
    if (t == ScheduleType::llama3) {
      s.low_freq_factor = 1;
      s.high_freq_factor = 4;
    }
    EXPECT_ROTARY_ERROR(validate(s), "needs original_max_position or max_position");
    s.max_position = 4096;
    EXPECT_NO_THROW(validate(s)) << to_string(t);
    s.original_max_position = 0;
    EXPECT_ROTARY_ERROR(validate(s), "original_max_position=0 must be >= 1");
  }
}

TEST(Spec, NtkNeedsRotaryDimAboveTwo) {
  Spec s{.head_dim = 2, .schedule = ScheduleType::ntk, .factor = 2.0};
  EXPECT_ROTARY_ERROR(validate(s), "rotary_dim=2 must be > 2 for schedule ntk");
}

TEST(Spec, Yarn) {
  Spec s{.head_dim = 64, .schedule = ScheduleType::yarn, .factor = 4.0, .original_max_position = 4096};
  s.beta_fast = 1;
  s.beta_slow = 32;
  EXPECT_ROTARY_ERROR(validate(s), "beta_fast=1 must exceed beta_slow=32");
  s.beta_fast = -1;
  EXPECT_ROTARY_ERROR(validate(s), "beta_fast=-1 must be > 0");
  s.beta_fast = 32;
  s.beta_slow = 1;
  s.mscale = kNaN;
  EXPECT_ROTARY_ERROR(validate(s), "mscale=nan must be finite");
  s.mscale = 1;
  s.mscale_all_dim = kInf;
  EXPECT_ROTARY_ERROR(validate(s), "mscale_all_dim=inf must be finite");
  s.mscale_all_dim = 1;
  s.attention_factor = 0;
  EXPECT_ROTARY_ERROR(validate(s), "attention_factor=0 must be > 0");
  s.attention_factor = kNaN;
  EXPECT_ROTARY_ERROR(validate(s), "attention_factor=nan must be finite");
}

// cos and sin times the factor are stored as float32: it must round to a normal float32.
TEST(Spec, AttentionFactorIsANormalFloat32) {
  Spec s = base_spec();
  // FLT_MIN, 1, FLT_MAX, and the extreme doubles that still round to FLT_MIN and FLT_MAX
  // (3.4028235e38, as a user types FLT_MAX, lies above it and rounds to it).
  for (const double fine : {0x1p-126, 1.0, 0x1.fffffep+127, 0x1.fffffep-127, 0x1.fffffefffffffp+127, 3.4028235e38}) {
    s.attention_factor = fine;
    EXPECT_NO_THROW(validate(s)) << fine;
    EXPECT_EQ(make_schedule(s).attention_factor, fine);
  }
  for (const double rounds_outside : {0x1.ffffffp+127, 0x1.fffffdfffffffp-127}) {  // ties to inf; to a subnormal
    s.attention_factor = rounds_outside;
    EXPECT_ROTARY_ERROR(validate(s), "must round to a normal float32");
  }
  const std::pair<double, const char*> refused[] = {
      {1e39, "attention_factor=1e+39 must round to a normal float32, in [2^-126, 3.40282347e+38]"},
      {0x1.ffffffp+127, "attention_factor=3.4028235677973366e+38 must round to"},  // rounds to float inf
      {1e-50, "attention_factor=1e-50 must round to a normal float32"},    // rounds to float 0
      {1e-40, "attention_factor=1e-40 must round to"},                            // a float subnormal
  };
  for (const auto& [factor, needle] : refused) {
    s.attention_factor = factor;
    EXPECT_ROTARY_ERROR(validate(s), needle);
    EXPECT_ROTARY_ERROR(make_schedule(s), needle);
  }
}

TEST(Spec, Llama3) {
  Spec s{.head_dim = 128, .schedule = ScheduleType::llama3, .factor = 8.0,
         .original_max_position = 8192};
  EXPECT_ROTARY_ERROR(validate(s), "needs low_freq_factor");
  s.low_freq_factor = 1.0;
  EXPECT_ROTARY_ERROR(validate(s), "needs high_freq_factor");
  s.high_freq_factor = 1.0;  // Llama 4 Scout: equal factors, an empty smoothing band
  EXPECT_NO_THROW(validate(s));
  s.high_freq_factor = 0.5;
  EXPECT_ROTARY_ERROR(validate(s), "low_freq_factor=1 must be <= high_freq_factor=0.5");
  s.high_freq_factor = kNaN;
  EXPECT_ROTARY_ERROR(validate(s), "high_freq_factor=nan must be finite");
}

TEST(Spec, Longrope) {
  Spec s{.head_dim = 8, .schedule = ScheduleType::longrope, .original_max_position = 4096};
  s.short_factor = {1, 1, 1};
  s.long_factor = {1, 1, 1, 1};
  EXPECT_ROTARY_ERROR(validate(s), "short_factor has 3 values but rotary_dim/2=4");
  s.short_factor = {1, 1, 1, 1};
  s.long_factor = {1, 2, 0, 1};
  EXPECT_ROTARY_ERROR(validate(s), "long_factor[2]=0 must be finite and > 0");
  s.long_factor = {1, 2, kNaN, 1};
  EXPECT_ROTARY_ERROR(validate(s), "long_factor[2]=nan must be finite and > 0");
  s.long_factor = {1, 2, 3, 4};
  EXPECT_NO_THROW(validate(s));
  s.original_max_position = 1;
  EXPECT_ROTARY_ERROR(validate(s), "original_max_position=1 must be >= 2 for schedule longrope");
}

TEST(Spec, Monotone) {
  Spec s{.head_dim = 64, .schedule = ScheduleType::monotone};
  EXPECT_ROTARY_ERROR(validate(s), "schedule monotone needs max_length");
  s.max_length = 1;
  EXPECT_ROTARY_ERROR(validate(s), "max_length=1 must be in [2, 2^31]");
  s.max_length = 4096;
  s.monotone_scale = -1;
  EXPECT_ROTARY_ERROR(validate(s), "monotone_scale=-1 must be > 0");
  s.monotone_scale = 0.01;  // (4095) * 0.01 = 40.95 rad > 2π
  EXPECT_ROTARY_ERROR(make_schedule(s), "monotone_scale=0.01 breaks");
}

TEST(Spec, ParseNames) {
  EXPECT_EQ(parse_pairing("half"), Pairing::half);
  EXPECT_EQ(parse_pairing("interleaved"), Pairing::interleaved);
  EXPECT_ROTARY_ERROR(parse_pairing("neox"), "pairing='neox' must be interleaved or half");
  for (const char* name : {"default", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope", "monotone"}) {
    EXPECT_EQ(to_string(parse_schedule(name)), name);
  }
  EXPECT_ROTARY_ERROR(parse_schedule("su"), "schedule='su' must be one of");
  // A long or binary value is echoed as an excerpt, not whole.
  const std::string long_text(100000, 'x');
  for (const auto& parse : {std::function<void()>([&] { parse_pairing(long_text); }),
                            std::function<void()>([&] { parse_schedule(long_text); })}) {
    try {
      parse();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_LT(std::string(e.what()).size(), 400u);
      EXPECT_NE(std::string(e.what()).find("... (100000 bytes)"), std::string::npos) << e.what();
    }
  }
  EXPECT_ROTARY_ERROR(parse_pairing(std::string("ha\0lf", 5)), "pairing='ha\\x00lf'");
}

TEST(Spec, SeqLenRange) {
  EXPECT_ROTARY_ERROR(make_schedule(base_spec(), -1), "seq_len=-1 must be in [0, 2^31]");
}

}  // namespace
}  // namespace rotary
