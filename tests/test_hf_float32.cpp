// transformers' own float32 inv_freq (Schedule::inv_freq_hf32) and the hf_float32 angles built on
// it, against values printed by torch 2.15 / transformers 5.23 on an x86-64 CPU with ATen
// capability AVX2 (each list names the command that printed it), not by the code under test.
#include <bit>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "rotary/apply.hpp"
#include "rotary/schedule.hpp"
#include "rotary/table.hpp"
#include "support/oracle.hpp"

#include <mpfr.h>

#include <algorithm>
#include <initializer_list>

namespace rotary {
namespace {

// Bit for bit (NaN == NaN), naming the pair, except the pairs `torch_misrounds` whose power torch's
// CPU pow does not round correctly (its vectorised 1-ulp pow): there rotary's correctly rounded
// power makes inv_freq differ from transformers' printed value, by at most 2 ulps.
void expect_bits(const std::vector<float>& actual, const std::vector<float>& expected, const char* what,
                 std::initializer_list<size_t> torch_misrounds = {}) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto a = std::bit_cast<uint32_t>(actual[i]), e = std::bit_cast<uint32_t>(expected[i]);
    if (std::find(torch_misrounds.begin(), torch_misrounds.end(), i) != torch_misrounds.end()) {
      EXPECT_NE(a, e) << what << " pair " << i << ": expected torch's misrounded power to show";
      EXPECT_LE(a > e ? a - e : e - a, 2u) << what << " pair " << i;
      continue;
    }
    EXPECT_EQ(a, e) << what << " pair " << i << ": " << actual[i] << " vs transformers " << expected[i];
  }
}

// The correctly rounded float32 power x^y of float32 operands, from MPFR (the oracle of the pow
// rotary uses).
float mpfr_pow_f32(float x, float y) {
  mpfr_t a, b, r;
  mpfr_inits2(200, a, b, r, static_cast<mpfr_ptr>(nullptr));
  mpfr_set_flt(a, x, MPFR_RNDN);
  mpfr_set_flt(b, y, MPFR_RNDN);
  mpfr_pow(r, a, b, MPFR_RNDN);
  const float out = mpfr_get_flt(r, MPFR_RNDN);
  mpfr_clears(a, b, r, static_cast<mpfr_ptr>(nullptr));
  return out;
}

// transformers' inv_freq for text schedules, printed (float.hex) by
//   from transformers import LlamaConfig
//   from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
//   c = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
//                   max_position_embeddings=mpe, rope_parameters={...})
//   ROPE_INIT_FUNCTIONS[rope_type](c, seq_len=...)[0]
//   (default: LlamaRotaryEmbedding.compute_default_rope_parameters(c)[0])
// with each case's head_dim, mpe and rope_parameters below.
TEST(InvFreqHf32, DefaultPhi3MiniShape) {
  // head_dim 96, {"rope_type": "default", "rope_theta": 10000.0}: pair 20's power is one torch's pow
  // does not round correctly.
  const std::vector<float> hf = {
      0x1p+0f, 0x1.a69b6p-1f, 0x1.5cd25p-1f, 0x1.1feb34p-1f, 0x1.db4c78p-2f, 0x1.885044p-2f, 0x1.43d136p-2f,
      0x1.0b47b4p-2f, 0x1.b93a6ap-3f, 0x1.6c310ep-3f, 0x1.2c9af4p-3f, 0x1.f03ddep-4f, 0x1.99999ap-4f,
      0x1.5215e6p-4f, 0x1.170ea8p-4f, 0x1.ccab84p-5f, 0x1.7c3d2ap-5f, 0x1.39d9d2p-5f, 0x1.030dc6p-5f,
      0x1.aba5ecp-6f, 0x1.60fb8ep-6f, 0x1.235a72p-6f, 0x1.e0f7ecp-7f, 0x1.8cfe5p-7f, 0x1.47ae14p-7f,
      0x1.0e77fp-7f, 0x1.be7dd2p-8f, 0x1.708938p-8f, 0x1.3030f4p-8f, 0x1.f62946p-9f, 0x1.9e7c7p-9f,
      0x1.561e5cp-9f, 0x1.1a62d2p-9f, 0x1.d22a5p-10f, 0x1.80c65cp-10f, 0x1.3d983ap-10f, 0x1.0624dep-10f,
      0x1.b0bfe4p-11f, 0x1.653174p-11f, 0x1.26d42cp-11f, 0x1.e6b4b8p-12f, 0x1.91ba9ep-12f, 0x1.4b96cp-12f,
      0x1.11b1e4p-12f, 0x1.c3d14ep-13f, 0x1.74eea6p-13f, 0x1.33d1e4p-13f, 0x1.fc26c6p-14f};
  const Schedule s = make_schedule(Spec{.head_dim = 96, .base = 10000.0});
  expect_bits(s.inv_freq_hf32, hf, "default", {20});
  // transformers' formula 1 / base ** (fl32(2i) / fl32(96)) with the correctly rounded power:
  for (size_t i = 0; i < hf.size(); ++i) {
    const float exponent = static_cast<float>(2 * i) / 96.0f;
    EXPECT_EQ(s.inv_freq_hf32[i], 1.0f / mpfr_pow_f32(10000.0f, exponent)) << "pair " << i;
  }
  EXPECT_NE(s.inv_freq_hf32[19], static_cast<float>(s.inv_freq[19]));  // not the float32 nearest the exact value
}

