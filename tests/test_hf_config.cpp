// Config resolution: every transformers rule, from small JSONs written from the rules; presets
// against figures written out here from the public configs; float32 agreement with transformers'
// own formula.
#include <cmath>
#include <numbers>

#include "rotary/hf_config.hpp"
#include "rotary/schedule.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

ModelRope read(const std::string& json) { return read_hf_config(json); }

TEST(HfConfig, BasicsAndDefaults) {
  const ModelRope m = read(R"({"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096})");
  EXPECT_EQ(m.spec.head_dim, 128);
  EXPECT_EQ(m.spec.resolved_rotary_dim(), 128);
  EXPECT_EQ(m.spec.base, 10000.0);  // default when rope_theta is absent
  EXPECT_EQ(m.spec.schedule, ScheduleType::default_);
  EXPECT_EQ(m.spec.pairing, Pairing::half);
  EXPECT_EQ(m.num_key_value_heads, 32);  // defaults to num_attention_heads
  EXPECT_EQ(m.max_position_embeddings, 4096);
}

TEST(HfConfig, HeadDimPresentAbsentOrNull) {
  EXPECT_EQ(read(R"({"hidden_size": 2048, "num_attention_heads": 8, "head_dim": 256})").spec.head_dim, 256);
  EXPECT_EQ(read(R"({"hidden_size": 2048, "num_attention_heads": 8, "head_dim": null})").spec.head_dim, 256);
  EXPECT_EQ(read(R"({"hidden_size": 2048, "num_attention_heads": 32})").spec.head_dim, 64);
  EXPECT_EQ(read(R"({"hidden_size": 2050, "num_attention_heads": 32})").spec.head_dim, 64);  // floor division
}

TEST(HfConfig, PartialRotaryAndModelDefaults) {
  // partial_rotary_factor -> int(head_dim * factor)
  EXPECT_EQ(read(R"({"hidden_size": 2560, "num_attention_heads": 32, "partial_rotary_factor": 0.4})")
                .spec.resolved_rotary_dim(), 32);
  // Phi: default partial factor 0.5
  EXPECT_EQ(read(R"({"model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32})").spec.resolved_rotary_dim(), 40);
  // GPT-NeoX: rotary_pct default 0.25, rotary_emb_base default 10000
  const ModelRope neox = read(R"({"model_type": "gpt_neox", "hidden_size": 6144, "num_attention_heads": 64})");
  EXPECT_EQ(neox.spec.resolved_rotary_dim(), 24);
  EXPECT_EQ(neox.spec.base, 10000.0);
  const ModelRope neox2 = read(R"({"model_type": "gpt_neox", "hidden_size": 1024, "num_attention_heads": 8,
                                   "rotary_pct": 0.5, "rotary_emb_base": 50000})");
  EXPECT_EQ(neox2.spec.resolved_rotary_dim(), 64);
  EXPECT_EQ(neox2.spec.base, 50000.0);
  // GPT-J: rotary_dim key, interleaved pairing (rotate_every_two)
  const ModelRope gptj = read(R"({"model_type": "gptj", "hidden_size": 4096, "num_attention_heads": 16, "rotary_dim": 64})");
  EXPECT_EQ(gptj.spec.resolved_rotary_dim(), 64);
  EXPECT_EQ(gptj.spec.pairing, Pairing::interleaved);
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 128, "num_attention_heads": 2, "partial_rotary_factor": 0.3})"),
                      "must be even");
}

TEST(HfConfig, RopeThetaTopLevelOrInsideAndV5Parameters) {
  EXPECT_EQ(read(R"({"hidden_size": 64, "num_attention_heads": 1, "rope_theta": 500000})").spec.base, 500000.0);
  const ModelRope v5 = read(R"({"hidden_size": 64, "num_attention_heads": 1, "max_position_embeddings": 8192,
      "rope_parameters": {"rope_type": "linear", "rope_theta": 123456.0, "factor": 2.0}})");
  EXPECT_EQ(v5.spec.base, 123456.0);
  EXPECT_EQ(v5.spec.schedule, ScheduleType::linear);
  EXPECT_EQ(*v5.spec.factor, 2.0);
}

