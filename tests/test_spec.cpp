// Spec validation: every rule has a test that checks the message.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

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

// Error::field names the Spec field a rule is about (front ends map it to their own option), and
// is one of spec_fields()' names, or "schedule"/"seq_len".
TEST(Spec, ErrorsNameTheirField) {
  const auto field_of = [](const std::function<void()>& call) {
    try {
      call();
    } catch (const Error& e) {
      return e.field();
    }
    return std::string("<no error>");
  };
  const auto with = [](auto set) {
    Spec s = base_spec();
    set(s);
    return [s] { validate(s); };
  };
  EXPECT_EQ(field_of(with([](Spec& s) { s.head_dim = 0; })), "head_dim");
  EXPECT_EQ(field_of(with([](Spec& s) { s.rotary_dim = 130; })), "rotary_dim");
  EXPECT_EQ(field_of(with([](Spec& s) { s.base = 0.5; })), "base");
  EXPECT_EQ(field_of(with([](Spec& s) {
              s.schedule = ScheduleType::linear;
              s.factor = -2.0;
            })),
            "factor");
  EXPECT_EQ(field_of(with([](Spec& s) { s.schedule = ScheduleType::linear; })), "schedule");
  EXPECT_EQ(field_of(with([](Spec& s) { s.factor = 2.0; })), "factor");  // unused by default
  EXPECT_EQ(field_of(with([](Spec& s) { s.xpos_center = 3.0; })), "xpos_center");
  EXPECT_EQ(field_of([] { make_schedule(base_spec(), int64_t{-1}); }), "seq_len");
  // A message that names no single field carries none.
  EXPECT_EQ(field_of([] { parse_schedule("nope"); }), "");
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
  EXPECT_ROTARY_ERROR(validate(s), "beta_fast=1 must be >= beta_slow=32");
  // Equal betas (Kimi K2: 1 and 1) are accepted as transformers does: the zero-width ramp
  // between the equal correction dims is widened by 0.001.
  s.beta_fast = 1;
  s.beta_slow = 1;
  EXPECT_NO_THROW(validate(s));
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
  for (const char* name : {"default", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope", "monotone",
                           "proportional"}) {
    EXPECT_EQ(to_string(parse_schedule(name)), name);
  }
  EXPECT_ROTARY_ERROR(parse_schedule("su"), "schedule='su' must be one of default, linear, ntk, dynamic, yarn, "
                                            "llama3, longrope, monotone, proportional");
  for (const char* name : {"single", "sections", "interleaved_sections", "alternating_sections", "axial",
                           "axial_even_odd"}) {
    EXPECT_EQ(to_string(parse_stream_layout(name)), name);
  }
  EXPECT_ROTARY_ERROR(parse_stream_layout("mrope", "--stream-layout"),
                      "--stream-layout='mrope' must be one of single, sections, interleaved_sections, "
                      "alternating_sections, axial, axial_even_odd");
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

TEST(Spec, EnumsOutOfRange) {
  Spec s = base_spec();
  s.pairing = static_cast<Pairing>(5);
  EXPECT_ROTARY_ERROR(validate(s), "pairing=5 is not interleaved or half");
  s = base_spec();
  s.schedule = static_cast<ScheduleType>(99);
  EXPECT_ROTARY_ERROR(validate(s), "schedule=99 is not a schedule type");
  s = base_spec();
  s.stream_layout = static_cast<StreamLayout>(-1);
  EXPECT_ROTARY_ERROR(validate(s), "stream_layout=-1 is not a stream layout");
}

TEST(Spec, RotaryOffset) {
  Spec s{.head_dim = 128, .rotary_dim = 64, .rotary_offset = 64};  // nope-first: the slice last
  EXPECT_NO_THROW(validate(s));
  s.rotary_offset = 65;
  EXPECT_ROTARY_ERROR(validate(s), "rotary_offset=65 must be in [0, head_dim - rotary_dim = 64]");
  s.rotary_offset = -1;
  EXPECT_ROTARY_ERROR(make_schedule(s), "rotary_offset=-1 must be in [0, head_dim - rotary_dim = 64]");
  EXPECT_ROTARY_ERROR(validate(Spec{.head_dim = 64, .rotary_offset = 1}),
                      "rotary_offset=1 must be in [0, head_dim - rotary_dim = 0]");
}

TEST(Spec, Blocks) {
  Spec s{.head_dim = 72, .blocks = 2};  // Gemma 4 vision
  EXPECT_NO_THROW(validate(s));
  s.blocks = 0;
  EXPECT_ROTARY_ERROR(validate(s), "blocks=0 must be >= 1");
  s.blocks = 5;
  EXPECT_ROTARY_ERROR(validate(s), "blocks=5 must divide rotary_dim/2=36");
  s.blocks = 2;
  s.pairing = Pairing::interleaved;
  EXPECT_ROTARY_ERROR(validate(s), "blocks=2 needs pairing half (block_half), not interleaved");
}

TEST(Spec, SectionsNeedAMultiStreamLayout) {
  Spec s = base_spec();
  s.sections = {16, 24, 24};
  EXPECT_ROTARY_ERROR(validate(s), "sections is set but stream_layout single does not use it");
  s = base_spec();
  for (StreamLayout layout : {StreamLayout::sections, StreamLayout::interleaved_sections,
                              StreamLayout::alternating_sections, StreamLayout::axial,
                              StreamLayout::axial_even_odd}) {
    s.stream_layout = layout;
    EXPECT_ROTARY_ERROR(validate(s), "stream_layout " + std::string(to_string(layout)) + " needs sections");
  }
}

TEST(Spec, SectionsCountValuesAndSum) {
  Spec s{.head_dim = 128, .stream_layout = StreamLayout::sections, .sections = {16, 24, 24}};
  EXPECT_NO_THROW(validate(s));
  s.sections = {16, 0, 48};
  EXPECT_ROTARY_ERROR(validate(s), "sections[1]=0 must be > 0");
  s.sections = {16, -24, 72};
  EXPECT_ROTARY_ERROR(validate(s), "sections[1]=-24 must be > 0");
  s.sections = {64};
  EXPECT_ROTARY_ERROR(validate(s), "sections=[64] lists 1 streams; stream_layout sections needs 2 to 8");
  s.sections = std::vector<int64_t>(9, 1);
  EXPECT_ROTARY_ERROR(validate(s), "sections=[1,1,1,1,1,1,1,1,1] lists 9 streams");
  s.sections = {16, 24, 20};
  EXPECT_ROTARY_ERROR(validate(s), "sections=[16,24,20] sum to 60 but rotary_dim/2=64");
  s.sections = {int64_t{1} << 62, int64_t{1} << 62, int64_t{1} << 62};
  EXPECT_ROTARY_ERROR(validate(s), "sum past 2^63 but rotary_dim/2=64");
  s.sections = std::vector<int64_t>(100000, 1);  // shown as an excerpt
  try {
    validate(s);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u) << e.what();
    EXPECT_NE(std::string(e.what()).find("...] (100000 values) lists 100000 streams"), std::string::npos) << e.what();
  }
  // Axial and interleaved sections sum to rotary_dim/2 too, over the rotated slice.
  s = Spec{.head_dim = 128, .rotary_dim = 64, .stream_layout = StreamLayout::axial, .sections = {16, 24}};
  EXPECT_ROTARY_ERROR(validate(s), "sections=[16,24] sum to 40 but rotary_dim/2=32");
}