TEST(InvFreqHf32, LinearAndProportional) {
  // head_dim 32, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 3.0}
  const std::vector<float> linear = {
      0x1.555556p-2f, 0x1.7fe446p-3f, 0x1.afc19ep-4f, 0x1.e596bep-5f, 0x1.111112p-5f, 0x1.331d02p-6f,
      0x1.5967b2p-7f, 0x1.847898p-8f, 0x1.b4e81ap-9f, 0x1.eb61ap-10f, 0x1.1452f6p-10f, 0x1.36c6ep-11f,
      0x1.5d867ep-12f, 0x1.891ae6p-13f, 0x1.ba1e56p-14f, 0x1.f13e32p-15f};
  expect_bits(make_schedule(Spec{.head_dim = 32, .schedule = ScheduleType::linear, .factor = 3.0}).inv_freq_hf32,
              linear, "linear");
  // head_dim 64, {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.5, "factor": 1.5}:
  // 16 powers, then 16 zeros.
  std::vector<float> proportional = {
      0x1.555556p-1f, 0x1.bb4faap-2f, 0x1.1fe0cep-2f, 0x1.75e2b6p-3f, 0x1.e596bep-4f, 0x1.3b551ep-4f,
      0x1.998acep-5f, 0x1.09f2fep-5f, 0x1.5967b2p-6f, 0x1.c09972p-7f, 0x1.234feep-7f, 0x1.7a5878p-8f,
      0x1.eb61ap-9f, 0x1.3f1812p-9f, 0x1.9e6d78p-10f, 0x1.0d1f26p-10f};
  proportional.resize(32, 0.0f);
  expect_bits(make_schedule(Spec{.head_dim = 64, .base = 1e6, .schedule = ScheduleType::proportional, .factor = 1.5,
                                 .partial_rotary_factor = 0.5})
                  .inv_freq_hf32,
              proportional, "proportional");
}