TEST(HfConfig, RopeTypeWinsOverType) {
  const ModelRope m = read(R"({"hidden_size": 64, "num_attention_heads": 1, "max_position_embeddings": 2048,
      "rope_scaling": {"type": "linear", "rope_type": "dynamic", "factor": 2.0}})");
  EXPECT_EQ(m.spec.schedule, ScheduleType::dynamic);
  EXPECT_EQ(*m.spec.max_position, 2048);  // dynamic compares n with max_position_embeddings
  const Schedule below = make_schedule(m.spec, 2048);
  const Schedule above = make_schedule(m.spec, 4096);
  EXPECT_EQ(below.inv_freq[31], std::pow(10000.0, -62.0 / 64.0));
  EXPECT_NEAR(above.inv_freq[31], std::pow(10000.0, -62.0 / 64.0) / 3.0, 1e-15);  // 2*4096/2048-1 = 3
}

TEST(HfConfig, Phi3SuAndYarnMeanLongrope) {
  for (const char* type : {"su", "yarn", "longrope"}) {
    const ModelRope m = read(std::string(R"({"model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4,
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
        "rope_scaling": {"type": ")") + type + R"(", "short_factor": [1, 2, 3, 4, 5, 6, 7, 8],
        "long_factor": [10, 20, 30, 40, 50, 60, 70, 80]}})");
    EXPECT_EQ(m.spec.schedule, ScheduleType::longrope) << type;
    EXPECT_EQ(*m.spec.original_max_position, 4096);  // top level
    const Schedule s_short = make_schedule(m.spec, 4096), s_long = make_schedule(m.spec, 4097);
    EXPECT_NEAR(s_short.inv_freq[1], std::pow(10000.0, -2.0 / 16.0) / 2.0, 1e-15);
    EXPECT_NEAR(s_long.inv_freq[1], std::pow(10000.0, -2.0 / 16.0) / 20.0, 1e-15);
    EXPECT_NEAR(s_short.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-15);
  }
  // Outside phi3, "yarn" is YaRN.
  EXPECT_EQ(read(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 4096,
                     "rope_scaling": {"type": "yarn", "factor": 2.0}})").spec.schedule, ScheduleType::yarn);
}

TEST(HfConfig, LongropeWithoutTopLevelOriginalUsesFactorForAttention) {
  const ModelRope m = read(R"({"hidden_size": 16, "num_attention_heads": 1, "max_position_embeddings": 4096,
      "rope_scaling": {"rope_type": "longrope", "factor": 16.0, "short_factor": [1,1,1,1,1,1,1,1],
      "long_factor": [2,2,2,2,2,2,2,2]}})");
  EXPECT_EQ(*m.spec.original_max_position, 4096);
  EXPECT_NEAR(make_schedule(m.spec).attention_factor, std::sqrt(1 + std::log(16.0) / std::log(4096.0)), 1e-15);
}