TEST(Spec, InterleavedSectionsMustEachGetTheirCount) {
  Spec s{.head_dim = 128, .stream_layout = StreamLayout::interleaved_sections, .sections = {24, 20, 20}};
  EXPECT_NO_THROW(validate(s));
  s.sections = {4, 30, 30};  // pairs 1, 4, ..., 61: 21 of them, not 30
  EXPECT_ROTARY_ERROR(validate(s), "sections=[4,30,30] do not interleave over rotary_dim/2=64: stream 1 "
                                   "(pairs j % 3 == 1 below 3*30) gets 21 pairs, not 30");
  s.sections = {22, 21, 21};  // stream 1: 1, 4, ..., 61 (21); stream 2: 2, 5, ..., 62 (21)
  EXPECT_NO_THROW(validate(s));
  s.sections = {21, 21, 22};  // stream 2 would need pair 65
  EXPECT_ROTARY_ERROR(validate(s), "stream 2 (pairs j % 3 == 2 below 3*22) gets 21 pairs, not 22");
}

TEST(Spec, AlternatingAndEvenOddSections) {
  Spec s{.head_dim = 128, .pairing = Pairing::interleaved, .stream_layout = StreamLayout::alternating_sections,
         .sections = {22, 22, 20}};
  EXPECT_NO_THROW(validate(s));
  s.sections = {32, 32};
  EXPECT_ROTARY_ERROR(validate(s), "sections=[32,32] must list 3 streams [height, width, time] for "
                                   "stream_layout alternating_sections");
  s.sections = {22, 20, 22};
  EXPECT_ROTARY_ERROR(validate(s), "sections=[22,20,22]: height 22 and width 20 must be equal");
  s = Spec{.head_dim = 64, .stream_layout = StreamLayout::axial_even_odd, .sections = {16, 16}};
  EXPECT_NO_THROW(validate(s));
  s.sections = {10, 10, 12};
  EXPECT_ROTARY_ERROR(validate(s), "sections=[10,10,12] must list 2 streams [height, width] for stream_layout "
                                   "axial_even_odd");
  s.sections = {20, 12};
  EXPECT_ROTARY_ERROR(validate(s), "sections=[20,12]: stream_layout axial_even_odd needs two equal sections");
}