TEST(InvFreqHf32, YarnGptOssAndLlama3Llama32) {
  // head_dim 64, mpe 131072, {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
  // "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
  // (gpt-oss-20b): torch's pow misrounds the powers of pairs 6 and 10.
  const std::vector<float> yarn = {
      0x1p+0f, 0x1.60ca6ap-1f, 0x1.e62d44p-2f, 0x1.4eff54p-2f, 0x1.cda7f4p-3f, 0x1.3e19fap-3f, 0x1.b65f3ep-4f,
      0x1.2e0ec8p-4f, 0x1.a04328p-5f, 0x1.03bbaap-5f, 0x1.3cc8dep-6f, 0x1.7bd928p-7f, 0x1.bd508p-8f,
      0x1.f9fc28p-9f, 0x1.127006p-9f, 0x1.13eefp-10f, 0x1.dea878p-12f, 0x1.0f3372p-13f, 0x1.415b8cp-15f,
      0x1.badbf8p-16f, 0x1.31265p-16f, 0x1.a485f4p-17f, 0x1.21c258p-17f, 0x1.8f5056p-18f, 0x1.132518p-18f,
      0x1.7b2c8ep-19f, 0x1.05448ap-19f, 0x1.680cdp-20f, 0x1.f02e5p-21f, 0x1.55e4p-21f, 0x1.d727d6p-22f,
      0x1.44a5a6p-22f};
  expect_bits(make_schedule(Spec{.head_dim = 64, .base = 150000.0, .schedule = ScheduleType::yarn, .factor = 32.0,
                                 .original_max_position = 4096, .beta_fast = 32.0, .beta_slow = 1.0,
                                 .truncate = false})
                  .inv_freq_hf32,
              yarn, "yarn", {6, 10});
  // head_dim 64, mpe 131072, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
  // "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
  const std::vector<float> llama3 = {
      0x1p+0f, 0x1.53c38cp-1f, 0x1.c2ef78p-2f, 0x1.2b3dc6p-2f, 0x1.8d276p-3f, 0x1.078d4p-3f, 0x1.5dc95ap-4f,
      0x1.d03ccep-5f, 0x1.34119p-5f, 0x1.98de92p-6f, 0x1.0f5386p-6f, 0x1.681adap-7f, 0x1.ddee9ep-8f,
      0x1.3d2804p-8f, 0x1.a4ee4p-9f, 0x1.524f36p-10f, 0x1.c26c4p-12f, 0x1.9731eep-14f, 0x1.46831ap-16f,
      0x1.b15902p-17f, 0x1.1f91fp-17f, 0x1.7da9e8p-18f, 0x1.fa8b86p-19f, 0x1.5024d6p-19f, 0x1.be2188p-20f,
      0x1.280d96p-20f, 0x1.88ec2p-21f, 0x1.04be68p-21f, 0x1.5a0f4ep-22f, 0x1.cb4a9ap-23f, 0x1.30c94ep-23f,
      0x1.94836p-24f};
  expect_bits(make_schedule(Spec{.head_dim = 64, .base = 500000.0, .schedule = ScheduleType::llama3, .factor = 32.0,
                                 .original_max_position = 8192, .low_freq_factor = 1.0, .high_freq_factor = 4.0})
                  .inv_freq_hf32,
              llama3, "llama3");
}

TEST(InvFreqHf32, DynamicAndLongropeAfterTheUpdate) {
  // head_dim 32, mpe 2048, {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, at
  // seq_len=torch.tensor(1000001) (the forward's update passes a tensor: float32 arithmetic).
  const std::vector<float> dynamic = {
      0x1p+0f, 0x1.6bedbcp-2f, 0x1.02ae08p-3f, 0x1.6fbdp-5f, 0x1.05634p-6f, 0x1.739678p-8f, 0x1.081fb8p-9f,
      0x1.777a44p-11f, 0x1.0ae386p-12f, 0x1.7b687ap-14f, 0x1.0daebep-15f, 0x1.7f6138p-17f, 0x1.108172p-18f,
      0x1.83649cp-20f, 0x1.135bb6p-21f, 0x1.8772cp-23f};
  const Spec dynamic_spec{.head_dim = 32, .schedule = ScheduleType::dynamic, .factor = 2.0, .max_position = 2048};
  expect_bits(make_schedule(dynamic_spec, 1000001).inv_freq_hf32, dynamic, "dynamic", {10});  // torch's pow misrounds 10
  // Below L the init values, which equal default's for factor 2.
  EXPECT_EQ(make_schedule(dynamic_spec, 2048).inv_freq_hf32, make_schedule(Spec{.head_dim = 32}).inv_freq_hf32);
  // head_dim 16, mpe 131072, {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings":
  // 4096, "short_factor": [1.0, 1.05, 1.1, 1.3, 1.7, 2.5, 3.1, 4.0],
  // "long_factor": [1.0, 1.2, 1.9, 3.3, 7.1, 11.5, 20.25, 31.0]}, without seq_len and at seq_len=4097.
  const Spec longrope{.head_dim = 16, .schedule = ScheduleType::longrope, .original_max_position = 4096,
                      .max_position = 131072, .short_factor = {1.0, 1.05, 1.1, 1.3, 1.7, 2.5, 3.1, 4.0},
                      .long_factor = {1.0, 1.2, 1.9, 3.3, 7.1, 11.5, 20.25, 31.0}};
  expect_bits(make_schedule(longrope).inv_freq_hf32,
              {0x1p+0f, 0x1.3465bap-2f, 0x1.745d18p-4f, 0x1.8e8b58p-6f, 0x1.818182p-8f, 0x1.4b96cp-10f,
               0x1.524016p-12f, 0x1.4b96cp-14f},
              "longrope short");
  expect_bits(make_schedule(longrope, 4097).inv_freq_hf32,
              {0x1p+0f, 0x1.0dd902p-2f, 0x1.af286cp-5f, 0x1.3a012ep-7f, 0x1.713786p-10f, 0x1.20569p-12f,
               0x1.9e4094p-15f, 0x1.564908p-17f},
              "longrope long");
}