TEST(HfConfig, YarnKeysExplicitAndImplicitFactor) {
  // DeepSeek-V3 shape: factor 40 agrees with 163840 / 4096; mscale == mscale_all_dim -> attention 1
  const ModelRope ds = read(R"({"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
      "qk_rope_head_dim": 64, "max_position_embeddings": 163840,
      "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                       "original_max_position_embeddings": 4096, "type": "yarn"}})");
  EXPECT_EQ(ds.spec.head_dim, 64);
  EXPECT_EQ(ds.spec.pairing, Pairing::interleaved);
  EXPECT_TRUE(ds.notes.empty());
  EXPECT_EQ(make_schedule(ds.spec).attention_factor, 1.0);
  // implicit factor when factor is absent: 131072 / 4096 = 32
  const ModelRope implicit = read(R"({"hidden_size": 64, "num_attention_heads": 1, "max_position_embeddings": 131072,
      "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 4096, "truncate": false,
                       "beta_fast": 0, "attention_factor": 0.75}})");
  EXPECT_EQ(*implicit.spec.factor, 32.0);
  EXPECT_EQ(implicit.spec.truncate, false);
  EXPECT_FALSE(implicit.spec.beta_fast.has_value());  // `beta_fast or 32`: 0 means the default
  EXPECT_EQ(make_schedule(implicit.spec).attention_factor, 0.75);
  // explicit factor that disagrees with the ratio: explicit wins, with a note (Qwen2.5's card block)
  const ModelRope qwen = read(R"({"hidden_size": 3584, "num_attention_heads": 28, "max_position_embeddings": 32768,
      "rope_theta": 1000000.0, "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}})");
  EXPECT_EQ(*qwen.spec.factor, 4.0);
  ASSERT_EQ(qwen.notes.size(), 1u);
  EXPECT_NE(qwen.notes[0].find("explicit factor 4"), std::string::npos);
  // no original inside: original = max_position_embeddings
  const ModelRope plain = read(R"({"hidden_size": 64, "num_attention_heads": 1, "max_position_embeddings": 2048,
      "rope_scaling": {"type": "yarn", "factor": 8.0, "mscale": 0.707, "mscale_all_dim": 1.0}})");
  EXPECT_EQ(*plain.spec.original_max_position, 2048);
  EXPECT_NEAR(make_schedule(plain.spec).attention_factor,
              (0.1 * 0.707 * std::log(8.0) + 1) / (0.1 * std::log(8.0) + 1), 1e-15);
}

TEST(HfConfig, UnknownKeysIgnoredInvalidValuesNamed) {
  EXPECT_NO_THROW(read(R"({"hidden_size": 64, "num_attention_heads": 1, "vocab_size": 5, "whatever": {"a": [1]},
      "rope_scaling": {"rope_type": "linear", "factor": 2.0, "unused_key": 3}})"));
  EXPECT_ROTARY_ERROR(read("{not json"), "config is not valid JSON");
  EXPECT_ROTARY_ERROR(read("[1, 2]"), "config must be a JSON object");
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 64})"), "num_attention_heads is missing");
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 64, "num_attention_heads": 1, "rope_scaling": 3})"),
                      "rope_scaling=3 must be an object or null");
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 64, "num_attention_heads": 1, "rope_scaling": {"type": "linear", "factor": "x"}})"),
                      "rope_scaling.factor=\"x\" must be a number");
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 64, "num_attention_heads": 1, "rope_scaling": {"rope_type": "mrope"}})"),
                      "rope_scaling.rope_type='mrope' is not supported");
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 64, "num_attention_heads": 1, "rope_theta": "big"})"),
                      "rope_theta=\"big\" must be a number");
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 64, "num_attention_heads": 1, "max_position_embeddings": 1,
                              "rope_scaling": {"rope_type": "llama3", "factor": 8}})"),
                      "low_freq_factor is required for rope_type llama3");
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 64, "num_attention_heads": 1, "rope_scaling": {"rope_type": "yarn", "factor": 2}})"),
                      "max_position_embeddings is missing (yarn needs it)");
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3})"),
                      "num_key_value_heads=3 must divide num_attention_heads=4");
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 64, "num_attention_heads": 1, "rope_scaling": {"rope_type": "linear", "factor": -2.0}})"),
                      "factor=-2 must be > 0");
  EXPECT_ROTARY_ERROR(read_hf_config_file("/nonexistent/config.json"), "cannot be read");
}

// ---- presets: figures written out here from each model's public config.json ----
struct Expected {
  const char* name;
  int64_t head_dim, rotary_dim;
  double base;
  ScheduleType schedule;
  Pairing pairing;
  int64_t heads, kv_heads;
};