TEST(Spec, AxialLayoutsTakeOnlyPerFrequencySchedules) {
  Spec s{.head_dim = 80, .schedule = ScheduleType::yarn, .factor = 2.0, .original_max_position = 4096,
         .stream_layout = StreamLayout::axial, .sections = {20, 20}};
  EXPECT_ROTARY_ERROR(validate(s), "schedule yarn cannot be used with stream_layout axial: it does not scale "
                                   "each frequency on its own (those that do: default, linear, llama3, "
                                   "longrope, monotone)");
  s.stream_layout = StreamLayout::axial_even_odd;
  EXPECT_ROTARY_ERROR(validate(s), "schedule yarn cannot be used with stream_layout axial_even_odd");
  s = Spec{.head_dim = 80, .schedule = ScheduleType::linear, .factor = 2.0, .stream_layout = StreamLayout::axial,
           .sections = {20, 20}};
  EXPECT_NO_THROW(validate(s));
}

TEST(Spec, Proportional) {
  Spec s{.head_dim = 256, .schedule = ScheduleType::proportional};
  EXPECT_ROTARY_ERROR(validate(s), "schedule proportional needs partial_rotary_factor");
  for (const double bad : {0.0, -0.5, 1.5, kNaN, kInf}) {
    s.partial_rotary_factor = bad;
    EXPECT_ROTARY_ERROR(validate(s), fmt::format("partial_rotary_factor={} must be in (0, 1]", bad));
  }
  s.partial_rotary_factor = 0.25;
  EXPECT_NO_THROW(validate(s));
  s.rotary_dim = 64;
  EXPECT_ROTARY_ERROR(validate(s), "rotary_dim=64 must equal head_dim=256 for schedule proportional "
                                   "(partial_rotary_factor=0.25 picks the pairs that turn)");
  s.rotary_dim = 0;
  s.factor = 2.0;  // transformers divides by it
  EXPECT_NO_THROW(validate(s));
  s.factor = -1.0;
  EXPECT_ROTARY_ERROR(validate(s), "factor=-1 must be > 0");
  s.factor.reset();
  s.beta_fast = 32;
  EXPECT_ROTARY_ERROR(validate(s), "beta_fast is set but schedule proportional does not use it");
  Spec other = base_spec();
  other.partial_rotary_factor = 0.5;
  EXPECT_ROTARY_ERROR(validate(other), "partial_rotary_factor is set but schedule default does not use it");
}

TEST(Spec, SeqLenRange) {
  EXPECT_ROTARY_ERROR(make_schedule(base_spec(), -1), "seq_len=-1 must be in [0, 2^31]");
}

}  // namespace
}  // namespace rotary