// Vision towers' buffers, printed by
//   Qwen2VLVisionRotaryEmbedding(Qwen2VLVisionConfig(embed_dim=1280, num_heads=16)).inv_freq
//   PixtralVisionRotaryEmbedding(PixtralVisionConfig(hidden_size=1024, num_attention_heads=16,
//                                                    head_dim=64, rope_theta=10000.0)).inv_freq
TEST(InvFreqHf32, AxialVisionTowers) {
  // Qwen2-VL: 20 powers per axis; both axes share them.
  const std::vector<float> axis = {
      0x1p+0f, 0x1.430cd6p-1f, 0x1.97a968p-2f, 0x1.013798p-2f, 0x1.44960cp-3f, 0x1.99999ap-4f, 0x1.0270aap-4f,
      0x1.462122p-5f, 0x1.9b8c26p-6f, 0x1.03ab4p-6f, 0x1.47ae14p-7f, 0x1.9d8112p-8f, 0x1.04e748p-8f,
      0x1.493cfp-9f, 0x1.9f7864p-10f, 0x1.0624dep-10f, 0x1.4acda8p-11f, 0x1.a1720ep-12f, 0x1.0763f4p-12f,
      0x1.4c605p-13f};
  std::vector<float> both = axis;
  both.insert(both.end(), axis.begin(), axis.end());
  expect_bits(make_schedule(Spec{.head_dim = 80, .stream_layout = StreamLayout::axial, .sections = {20, 20}})
                  .inv_freq_hf32,
              both, "qwen2-vl vision");
  // Pixtral: one tensor of 32 powers, then its even and odd elements.
  const std::vector<float> pixtral = {
      0x1p+0f, 0x1.1feb34p-1f, 0x1.43d136p-2f, 0x1.6c310ep-3f, 0x1.99999ap-4f, 0x1.ccab84p-5f, 0x1.030dc6p-5f,
      0x1.235a72p-6f, 0x1.47ae14p-7f, 0x1.708938p-8f, 0x1.9e7c7p-9f, 0x1.d22a5p-10f, 0x1.0624dep-10f,
      0x1.26d42cp-11f, 0x1.4b96cp-12f, 0x1.74eea6p-13f, 0x1.7ff222p-1f, 0x1.afd136p-2f, 0x1.e5a846p-3f,
      0x1.111aeep-3f, 0x1.33281ap-4f, 0x1.59742ap-5f, 0x1.84869ep-6f, 0x1.b4f7e4p-7f, 0x1.eb736p-8f,
      0x1.145ceep-8f, 0x1.36d21ap-9f, 0x1.5d931cp-10f, 0x1.892918p-11f, 0x1.ba2e4ap-12f, 0x1.f1502ap-13f,
      0x1.17a8e4p-13f};
  expect_bits(make_schedule(Spec{.head_dim = 64, .stream_layout = StreamLayout::axial_even_odd, .sections = {16, 16}})
                  .inv_freq_hf32,
              pixtral, "pixtral");
}

// Schedules transformers lacks: the float32 nearest the exact inv_freq.
TEST(InvFreqHf32, NtkAndMonotoneAreTheNearestFloats) {
  for (const Spec& spec : {Spec{.head_dim = 64, .schedule = ScheduleType::ntk, .factor = 4.0},
                           Spec{.head_dim = 64, .schedule = ScheduleType::monotone, .max_length = 4096}}) {
    const Schedule s = make_schedule(spec);
    ASSERT_EQ(s.inv_freq_hf32.size(), s.inv_freq.size());
    for (size_t i = 0; i < s.inv_freq.size(); ++i) EXPECT_EQ(s.inv_freq_hf32[i], static_cast<float>(s.inv_freq[i]));
  }
}