TEST(Presets, EveryPresetMatchesItsPublishedConfig) {
  using enum ScheduleType;
  const Expected expected[] = {
      {"llama-2-7b", 128, 128, 10000, default_, Pairing::half, 32, 32},
      {"codellama-7b", 128, 128, 1e6, default_, Pairing::half, 32, 32},
      {"llama-3-8b", 128, 128, 500000, default_, Pairing::half, 32, 8},
      {"llama-3.1-8b", 128, 128, 500000, llama3, Pairing::half, 32, 8},
      {"llama-3.2-1b", 64, 64, 500000, llama3, Pairing::half, 32, 8},
      {"mistral-7b-v0.1", 128, 128, 10000, default_, Pairing::half, 32, 8},
      {"qwen2.5-7b-instruct", 128, 128, 1e6, yarn, Pairing::half, 28, 4},
      {"deepseek-v3", 64, 64, 10000, yarn, Pairing::interleaved, 128, 128},
      {"phi-3-mini-128k-instruct", 96, 96, 10000, longrope, Pairing::half, 32, 32},
      {"phi-3.5-mini-instruct", 96, 96, 10000, longrope, Pairing::half, 32, 32},
      {"phi-2", 80, 32, 10000, default_, Pairing::half, 32, 32},
      {"gpt-neox-20b", 96, 24, 10000, default_, Pairing::half, 64, 64},
      {"gemma-2b", 256, 256, 10000, default_, Pairing::half, 8, 1},
      {"gpt-oss-20b", 64, 64, 150000, yarn, Pairing::half, 64, 8},
  };
  EXPECT_EQ(preset_names().size(), std::size(expected));
  for (const Expected& e : expected) {
    const ModelRope m = load_preset(e.name);
    EXPECT_EQ(m.spec.head_dim, e.head_dim) << e.name;
    EXPECT_EQ(m.spec.resolved_rotary_dim(), e.rotary_dim) << e.name;
    EXPECT_EQ(m.spec.base, e.base) << e.name;
    EXPECT_EQ(m.spec.schedule, e.schedule) << e.name;
    EXPECT_EQ(m.spec.pairing, e.pairing) << e.name;
    EXPECT_EQ(m.num_attention_heads, e.heads) << e.name;
    EXPECT_EQ(m.num_key_value_heads, e.kv_heads) << e.name;
    EXPECT_NO_THROW(make_schedule(m.spec)) << e.name;
  }
  // Spot figures, written from the formulas.
  const Schedule l31 = make_schedule(load_preset("llama-3.1-8b").spec);
  EXPECT_EQ(l31.inv_freq[0], 1.0);
  EXPECT_NEAR(l31.inv_freq[63], std::pow(500000.0, -126.0 / 128.0) / 8.0, 1e-20);
  const Schedule oss = make_schedule(load_preset("gpt-oss-20b").spec);
  EXPECT_NEAR(oss.attention_factor, 0.1 * std::log(32.0) + 1.0, 1e-15);
  const Schedule phi = make_schedule(load_preset("phi-3-mini-128k-instruct").spec, 131072);
  EXPECT_NEAR(phi.inv_freq[47], std::pow(10000.0, -94.0 / 96.0) / 64.81001281738281, 1e-18);
  EXPECT_NEAR(phi.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-15);
  EXPECT_ROTARY_ERROR(load_preset("llama-4"), "preset 'llama-4' is unknown (known: codellama-7b");
}

// transformers computes inv_freq in float32: 1 / (base ** (arange(0, dim, 2).float() / dim)), then
// the schedule's float32 arithmetic. Ours (double) must agree within that pipeline's own error.
TEST(Presets, AgreeWithTransformersFloat32Frequencies) {
  for (const std::string& name : preset_names()) {
    const ModelRope m = load_preset(name);
    const Schedule s = make_schedule(m.spec);
    const int64_t dim = s.rotary_dim;
    const std::vector<double> ours_default = default_inv_freq(m.spec.base, dim);
    for (int64_t i = 0; i < dim / 2; ++i) {
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
      const float hf = 1.0f / std::pow(static_cast<float>(m.spec.base), exponent);
      // float32 pow of a rounded base and exponent: relative error up to ~|ln base| * 2^-24 + a few ulp
      const double tolerance = (std::fabs(std::log(m.spec.base)) + 4.0) * 0x1p-24 * hf;
      ASSERT_NEAR(ours_default[static_cast<size_t>(i)], hf, tolerance) << name << " pair " << i;
    }
  }
}

}  // namespace
}  // namespace rotary