// hf_float32 rows use inv_freq_hf32: at position 1 the angle is the frequency itself, so the row is
// fl32(cos f) * fl32(g) with f the Schedule's float32 frequency (cos from MPFR), not fl32(inv_freq).
TEST(InvFreqHf32, HfFloat32RowsAndDriftUseIt) {
  Schedule s{.head_dim = 4, .rotary_dim = 4, .pairing = Pairing::half, .inv_freq = {1.0, 0.5}, .attention_factor = 1.5};
  s.inv_freq_hf32 = {std::nextafter(1.0f, 2.0f), 0.5f};
  float cos_row[2], sin_row[2];
  table_row(s, 1, cos_row, sin_row, AngleMode::hf_float32);
  const test::Exact e = test::mpfr_cos_sin(1, static_cast<double>(s.inv_freq_hf32[0]));
  EXPECT_EQ(cos_row[0], static_cast<float>(e.cos) * 1.5f);
  EXPECT_EQ(sin_row[0], static_cast<float>(e.sin) * 1.5f);
  const Table table = Table::at(s, std::vector<int64_t>{1}, AngleMode::hf_float32);
  EXPECT_EQ(table.cos_row(0)[0], cos_row[0]);
  EXPECT_NE(cos_row[0], static_cast<float>(std::cos(1.0)) * 1.5f);
  // Drift at p = 2^20: fl32((1 + 2^-23) * 2^20) = 2^20 + 2^-3, off the exact angle 2^20 by 2^-3.
  const Float32Drift drift = hf_float32_drift(s, int64_t{1} << 20);
  EXPECT_EQ(drift.max_angle_error, 0x1p-3);
  EXPECT_EQ(drift.worst_pair, 0);
  // Without inv_freq_hf32 (a Schedule built by hand): the float32 nearest inv_freq.
  s.inv_freq_hf32.clear();
  table_row(s, 1, cos_row, sin_row, AngleMode::hf_float32);
  EXPECT_EQ(cos_row[0], static_cast<float>(test::mpfr_cos_sin(1, 1.0).cos) * 1.5f);
  EXPECT_EQ(hf_float32_drift(s, int64_t{1} << 20).max_angle_error, 0.0);
}

// What hf_float32 angles need of inv_freq_hf32, checked before anything is written; exact angles
// do not read it.
TEST(InvFreqHf32, BadValuesAreRefusedForHfFloat32Only) {
  Schedule s{.head_dim = 8, .rotary_dim = 8, .pairing = Pairing::half, .inv_freq = {1.0, 0.1, 0.01, 0.001}};
  s.inv_freq_hf32 = {1.0f, 0.1f, 0.01f};
  EXPECT_ROTARY_ERROR(Table::range(s, 0, 4, AngleMode::hf_float32), "inv_freq_hf32 has 3 values but rotary_dim/2=4");
  s.inv_freq_hf32 = {1.0f, 0.1f, NAN, 0.001f};
  EXPECT_ROTARY_ERROR(Table::at(s, std::vector<int64_t>{3, 1}, AngleMode::hf_float32),
                      "inv_freq_hf32[2]=nan (transformers' float32 inv_freq) must be finite, >= 0 and <= 2^20");
  float cos_row[4] = {7, 7, 7, 7}, sin_row[4] = {7, 7, 7, 7};
  EXPECT_ROTARY_ERROR(table_row(s, 2, cos_row, sin_row, AngleMode::hf_float32), "inv_freq_hf32[2]=nan");
  EXPECT_EQ(cos_row[0], 7.0f);  // nothing written
  EXPECT_ROTARY_ERROR(hf_float32_drift(s, 5), "inv_freq_hf32[2]=nan");
  s.inv_freq_hf32[2] = 2e6f;
  EXPECT_ROTARY_ERROR(Table::range(s, 0, 1, AngleMode::hf_float32), "inv_freq_hf32[2]=2000000 (transformers'");
  EXPECT_NO_THROW(Table::range(s, 0, 4));
  EXPECT_NO_THROW(table_row(s, 2, cos_row, sin_row));
}

// Where transformers' float32 arithmetic breaks down and the double schedule does not: llama3 with
// low_freq_factor == high_freq_factor a double ulp off the band edge: L/lf just above pair 0's
// wavelength 2π, so the double schedule keeps pair 0, while float32 rounds both to fl32(2π), puts
// the pair in the smoothing band and divides by hf - lf = 0 (NaN). make_schedule
// succeeds (exact angles are fine); hf_float32 angles are refused, naming the pair.
TEST(InvFreqHf32, Llama3FloatBandEdgeNaNRefusedForHfFloat32) {
  const double two_pi = 2 * std::numbers::pi;
  double lf = 8192 / two_pi;
  while (8192 / lf <= two_pi) lf = std::nextafter(lf, 0.0);  // L/lf just above 2π
  const Schedule s = make_schedule(Spec{.head_dim = 8, .schedule = ScheduleType::llama3, .factor = 8.0,
                                        .original_max_position = 8192, .low_freq_factor = lf,
                                        .high_freq_factor = lf});
  ASSERT_EQ(static_cast<float>(8192 / lf), static_cast<float>(two_pi));
  EXPECT_EQ(s.inv_freq[0], 1.0);
  EXPECT_TRUE(std::isnan(s.inv_freq_hf32[0]));
  EXPECT_NO_THROW(Table::range(s, 0, 8));
  EXPECT_ROTARY_ERROR(Table::range(s, 0, 8, AngleMode::hf_float32), "inv_freq_hf32[0]=nan");
}

}  // namespace
}  // namespace rotary

namespace rotary {
namespace {

// ApplyArgs::numerics = hf_float32 without a table computes transformers' float32 angles on the fly:
// bit for bit what a Table::at(..., hf_float32) of the same positions gives, on every backend, for q
// and k in every dtype, both pairings, M-RoPE streams, xPos and an attention factor; and the rotation
// of one pair against the float32 pipeline written out here (fl32(f * fl32(p)), MPFR's cos and sin
// of that float, rounded, times fl32(g)).
TEST(HfFloat32OnTheFly, EqualsTheHfFloat32TableBitForBitOnEveryBackend) {
  struct Named {
    const char* name;
    Spec spec;
  };
  const std::vector<Named> specs = {
      {"qwen2.5 base 1e6", Spec{.head_dim = 128, .base = 1e6}},
      {"yarn g != 1 interleaved", Spec{.head_dim = 64, .pairing = Pairing::interleaved, .schedule = ScheduleType::yarn,
                                       .factor = 4.0, .original_max_position = 4096}},
      {"mrope [4, 6, 6]", Spec{.head_dim = 32, .base = 1e6, .stream_layout = StreamLayout::sections, .sections = {4, 6, 6}}},
      {"xpos", Spec{.head_dim = 48, .rotary_dim = 32, .xpos_scale_base = 4e8, .xpos_center = 1e9}},
  };
  const std::vector<int64_t> list = {0, 1, 4095, 4096, 131071, 1 << 20, 1000003, max_position_limit - 1};
  int calls = 0;
  for (const auto& [name, spec] : specs) {
    const Schedule s = make_schedule(spec);
    const int64_t tokens = static_cast<int64_t>(list.size()), d = s.head_dim;
    std::vector<int64_t> streams_positions;
    for (int k = 0; k < s.streams; ++k) {
      for (int64_t p : list) streams_positions.push_back(p >= k ? p - k : p + k);
    }
    const Positions positions = Positions::per_token(std::span<const int64_t>(streams_positions), s.streams);
    const Table table = Table::at(s, streams_positions, AngleMode::hf_float32);
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      const size_t n = static_cast<size_t>(tokens * 3 * d), nk = static_cast<size_t>(tokens * 2 * d);
      std::vector<double> q0 = test::random_doubles(n, 1), k0 = test::random_doubles(nk, 2);
      auto as_bytes = [&](const std::vector<double>& v) {
        std::vector<unsigned char> bytes(v.size() * static_cast<size_t>(size_of(dtype)));
        for (size_t i = 0; i < v.size(); ++i) {
          test::store_element(dtype, bytes.data() + i * static_cast<size_t>(size_of(dtype)), static_cast<float>(v[i]));
        }
        return bytes;
      };
      auto run = [&](Backend backend, bool use_table) {
        std::vector<unsigned char> q = as_bytes(q0), k = as_bytes(k0);
        apply(s, ApplyArgs{.q = TensorView::bshd(q.data(), dtype, 1, tokens, 3, d),
                           .k = TensorView::bshd(k.data(), dtype, 1, tokens, 2, d), .positions = positions,
                           .table = use_table ? &table : nullptr,
                           .numerics = AngleMode::hf_float32, .backend = backend});
        q.insert(q.end(), k.begin(), k.end());
        return q;
      };
      const auto want = run(Backend::reference, true);
      EXPECT_EQ(run(Backend::reference, false), want) << name << " " << to_string(dtype);
      EXPECT_EQ(run(Backend::cpu, false), want) << name << " " << to_string(dtype);
      EXPECT_EQ(run(Backend::cpu, true), want) << name << " " << to_string(dtype);
      calls += 4;
    }
  }
  EXPECT_EQ(calls, 64);
}

TEST(HfFloat32OnTheFly, OnePairIsTheFloat32PipelineWrittenOut) {
  const Schedule s = make_schedule(Spec{.head_dim = 128, .base = 1e6, .schedule = ScheduleType::linear, .factor = 2.0});
  for (const int64_t p : {int64_t{7}, int64_t{131071}, max_position_limit - 1}) {
    for (const int64_t j : {int64_t{0}, int64_t{37}, int64_t{63}}) {
      std::vector<float> x(128, 0.0f);
      x[static_cast<size_t>(j)] = 1.0f;  // pair j = (x[j], x[j + 64]) = (1, 0): the output is (c, s)
      apply(s, ApplyArgs{.q = TensorView::bshd(x.data(), DType::f32, 1, 1, 1, 128), .positions = Positions::sequential(p),
                         .numerics = AngleMode::hf_float32});
      const float angle = s.inv_freq_hf32[static_cast<size_t>(j)] * static_cast<float>(p);
      mpfr_t a, c, sn;
      mpfr_inits2(256, a, c, sn, static_cast<mpfr_ptr>(nullptr));
      mpfr_set_d(a, static_cast<double>(angle), MPFR_RNDN);
      mpfr_sin_cos(sn, c, a, MPFR_RNDN);
      const float g = static_cast<float>(s.attention_factor);
      const float want_c = mpfr_get_flt(c, MPFR_RNDN) * g, want_s = mpfr_get_flt(sn, MPFR_RNDN) * g;
      mpfr_clears(a, c, sn, static_cast<mpfr_ptr>(nullptr));
      EXPECT_EQ(x[static_cast<size_t>(j)], want_c) << "position " << p << " pair " << j;
      EXPECT_EQ(x[static_cast<size_t>(j + 64)], want_s) << "position " << p << " pair " << j;
    }
  }
}

TEST(HfFloat32OnTheFly, RefusesWhatItCannotServe) {
  const Schedule s = make_schedule(Spec{.head_dim = 16});
  std::vector<float> q(2 * 16, 1.0f);
  const std::vector<double> fractional = {0.5, 3.0};
  EXPECT_ROTARY_ERROR(apply(s, ApplyArgs{.q = TensorView::bshd(q.data(), DType::f32, 1, 2, 1, 16),
                                         .positions = Positions::per_token(std::span<const double>(fractional)),
                                         .numerics = AngleMode::hf_float32}),
                      "positions[0]=0.5 is fractional; numerics=hf_float32 takes whole positions");
  const Table exact = Table::range(s, 0, 2);
  EXPECT_ROTARY_ERROR(apply(s, ApplyArgs{.q = TensorView::bshd(q.data(), DType::f32, 1, 2, 1, 16), .table = &exact,
                                         .numerics = AngleMode::hf_float32}),
                      "numerics=hf_float32 but the table holds exact angles");
  std::vector<float> cos(2 * 8, 1.0f), sin(2 * 8, 0.0f);
  const CallerAngles caller{.columns = CallerAngles::Columns::pairs, .cos = cos.data(), .sin = sin.data(),
                            .shape = {1, 2, 8}, .cos_strides = {16, 8, 1}, .sin_strides = {16, 8, 1}};
  EXPECT_ROTARY_ERROR(apply(s, ApplyArgs{.q = TensorView::bshd(q.data(), DType::f32, 1, 2, 1, 16), .angles = &caller,
                                         .numerics = AngleMode::hf_float32}),
                      "numerics=hf_float32 cannot apply to the caller's cos/sin");
  EXPECT_ROTARY_ERROR(apply(s, ApplyArgs{.q = TensorView::bshd(q.data(), DType::f32, 1, 2, 1, 16),
                                         .numerics = static_cast<AngleMode>(5)}),
                      "numerics=5 is not exact or hf_float32");
  EXPECT_EQ(q, std::vector<float>(2 * 16, 1.0f));
}

}  // namespace
}  // namespace rotary
