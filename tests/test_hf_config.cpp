// Config resolution: every transformers rule, from small JSONs written from the rules; presets
// against figures written out here from the public configs; float32 agreement with transformers'
// own formula.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <optional>
#include <thread>

#include "config/model_types.hpp"
#include "rotary/error.hpp"
#include "rotary/hf_config.hpp"
#include "rotary/schedule.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

ModelRope read(const std::string& json) { return read_hf_config(json); }

bool has_note(const ModelRope& m, const std::string& needle) {
  for (const std::string& note : m.notes) {
    if (note.find(needle) != std::string::npos) return true;
  }
  return false;
}

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

// The config classes of transformers 5.23 that default partial_rotary_factor when config.json has
// none (configuration_<dir>.py: kwargs.setdefault("partial_rotary_factor", x)); a config's own
// value wins, except Bamba's, which its config class overwrites. Found by tests/conformance.
TEST(HfConfig, PartialRotaryDefaultsOfTheConfigClasses) {
  const auto rotated = [](const std::string& type, const std::string& extra = "") {
    return read(R"({"model_type": ")" + type + R"(", "hidden_size": 2560, "num_attention_heads": 20, "head_dim": 160)" +
                extra + "}")
        .spec.resolved_rotary_dim();
  };
  for (const char* type :
       {"glm", "glm4", "glm4_moe", "glmasr_encoder", "nemotron", "persimmon", "phi", "recurrent_gemma"}) {
    EXPECT_EQ(rotated(type), 80) << type;  // 0.5
    EXPECT_EQ(rotated(type, R"(, "partial_rotary_factor": 0.25)"), 40) << type;
    EXPECT_EQ(rotated(type, R"(, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.0})"), 160)
        << type;
  }
  for (const char* type : {"stablelm", "qwen3_next"}) {
    EXPECT_EQ(rotated(type), 40) << type;  // 0.25
    EXPECT_EQ(rotated(type, R"(, "partial_rotary_factor": 0.5)"), 80) << type;
  }
  EXPECT_EQ(rotated("moonshine"), 144);  // 0.9
  // JetMoE's head is kv_channels (attribute_map head_dim, default 128); Zamba2's 2 * hidden_size / heads.
  const auto head = [](const std::string& json) { return read(json).spec.head_dim; };
  EXPECT_EQ(head(R"({"model_type": "jetmoe", "hidden_size": 2048, "num_attention_heads": 32, "kv_channels": 96})"), 96);
  EXPECT_EQ(head(R"({"model_type": "jetmoe", "hidden_size": 2048, "num_attention_heads": 32})"), 128);
  EXPECT_EQ(head(R"({"model_type": "jetmoe", "hidden_size": 2048, "num_attention_heads": 32, "head_dim": 64})"), 64);
  EXPECT_EQ(head(R"({"model_type": "zamba2", "hidden_size": 2560, "num_attention_heads": 32, "use_mem_rope": true})"),
            160);
  EXPECT_EQ(head(R"({"model_type": "zamba2", "hidden_size": 2560, "num_attention_heads": 32, "head_dim": 80,
      "use_mem_rope": true})"),
            160);  // Zamba2Config.__post_init__ overwrites it
  EXPECT_EQ(rotated("llama"), 160);      // LlamaConfig has none: the whole head
  // Bamba: 0.5 whatever the config says.
  EXPECT_EQ(rotated("bamba"), 80);
  EXPECT_EQ(rotated("bamba", R"(, "partial_rotary_factor": 1.0)"), 80);
  // GPT-NeoX-Japanese: rotary_pct, default 1.0 (GPT-NeoX: 0.25, PartialRotaryAndModelDefaults).
  EXPECT_EQ(rotated("gpt_neox_japanese"), 160);
  EXPECT_EQ(rotated("gpt_neox_japanese", R"(, "rotary_pct": 0.5)"), 80);
  // MiniMax-M2: the legacy rotary_dim key is the width (MiniMaxM2Config: rotary_dim / head_dim).
  EXPECT_EQ(rotated("minimax_m2", R"(, "rotary_dim": 64)"), 64);
  EXPECT_EQ(rotated("minimax_m2", R"(, "rotary_dim": 64, "partial_rotary_factor": 0.5)"), 80);
  EXPECT_EQ(rotated("minimax_m2"), 160);
  EXPECT_ROTARY_ERROR(read(R"({"model_type": "minimax_m2", "hidden_size": 2560, "num_attention_heads": 20,
                               "head_dim": 160, "rotary_dim": 320})"),
                      "partial_rotary_factor=2 must be in (0, 1]");
  // Qwen3.5 (text and MoE): 0.25 of head_dim 256, 32 pairs for its interleaved M-RoPE sections.
  for (const char* type : {"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}) {
    const ModelRope m = read(R"({"model_type": ")" + std::string(type) + R"(", "hidden_size": 5120,
        "num_attention_heads": 24, "head_dim": 256, "rope_parameters": {"rope_type": "default",
        "mrope_interleaved": true, "mrope_section": [11, 11, 10]}})");
    EXPECT_EQ(m.spec.resolved_rotary_dim(), 64) << type;
  }
  for (const char* type : {"glm4v_moe", "glm4v_moe_text"}) {
    const ModelRope m = read(R"({"model_type": ")" + std::string(type) + R"(", "hidden_size": 4096,
        "num_attention_heads": 32, "head_dim": 128, "rope_parameters": {"rope_type": "default",
        "mrope_section": [8, 12, 12]}})");
    EXPECT_EQ(m.spec.resolved_rotary_dim(), 64) << type;
  }
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
  EXPECT_FALSE(has_note(ds, "explicit factor"));  // 40 is the ratio of the lengths
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
  ASSERT_EQ(qwen.notes.size(), 2u);  // the factor, and the pairing assumed without a model_type
  EXPECT_TRUE(has_note(qwen, "explicit factor 4 differs"));
  // no original inside: original = max_position_embeddings
  const ModelRope plain = read(R"({"hidden_size": 64, "num_attention_heads": 1, "max_position_embeddings": 2048,
      "rope_scaling": {"type": "yarn", "factor": 8.0, "mscale": 0.707, "mscale_all_dim": 1.0}})");
  EXPECT_EQ(*plain.spec.original_max_position, 2048);
  EXPECT_NEAR(make_schedule(plain.spec).attention_factor,
              (0.1 * 0.707 * std::log(8.0) + 1) / (0.1 * std::log(8.0) + 1), 1e-15);
}

// transformers reads `rope_scaling or rope_parameters` and ignores (with a warning) rope keys its
// rope_type does not take: rotary reads the same dict and names every ignored key in a note.
TEST(HfConfig, RopeScalingOverRopeParametersAndUnreadKeysNoted) {
  const ModelRope both = read(R"({"hidden_size": 256, "num_attention_heads": 4,
      "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
      "rope_scaling": {"rope_type": "linear", "factor": 4.0}})");
  EXPECT_EQ(*both.spec.factor, 4.0);
  EXPECT_TRUE(has_note(both, "rope_scaling={\"factor\":4.0,\"rope_type\":\"linear\"} and rope_parameters="));
  EXPECT_TRUE(has_note(both, "differ: rope_scaling is read, as transformers reads it"));
  // Equal, or an empty rope_scaling: nothing to say, rope_parameters read.
  const ModelRope empty_scaling = read(R"({"hidden_size": 256, "num_attention_heads": 4,
      "rope_parameters": {"rope_type": "linear", "factor": 2.0}, "rope_scaling": {}})");
  EXPECT_EQ(*empty_scaling.spec.factor, 2.0);
  EXPECT_FALSE(has_note(empty_scaling, "differ"));
  const ModelRope misspelt = read(R"({"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 8192,
      "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096,
                          "beta_fats": 3, "mrope_section": [8, 12, 12]}})");
  EXPECT_TRUE(has_note(misspelt, "rope_parameters.beta_fats is not a key of rope_type yarn: ignored, as transformers "
                                 "ignores it"));
  EXPECT_FALSE(has_note(misspelt, "mrope_section is not a key"));  // M-RoPE's sections: read by rotary
  EXPECT_FALSE(has_note(misspelt, "original_max_position_embeddings is not a key"));
}

// JSON integers are exact: one beyond 2^53 is an integer the field's own rule judges.
TEST(HfConfig, IntegersBeyondTwoToThe53AreIntegers) {
  EXPECT_ROTARY_ERROR(read(R"({"head_dim": 9007199254740993, "hidden_size": 64, "num_attention_heads": 1})"),
                      "head_dim=9007199254740993 exceeds");
  EXPECT_ROTARY_ERROR(read(R"({"head_dim": 18446744073709551615, "hidden_size": 64, "num_attention_heads": 1})"),
                      "head_dim=18446744073709551615 must be an integer below 2^63");
  EXPECT_ROTARY_ERROR(read(R"({"head_dim": 1e300, "hidden_size": 64, "num_attention_heads": 1})"),
                      "must be an integer in [-2^63, 2^63)");
  EXPECT_ROTARY_ERROR(read(R"({"head_dim": 64.5, "hidden_size": 64, "num_attention_heads": 1})"),
                      "head_dim=64.5 must be an integer");
}

// A missing num_hidden_layers is said to be missing, not reported as num_hidden_layers=0.
TEST(HfConfig, MissingLayerCountIsNamedAsMissing) {
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 256, "num_attention_heads": 4, "layer_types": []})"),
                      "num_hidden_layers is missing and layer_types is empty: the number of layers is unknown");
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
                      "rope_scaling.factor='x' must be a number");
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 64, "num_attention_heads": 1, "rope_scaling": {"rope_type": "dynamo"}})"),
                      "rope_scaling.rope_type='dynamo' is not supported");
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 64, "num_attention_heads": 1, "rope_theta": "big"})"),
                      "rope_theta='big' must be a number");
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
      {"llama-4-scout-17b-16e", 128, 128, 500000, llama3, Pairing::interleaved, 40, 8},
      {"qwen2-vl-7b-instruct", 128, 128, 1e6, default_, Pairing::half, 28, 4},
      {"qwen2.5-vl-7b-instruct", 128, 128, 1e6, default_, Pairing::half, 28, 4},
      {"qwen3-vl-8b-instruct", 128, 128, 5e6, default_, Pairing::half, 32, 8},
      {"glm-4.1v-9b-thinking", 128, 64, 10000, default_, Pairing::interleaved, 32, 2},
      {"gemma-3-4b-it", 256, 256, 1e6, linear, Pairing::half, 8, 4},
      {"gemma-4-config-defaults", 512, 512, 1e6, proportional, Pairing::half, 8, 4},
      {"phi-4-mini-instruct", 128, 96, 10000, longrope, Pairing::half, 24, 8},
      {"command-r-v01", 128, 128, 8e6, default_, Pairing::interleaved, 64, 64},
      {"glm-4-9b-chat-hf", 128, 64, 10000, default_, Pairing::interleaved, 32, 2},
      {"qwen3-8b", 128, 128, 1e6, default_, Pairing::half, 32, 8},
      {"kimi-k2-instruct", 64, 64, 50000, yarn, Pairing::interleaved, 64, 64},
      {"mistral-small-3.1-24b-instruct-2503", 128, 128, 1e9, default_, Pairing::half, 32, 8},
      {"llama-3.3-70b-instruct", 128, 128, 500000, llama3, Pairing::half, 64, 8},
      {"qwen2.5-72b-instruct", 128, 128, 1e6, default_, Pairing::half, 64, 8},
      {"mistral-nemo-instruct-2407", 128, 128, 1e6, default_, Pairing::half, 32, 8},
      {"gemma-2-9b", 256, 256, 10000, default_, Pairing::half, 16, 8},
      {"stablelm-2-1_6b", 64, 16, 10000, default_, Pairing::half, 32, 32},
  };
  EXPECT_GE(std::size(expected), 30u);
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
  for (const std::string& name : preset_names()) {  // each cites where its values come from
    EXPECT_NE(preset_text(name).find("\"source\": \""), std::string::npos) << name;
    for (const std::string& type : layer_types(preset_config(name))) {
      EXPECT_NO_THROW(make_schedule(load_preset(name, {.layer_type = type}).spec)) << name << " " << type;
    }
  }
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

// ---- nothing a user sends crashes rotary ----

// The message of the rotary::Error that reading `config` throws.
std::string message_of(const std::string& config) {
  try {
    read_hf_config(config);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

std::string nested_lists(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }
std::string nested_objects(size_t depth) {
  std::string text;
  for (size_t i = 0; i < depth; ++i) text += R"({"a": )";
  return text + "1" + std::string(depth, '}');
}

const std::string kHead = R"({"hidden_size": 16, "num_attention_heads": 1, "max_position_embeddings": 4096, )";

// 100k brackets where the old reader copied (text_config, full_attention) or dumped (rope_scaling,
// rope_theta) the value recursively and overflowed the stack.
TEST(HfConfig, DeepNestingIsAClearErrorInEveryPlace) {
  const std::string deep_lists = nested_lists(100000);
  const std::string deep_objects = nested_objects(100000);
  const std::string configs[] = {
      kHead + R"("rope_scaling": )" + deep_lists + "}",
      kHead + R"("rope_theta": )" + deep_lists + "}",
      R"({"num_attention_heads": 1, "text_config": )" + deep_objects + "}",
      kHead + R"("rope_parameters": {"sliding_attention": {}, "full_attention": )" + deep_objects + "}}",
  };
  for (const std::string& config : configs) {
    const std::string m = message_of(config);
    EXPECT_NE(m.find("config nests arrays/objects deeper than 64 levels"), std::string::npos) << m;
    EXPECT_LT(m.size(), 400u);
  }
  // Real nesting (4 levels) is far from the limit; 63 levels still parse, and the value is named.
  EXPECT_ROTARY_ERROR(read(kHead + R"("rope_theta": )" + nested_lists(62) + "}"),
                      "rope_theta=a list of 1 item must be a number");
}

TEST(HfConfig, MessagesEchoAtMostAnExcerptOfAValue) {
  const std::string huge(1 << 20, 'a');
  std::string m = message_of(kHead + R"("rope_scaling": {"rope_type": ")" + huge + R"("}})");
  EXPECT_NE(m.find("rope_scaling.rope_type='" + std::string(100, 'a') + "... (1048576 bytes)' is not supported"),
            std::string::npos) << m.substr(0, 400);
  EXPECT_LT(m.size(), 400u);

  // 2M-item lists: their length is named, never their items.
  std::string ones = "[1";
  for (int i = 1; i < 2000000; ++i) ones += ",1";
  m = message_of(kHead + R"("rope_scaling": {"rope_type": "longrope", "short_factor": )" + ones + "]" +
                 R"(, "long_factor": )" + ones + "]}}");
  EXPECT_NE(m.find("short_factor has 2000000 values but rotary_dim/2=8"), std::string::npos) << m.substr(0, 400);
  EXPECT_LT(m.size(), 400u);
  m = message_of(kHead + R"("rope_scaling": {"rope_type": )" + ones + "]}}");
  EXPECT_NE(m.find("rope_scaling.rope_type=a list of 2000000 items must be a string"), std::string::npos)
      << m.substr(0, 400);
  EXPECT_LT(m.size(), 400u);
  m = message_of(kHead + R"("rope_scaling": {"rope_type": "longrope", "short_factor": )" + ones + R"(, ")" +
                 huge + R"("]}})");
  EXPECT_NE(m.find("rope_scaling.short_factor[2000000]='" + std::string(100, 'a') + "... (1048576 bytes)' must be a number"),
            std::string::npos) << m.substr(0, 400);
  EXPECT_LT(m.size(), 400u);

  // NUL and control bytes are shown escaped; the message is neither cut nor split.
  m = message_of(kHead + R"("rope_scaling": {"rope_type": "mr\u0000o\npe"}})");
  EXPECT_NE(m.find(R"(rope_type='mr\x00o\x0ape' is not supported)"), std::string::npos) << m;

  // Notes excerpt too.
  const ModelRope unknown = read(kHead + R"("model_type": ")" + huge + "\"}");
  ASSERT_EQ(unknown.notes.size(), 1u);
  EXPECT_NE(unknown.notes[0].find("... (1048576 bytes)' is not in rotary's table"), std::string::npos);
  EXPECT_LT(unknown.notes[0].size(), 400u);

  // Paths, keys and preset names are a user's values as well.
  try {
    read_hf_config_file("/nonexistent/" + std::string(5000, 'd') + "/config.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("... (5025 bytes)' cannot be read"), std::string::npos) << e.what();
    EXPECT_LT(std::string(e.what()).size(), 400u);
  }
  m = message_of(kHead + R"("rope_parameters": {")" + huge + R"(": 3, "sliding_attention": {}}})");
  EXPECT_NE(m.find("rope_parameters." + std::string(100, 'a') + "... (1048576 bytes)=3 must be an object"),
            std::string::npos) << m.substr(0, 400);
  EXPECT_LT(m.size(), 400u);
  EXPECT_ROTARY_ERROR(load_preset(huge), "preset '" + std::string(100, 'a') + "... (1048576 bytes)' is unknown");
}

// A temporary directory for file tests, removed at the end.
struct TempDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("rotary_hf_config_" + std::to_string(::getpid()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST(HfConfig, FilesAreReadWithASizeCap) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_ROTARY_ERROR(read_hf_config_file("/dev/zero"),
                      "config '/dev/zero' is larger than 16777216 bytes (16 MiB), the most rotary reads");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));

  const TempDir dir;
  EXPECT_ROTARY_ERROR(read_hf_config_file(dir.path.string()), "is a directory");
  // Regular files: refused above the cap before reading (sparse, nothing written); read at the cap.
  const auto big = dir.path / "big.json";
  std::ofstream(big).put(' ');
  std::filesystem::resize_file(big, max_config_bytes + 1);
  EXPECT_ROTARY_ERROR(read_hf_config_file(big.string()), "is larger than 16777216 bytes (16 MiB)");
  std::filesystem::resize_file(big, max_config_bytes);
  EXPECT_ROTARY_ERROR(read_hf_config_file(big.string()), "big.json': config is not valid JSON");

  // A FIFO: no size to check first, read like /dev/zero.
  const auto fifo = dir.path / "config.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] { std::ofstream(fifo) << R"({"hidden_size": 64, "num_attention_heads": 2})"; });
  std::optional<ModelRope> m;
  try {
    m = read_hf_config_file(fifo.string());
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
    std::ifstream unblock_writer(fifo);
  }
  writer.join();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->spec.head_dim, 32);
}

// ---- pairing per model type ----

std::string config_of_type(std::string_view type, const std::string& extra = "") {
  return std::string(R"({"model_type": ")") + std::string(type) +
         R"(", "hidden_size": 1024, "num_attention_heads": 8, "qk_rope_head_dim": 64)" + extra + "}";
}

TEST(HfConfig, EveryModelTypeResolvesAsItsModelingCode) {
  for (const detail::ModelTypeRope& e : detail::model_type_table()) {
    const std::string type(e.model_type);
    const std::string key(e.rope_switch_key);
    const std::string on = key.empty() ? "" : ", \"" + key + "\": " + std::string(e.rope_switch_value);
    const std::string wrapper = R"({"model_type": ")" + type + R"(", "text_config": )";
    if (e.multimodal_positions) {
      const std::string missing = "model_type '" + type + "' rotates several position streams per token "
                                  "(multimodal RoPE), but the config has no mrope_section";
      EXPECT_ROTARY_ERROR(read(config_of_type(type, on)), missing);
      EXPECT_ROTARY_ERROR(read(wrapper + config_of_type("unknown_text", on) + "}"), missing);
      // head_dim 128 (hidden_size 1024 / 8 heads), all rotated (Qwen3.5 and GLM-4.5V default to
      // part of it): 64 pairs.
      const bool alternating = e.stream_layout == StreamLayout::alternating_sections;  // [h, w, t], h == w
      const std::vector<int64_t> sections = alternating ? std::vector<int64_t>{22, 22, 20} : std::vector<int64_t>{24, 20, 20};
      const ModelRope m = read(config_of_type(
          type, on + (alternating ? R"(, "partial_rotary_factor": 1.0, "rope_scaling": {"mrope_section": [22, 22, 20]})"
                                  : R"(, "partial_rotary_factor": 1.0, "rope_scaling": {"mrope_section": [24, 20, 20]})")));
      EXPECT_EQ(m.spec.stream_layout, e.stream_layout) << type;
      EXPECT_EQ(m.spec.sections, sections) << type;
      EXPECT_EQ(m.spec.pairing, e.pairing) << type;
      continue;
    }
    if (!key.empty()) {  // RoPE switched off: no rotation to resolve
      EXPECT_ROTARY_ERROR(read(config_of_type(type, ", \"" + key + "\": \"off\"")),
                          key + "='off': model_type '" + type + "' applies RoPE only with " + key + "=");
    }
    // The whole head (moonshine's default 0.9 of 128 would be odd); defaults: PartialRotaryDefaults...
    const ModelRope m = read(config_of_type(type, on + R"(, "partial_rotary_factor": 1.0)"));
    EXPECT_FALSE(has_note(m, "assumed pairing")) << type;
    EXPECT_EQ(read(wrapper + config_of_type("unknown_text", on) + "}").spec.pairing, m.spec.pairing) << type;
    const bool formula_applies = e.pairing_flag.empty() || e.pairing_flag_default;
    EXPECT_EQ(m.rotates_backward, formula_applies && detail::rotates_backward(e.formula)) << type;
    // A partial rotary factor matches only code that rotates part of the head.
    // Zamba2's attention reads two concatenated streams: head_dim = 2 * hidden_size / heads.
    const int64_t head_dim = e.rotary_dim_key == "qk_rope_head_dim" ? 64 : type == "zamba2" ? 256 : 128;
    EXPECT_EQ(m.spec.head_dim, head_dim) << type;
    const std::string half_rotated = config_of_type(type, on + R"(, "partial_rotary_factor": 0.5)");
    if (e.rotary_dim_key == "rotary_dim") {
      EXPECT_EQ(read(config_of_type(type, on + R"(, "rotary_dim": 32)")).spec.resolved_rotary_dim(), 32) << type;
      EXPECT_ROTARY_ERROR(read(config_of_type(type, on + R"(, "rotary_dim": 33)")), "rotary_dim=33 must be even and > 0");
    } else if (e.partial_rotary) {
      const ModelRope partial = read(half_rotated);
      EXPECT_EQ(partial.spec.resolved_rotary_dim(), head_dim / 2) << type;
      EXPECT_EQ(partial.spec.head_dim, head_dim) << type;
      EXPECT_EQ(partial.spec.rotary_offset, e.trailing_rotary ? head_dim / 2 : 0) << type;  // nope-first
      EXPECT_EQ(has_note(partial, "rotates the last"), e.trailing_rotary) << type;
    } else {
      EXPECT_ROTARY_ERROR(read(half_rotated), "' rotates the whole head: its attention code has no partial rotation");
    }
    if (e.pairing_flag.empty()) {
      EXPECT_EQ(m.spec.pairing, e.pairing) << type;
      continue;
    }
    const std::string flag = on + ", \"" + std::string(e.pairing_flag) + "\": ";
    EXPECT_EQ(m.spec.pairing, e.pairing_flag_default ? Pairing::interleaved : Pairing::half) << type;
    EXPECT_EQ(read(config_of_type(type, flag + "true")).spec.pairing, Pairing::interleaved) << type;
    EXPECT_EQ(read(config_of_type(type, flag + "false")).spec.pairing, Pairing::half) << type;
    EXPECT_FALSE(read(config_of_type(type, flag + "false")).rotates_backward) << type;
    EXPECT_ROTARY_ERROR(read(config_of_type(type, flag + "1")), std::string(e.pairing_flag) + "=1 must be true or false");
  }
}

// The examples behind the table's special cases, by name (the loop above covers every entry).
TEST(HfConfig, ModelTypeSpecialCasesByExample) {
  EXPECT_ROTARY_ERROR(read(config_of_type("falcon", R"(, "alibi": true)")),
                      "alibi=true: model_type 'falcon' applies RoPE only with alibi=false");
  EXPECT_ROTARY_ERROR(read(config_of_type("esm")),
                      "position_embedding_type='absolute' (the default): model_type 'esm' applies RoPE only with "
                      "position_embedding_type=\"rotary\"");
  const ModelRope nanochat = read(config_of_type("nanochat"));
  EXPECT_TRUE(nanochat.rotates_backward);
  EXPECT_TRUE(has_note(nanochat, "model_type 'nanochat' turns each pair by -angle: apply with Direction::inverse"));
  EXPECT_TRUE(has_note(read(config_of_type("deepseek_v3")), "writes each rotated pair (x[2i], x[2i+1]) to channels"));
  EXPECT_ROTARY_ERROR(read(R"({"model_type": "deepseek_v3", "hidden_size": 1024, "num_attention_heads": 8})"),
                      "qk_rope_head_dim is missing (model_type deepseek_v3)");
  EXPECT_ROTARY_ERROR(read(config_of_type("llama", R"(, "partial_rotary_factor": 0.5)")),
                      "rotary_dim=64 (partial_rotary_factor 0.5) is less than head_dim=128, but model_type 'llama' "
                      "rotates the whole head");
}

TEST(HfConfig, UnknownModelTypeAssumesHalfWithANote) {
  const ModelRope unknown = read(config_of_type("frobnicator"));
  EXPECT_EQ(unknown.spec.pairing, Pairing::half);
  ASSERT_EQ(unknown.notes.size(), 1u);
  EXPECT_EQ(unknown.notes[0], "model_type 'frobnicator' is not in rotary's table: assumed pairing half "
                              "(rotate_half, the most common in transformers); check the model's attention code");
  const ModelRope untyped = read(R"({"hidden_size": 64, "num_attention_heads": 1})");
  ASSERT_EQ(untyped.notes.size(), 1u);
  EXPECT_EQ(untyped.notes[0].rfind("config has no model_type: assumed pairing half", 0), 0u);
  EXPECT_FALSE(has_note(read(config_of_type("llama")), "assumed"));
}

// ---- multimodal RoPE: mrope_section, mrope_interleaved, rope_3d (formerly refused by name) ----

TEST(HfConfig, MropeSectionsResolveAsEachModelsCode) {
  const std::string head = R"({"model_type": "frobnicator", "hidden_size": 128, "num_attention_heads": 1, )";
  // Qwen2-VL (v4 config): legacy type "mrope" is default; contiguous sections t, h, w.
  const ModelRope qwen2 = read(head + R"("rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}})");
  EXPECT_EQ(qwen2.spec.schedule, ScheduleType::default_);
  EXPECT_EQ(qwen2.spec.stream_layout, StreamLayout::sections);
  EXPECT_EQ(qwen2.spec.sections, std::vector<int64_t>({16, 24, 24}));
  // mrope_interleaved on a type whose code reads it: interleaved (Qwen3-VL's apply_interleaved_mrope).
  const ModelRope flag = read(head + R"("rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20],
                                        "mrope_interleaved": true}})");
  EXPECT_EQ(flag.spec.stream_layout, StreamLayout::interleaved_sections);
  // Qwen3-VL's code interleaves whatever the flag says.
  const std::string qwen3 = R"({"model_type": "qwen3_vl", "text_config": {"model_type": "qwen3_vl_text",
      "hidden_size": 4096, "num_attention_heads": 32, "head_dim": 128, "rope_theta": 5000000,
      "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20])";
  EXPECT_EQ(read(qwen3 + "}}}").spec.stream_layout, StreamLayout::interleaved_sections);
  EXPECT_EQ(read(qwen3 + R"(, "mrope_interleaved": false}}})").spec.stream_layout, StreamLayout::interleaved_sections);
  // GLM-4.1V (v5 config): partial 0.5, GLM's even/odd pairs, contiguous sections over the 32 rotated pairs.
  const ModelRope glm = read(R"({"model_type": "glm4v_text", "hidden_size": 4096, "num_attention_heads": 32,
      "partial_rotary_factor": 0.5, "rope_parameters": {"rope_type": "default", "mrope_section": [8, 12, 12]}})");
  EXPECT_EQ(glm.spec.resolved_rotary_dim(), 64);
  EXPECT_EQ(glm.spec.pairing, Pairing::interleaved);
  EXPECT_EQ(glm.spec.stream_layout, StreamLayout::sections);
  // ERNIE-4.5-VL: transformers' mrope_section [h, w, t], or its own rope_3d + freq_allocation t.
  const std::string ernie = R"({"model_type": "ernie4_5_vl_moe_text", "hidden_size": 2560, "num_attention_heads": 20,
      "rope_theta": 500000, )";
  const ModelRope hf = read(ernie + R"("rope_parameters": {"rope_type": "default", "mrope_section": [22, 22, 20]}})");
  const ModelRope own = read(
      R"({"model_type": "frobnicator", "hidden_size": 2560, "num_attention_heads": 20, "rope_3d": true, "freq_allocation": 20})");
  EXPECT_EQ(hf.spec.stream_layout, StreamLayout::alternating_sections);
  EXPECT_EQ(hf.spec.pairing, Pairing::interleaved);
  EXPECT_EQ(own.spec.stream_layout, StreamLayout::alternating_sections);
  EXPECT_EQ(own.spec.sections, hf.spec.sections);
  EXPECT_EQ(read(R"({"hidden_size": 2560, "num_attention_heads": 20, "rope_3d": true})").spec.sections,
            std::vector<int64_t>({22, 22, 20}));  // freq_allocation default 20
  // Switched off, they are nothing.
  EXPECT_EQ(read(head + R"("rope_3d": false, "rope_scaling": {"mrope_interleaved": false}})").spec.stream_layout,
            StreamLayout::single);
}

// The descriptor's stream of each pair, from transformers' code written out here.
TEST(HfConfig, MropeSchedulesFollowTheModelFormulas) {
  const Schedule qwen2 = make_schedule(load_preset("qwen2-vl-7b-instruct").spec);
  ASSERT_EQ(qwen2.pair_stream.size(), 64u);
  for (int j = 0; j < 64; ++j) {
    // apply_multimodal_rotary_pos_emb: cos split by mrope_section * 2, chunk i takes stream i % 3
    EXPECT_EQ(qwen2.pair_stream[static_cast<size_t>(j)], j < 16 ? 0 : j < 40 ? 1 : 2) << j;
  }
  const Schedule qwen3 = make_schedule(load_preset("qwen3-vl-8b-instruct").spec);
  for (int j = 0; j < 64; ++j) {
    // apply_interleaved_mrope: freqs_t[..., offset:3*s:3] = freqs[dim] for (dim, offset) in (1, 1), (2, 2)
    const int expected = (j % 3 == 1 && j < 3 * 20) ? 1 : (j % 3 == 2 && j < 3 * 20) ? 2 : 0;
    EXPECT_EQ(qwen3.pair_stream[static_cast<size_t>(j)], expected) << j;
  }
  const Schedule glm = make_schedule(load_preset("glm-4.1v-9b-thinking").spec);
  ASSERT_EQ(glm.pairs(), 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(glm.pair_stream[static_cast<size_t>(j)], j < 8 ? 0 : j < 20 ? 1 : 2) << j;
  EXPECT_EQ(glm.channels(5), std::make_pair(int64_t{10}, int64_t{11}));  // GLM: (2j, 2j + 1)
}

TEST(HfConfig, MropeValidationNamesTheField) {
  const std::string head = R"({"hidden_size": 128, "num_attention_heads": 1, )";
  const std::pair<std::string, std::string> cases[] = {
      {R"("rope_scaling": {"mrope_section": [16, -1, 49]}})",
       "rope_scaling.mrope_section=a list of 3 items must be a list of 1 to 8 positive integers"},
      {R"("rope_scaling": {"mrope_section": [16, 24.5, 24]}})", "must be a list of 1 to 8 positive integers"},
      {R"("rope_scaling": {"mrope_section": "16,24,24"}})", "rope_scaling.mrope_section='16,24,24' must be a list"},
      {R"("rope_scaling": {"mrope_section": []}})", "must be a list of 1 to 8 positive integers"},
      {R"("rope_scaling": {"mrope_section": [1, 1, 1, 1, 1, 1, 1, 1, 56]}})", "must be a list of 1 to 8"},
      {R"("rope_scaling": {"mrope_section": [16, 24, 20]}})",
       "rope_scaling.mrope_section=a list of 3 items sums to 60 pairs, but rotary_dim=128 has 64"},
      {R"("mrope_section": [2, 3, 3]})", "mrope_section=a list of 3 items sums to 8 pairs, but rotary_dim=128 has 64"},
      {R"("rope_scaling": {"mrope_section": [32, 32], "mrope_interleaved": true}})",
       "must have 3 entries for interleaved_sections"},
      {R"("rope_scaling": {"mrope_interleaved": true}})", "rope_scaling.mrope_interleaved=true without mrope_section"},
      {R"("rope_scaling": {"mrope_interleaved": 1}})", "rope_scaling.mrope_interleaved=1 must be true or false"},
      {R"("rope_3d": true, "freq_allocation": 21})", "freq_allocation=21 must be in [1, 64) with rotary_dim/2"},
      {R"("rope_3d": "yes"})", "rope_3d='yes' must be true or false"},
      {R"("rope_interleave": true})", "rope_interleave=true on a model type rotary does not know"},
      {R"("rope_parameters": {"rope_type": "xdrope"}})", "rope_parameters.rope_type='xdrope' is not supported"},
      {R"("rope_parameters": {"full_attention": {"rope_type": "default"}, "rope_theta": 1000000.0}})",
       "rope_parameters.rope_theta=1000000.0 must be an object"},
  };
  for (const auto& [fields, needle] : cases) {
    const std::string m = message_of(head + fields);
    EXPECT_NE(m.find(needle), std::string::npos) << "'" << m << "' lacks '" << needle << "'";
    EXPECT_LT(m.size(), 400u);
  }
}

// ---- proportional, global_head_dim, per-layer-type RoPE in both config forms ----

TEST(HfConfig, Gemma4ProportionalOnGlobalHeadDim) {
  const ModelRope full = load_preset("gemma-4-config-defaults");
  EXPECT_EQ(full.layer_type, "full_attention");
  EXPECT_EQ(full.layer_types, std::vector<std::string>({"sliding_attention", "full_attention"}));
  EXPECT_EQ(full.spec.schedule, ScheduleType::proportional);
  EXPECT_EQ(full.spec.head_dim, 512);  // global_head_dim
  EXPECT_EQ(full.spec.resolved_rotary_dim(), 512);  // the whole head; the tail frequencies are 0
  EXPECT_EQ(*full.spec.partial_rotary_factor, 0.25);
  EXPECT_EQ(full.spec.base, 1e6);
  const ModelRope sliding = load_preset("gemma-4-config-defaults", {.layer_type = "sliding_attention"});
  EXPECT_EQ(sliding.spec.schedule, ScheduleType::default_);
  EXPECT_EQ(sliding.spec.head_dim, 256);
  EXPECT_EQ(sliding.spec.base, 1e4);
  ASSERT_EQ(full.rope_layers.size(), 30u);
  for (size_t i = 0; i < 30; ++i) {
    EXPECT_EQ(full.rope_layers[i], (i + 1) % 6 == 0) << i;
    EXPECT_EQ(sliding.rope_layers[i], (i + 1) % 6 != 0) << i;
  }
  // _compute_proportional_rope_parameters: inv_freq[j] = base^(-2j/head_dim) for j < int(0.25 * 512 // 2), then 0.
  const Schedule s = make_schedule(full.spec);
  for (size_t j = 0; j < 256; ++j) {
    const double expected = j < 64 ? std::pow(1e6, -2.0 * static_cast<double>(j) / 512.0) : 0.0;
    EXPECT_NEAR(s.inv_freq[j], expected, 1e-15 * expected) << j;
  }
  // global_head_dim on any model type that carries it; kv heads of the global layers when keys are values.
  const ModelRope other = read(R"({"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
      "head_dim": 16, "global_head_dim": 32, "attention_k_eq_v": true, "num_global_key_value_heads": 1,
      "rope_parameters": {"full_attention": {"rope_theta": 10000}, "sliding_attention": {"rope_theta": 10}}})");
  EXPECT_EQ(other.spec.head_dim, 32);
  EXPECT_EQ(other.num_key_value_heads, 1);
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 64, "num_attention_heads": 4, "global_head_dim": -2,
      "rope_parameters": {"full_attention": {}, "sliding_attention": {}}})"),
                      "global_head_dim=-2 must be > 0");
}

// Gemma 3 in transformers v4 (rope_local_base_freq) and v5 (rope_parameters per layer type): the same
// Spec, and Schedule, for each layer type.
TEST(HfConfig, PerLayerTypeConfigsInBothFormsAgree) {
  const std::string head = R"({"model_type": "gemma3_text", "hidden_size": 2560, "head_dim": 256,
      "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 12, "max_position_embeddings": 131072,
      "sliding_window_pattern": 6, )";
  const std::string v4 = head + R"("rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
      "rope_scaling": {"factor": 8.0, "rope_type": "linear"}})";
  const std::string v5 = head + R"("rope_parameters": {
      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}})";
  EXPECT_EQ(layer_types(v4), std::vector<std::string>({"sliding_attention", "full_attention"}));
  EXPECT_EQ(layer_types(v4), layer_types(v5));
  for (const std::string type : {"full_attention", "sliding_attention"}) {
    const ModelRope a = read_hf_config(v4, {.layer_type = type});
    const ModelRope b = read_hf_config(v5, {.layer_type = type});
    EXPECT_EQ(a.layer_type, type);
    EXPECT_EQ(a.spec.base, b.spec.base) << type;
    EXPECT_EQ(a.spec.schedule, b.spec.schedule) << type;
    EXPECT_EQ(a.spec.factor, b.spec.factor) << type;
    EXPECT_EQ(a.rope_layers, b.rope_layers) << type;
    EXPECT_EQ(make_schedule(a.spec), make_schedule(b.spec)) << type;
  }
  EXPECT_EQ(read_hf_config(v4, {.layer_type = "sliding_attention"}).spec.schedule, ScheduleType::default_);
  EXPECT_EQ(read_hf_config(v4, {.layer_type = "sliding_attention"}).rope_layers,
            std::vector<bool>({true, true, true, true, true, false, true, true, true, true, true, false}));
  EXPECT_ROTARY_ERROR(read_hf_config(v5, {.layer_type = "chunked_attention"}),
                      "layer_type 'chunked_attention' is not a RoPE layer type of this config (known: "
                      "sliding_attention, full_attention)");
  EXPECT_ROTARY_ERROR(read_hf_config(R"({"hidden_size": 64, "num_attention_heads": 1})", {.layer_type = "sliding"}),
                      "(known: full_attention)");
  // Several types without full_attention: the first is the default, the others by name.
  const std::string two = R"({"hidden_size": 128, "num_attention_heads": 1, "rope_parameters": {
      "sliding_attention": {"rope_theta": 10000}, "chunked_attention": {"rope_theta": 500000}}})";
  EXPECT_EQ(read(two).layer_type, "chunked_attention");  // the dict's order when layer_types does not say
  EXPECT_EQ(read_hf_config(two, {.layer_type = "sliding_attention"}).spec.base, 10000.0);
}

TEST(HfConfig, LayerTypesOfEveryForm) {
  const std::vector<std::string> one = {"full_attention"};
  EXPECT_EQ(layer_types(R"({"hidden_size": 64, "num_attention_heads": 1})"), one);
  // GPT-OSS lists sliding and full layers that rotate alike: one RoPE layer type.
  EXPECT_EQ(layer_types(R"({"hidden_size": 64, "num_attention_heads": 1, "num_hidden_layers": 2,
                            "layer_types": ["sliding_attention", "full_attention"], "rope_theta": 150000})"),
            one);
  EXPECT_EQ(layer_types(preset_config("gemma-3-4b-it")),
            std::vector<std::string>({"sliding_attention", "full_attention"}));
  EXPECT_EQ(load_preset("gemma-3-4b-it").layer_types, layer_types(preset_config("gemma-3-4b-it")));
  EXPECT_EQ(load_preset("llama-3.1-8b").layer_types, one);
  EXPECT_ROTARY_ERROR(layer_types("[1]"), "config must be a JSON object");
}

// DeepSeek-V4: main / compress, nope-first; v4 keys (compress_rope_theta + rope_scaling) and the v5 dict agree.
TEST(HfConfig, DeepseekV4MainAndCompressNopeFirst) {
  const std::string head = R"({"model_type": "deepseek_v4", "hidden_size": 4096, "num_attention_heads": 64,
      "num_key_value_heads": 1, "head_dim": 512, "num_hidden_layers": 4, "max_position_embeddings": 1048576,
      "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                      "sliding_attention"], )";
  const std::string v4 = head + R"("qk_rope_head_dim": 64, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
      "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536}})";
  const std::string v5 = head + R"("rope_parameters": {
      "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.125},
      "compress": {"rope_type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                   "rope_theta": 160000.0, "partial_rotary_factor": 0.125, "attention_factor": 1.0}}})";
  EXPECT_EQ(layer_types(v4), std::vector<std::string>({"main", "compress"}));
  EXPECT_EQ(layer_types(v5), layer_types(v4));
  for (const std::string type : {"main", "compress"}) {
    const ModelRope a = read_hf_config(v4, {.layer_type = type});
    const ModelRope b = read_hf_config(v5, {.layer_type = type});
    EXPECT_EQ(a.spec.head_dim, 512);
    EXPECT_EQ(a.spec.resolved_rotary_dim(), 64);
    EXPECT_EQ(a.spec.rotary_offset, 448);  // [nope | rope]
    EXPECT_EQ(a.spec.pairing, Pairing::interleaved);
    EXPECT_EQ(a.spec.base, b.spec.base) << type;
    EXPECT_EQ(a.spec.schedule, b.spec.schedule) << type;
    EXPECT_EQ(a.spec.attention_factor, b.spec.attention_factor) << type;
    EXPECT_EQ(a.rope_layers, b.rope_layers) << type;
    EXPECT_EQ(make_schedule(a.spec), make_schedule(b.spec)) << type;
  }
  const ModelRope main = read(v4);  // no full_attention: the first, main
  EXPECT_EQ(main.layer_type, "main");
  EXPECT_EQ(main.spec.schedule, ScheduleType::default_);
  EXPECT_EQ(main.rope_layers, std::vector<bool>({true, false, false, true}));
  const ModelRope compress = read_hf_config(v4, {.layer_type = "compress"});
  EXPECT_EQ(compress.spec.schedule, ScheduleType::yarn);
  EXPECT_EQ(compress.spec.base, 160000.0);
  EXPECT_EQ(*compress.spec.attention_factor, 1.0);  // DeepseekV4Config sets it for yarn
  EXPECT_EQ(compress.rope_layers, std::vector<bool>({false, true, true, false}));
  const Schedule s = make_schedule(main.spec);
  EXPECT_EQ(s.channels(0), std::make_pair(int64_t{448}, int64_t{449}));
  EXPECT_EQ(s.channels(31), std::make_pair(int64_t{510}, int64_t{511}));
}

// ---- vision towers ----

TEST(HfConfig, VisionTowersFromTheirModelingCode) {
  struct Case {
    const char* preset;
    int64_t head_dim, rotary_dim;
    double base;
    Pairing pairing;
    StreamLayout layout;
    int64_t blocks;
  };
  const Case cases[] = {
      {"qwen2-vl-7b-instruct", 80, 80, 10000, Pairing::half, StreamLayout::axial, 1},  // embed_dim 1280 / 16
      {"qwen2.5-vl-7b-instruct", 80, 80, 10000, Pairing::half, StreamLayout::axial, 1},
      {"qwen3-vl-8b-instruct", 72, 72, 10000, Pairing::half, StreamLayout::axial, 1},
      {"glm-4.1v-9b-thinking", 128, 128, 10000, Pairing::half, StreamLayout::axial, 1},
      {"mistral-small-3.1-24b-instruct-2503", 64, 64, 10000, Pairing::half, StreamLayout::axial_even_odd, 1},
      {"llama-4-scout-17b-16e", 88, 88, 10000, Pairing::interleaved, StreamLayout::axial, 1},
      {"gemma-4-config-defaults", 64, 64, 100, Pairing::half, StreamLayout::axial, 2},
  };
  for (const Case& c : cases) {
    const ModelRope m = load_preset(c.preset, {.vision = true});
    EXPECT_TRUE(m.vision) << c.preset;
    EXPECT_EQ(m.spec.head_dim, c.head_dim) << c.preset;
    EXPECT_EQ(m.spec.resolved_rotary_dim(), c.rotary_dim) << c.preset;
    EXPECT_EQ(m.spec.base, c.base) << c.preset;
    EXPECT_EQ(m.spec.pairing, c.pairing) << c.preset;
    EXPECT_EQ(m.spec.stream_layout, c.layout) << c.preset;
    EXPECT_EQ(m.spec.blocks, c.blocks) << c.preset;
    EXPECT_EQ(m.spec.sections, std::vector<int64_t>({c.head_dim / 4, c.head_dim / 4})) << c.preset;
    EXPECT_EQ(m.layer_types, std::vector<std::string>({"full_attention"})) << c.preset;
    EXPECT_NO_THROW(make_schedule(m.spec)) << c.preset;
  }
  EXPECT_TRUE(has_note(load_preset("llama-4-scout-17b-16e", {.vision = true}),
                       "positions are 1-based, and the CLS token (last) takes position 0 in both"));
  // Qwen ViT: k < D/4 -> h with base^(-2k/(D/2)), the next D/4 pairs -> w, the index restarting.
  const Schedule qwen = make_schedule(load_preset("qwen2-vl-7b-instruct", {.vision = true}).spec);
  for (size_t j = 0; j < 40; ++j) {
    const double k = static_cast<double>(j % 20);
    EXPECT_EQ(qwen.pair_stream[j], j < 20 ? 0 : 1) << j;
    EXPECT_NEAR(qwen.inv_freq[j], std::pow(10000.0, -2.0 * k / 40.0), 1e-15) << j;
  }
  // Pixtral: f_i = base^(-2i/D); h takes f_0, f_2, ..., w takes f_1, f_3, ...
  const Schedule pixtral = make_schedule(load_preset("mistral-small-3.1-24b-instruct-2503", {.vision = true}).spec);
  for (size_t j = 0; j < 32; ++j) {
    const double i = j < 16 ? 2.0 * static_cast<double>(j) : 2.0 * static_cast<double>(j - 16) + 1;
    EXPECT_NEAR(pixtral.inv_freq[j], std::pow(10000.0, -2.0 * i / 64.0), 1e-15) << j;
  }
  // Gemma 4: two blocks of 32 channels, each half-paired inside: pair 16 is (32, 48).
  const Schedule gemma = make_schedule(load_preset("gemma-4-config-defaults", {.vision = true}).spec);
  EXPECT_EQ(gemma.channels(16), std::make_pair(int64_t{32}, int64_t{48}));
  EXPECT_ROTARY_ERROR(load_preset("gemma-3-4b-it", {.vision = true}),
                      "vision_config of model_type 'gemma3' (vision model_type 'siglip_vision_model'): rotary does "
                      "not know this vision tower's RoPE");
  EXPECT_ROTARY_ERROR(load_preset("llama-3.1-8b", {.vision = true}),
                      "config (model_type 'llama') has no vision_config: no vision tower to resolve");
  EXPECT_ROTARY_ERROR(load_preset("qwen2-vl-7b-instruct", {.layer_type = "sliding_attention", .vision = true}),
                      "layer_type 'sliding_attention' is not a RoPE layer type of the vision tower (known: "
                      "full_attention)");
  EXPECT_ROTARY_ERROR(read_hf_config(R"({"model_type": "qwen2_vl", "vision_config": {"num_heads": 16}})",
                                     {.vision = true}),
                      "vision_config.embed_dim is missing");
  EXPECT_ROTARY_ERROR(read_hf_config(R"({"model_type": "qwen2_vl", "vision_config": {"num_heads": 3, "embed_dim": 30}})",
                                     {.vision = true}),
                      "vision head_dim=10 must be a multiple of 4");
}

// Qwen3.5 (dense and MoE) carry Qwen3-VL's vision tower; Qwen/Qwen3.5-27B's vision_config names the
// wrapper's type, transformers' own save the *_vision one. Found by tests/conformance.
TEST(HfConfig, Qwen35VisionTowerIsQwenViT) {
  const std::string sizes = R"("hidden_size": 1152, "num_heads": 16, "depth": 27, "patch_size": 16)";
  const ModelRope vl = load_preset("qwen3-vl-8b-instruct", {.vision = true});
  for (const char* types : {R"("qwen3_5", "vision_config": {"model_type": "qwen3_5", )",
                            R"("qwen3_5", "vision_config": {"model_type": "qwen3_5_vision", )",
                            R"("qwen3_5_moe", "vision_config": {"model_type": "qwen3_5_moe", )",
                            R"("qwen3_5_moe", "vision_config": {"model_type": "qwen3_5_moe_vision", )"}) {
    const ModelRope m = read_hf_config(std::string(R"({"model_type": )") + types + sizes + "}}", {.vision = true});
    EXPECT_TRUE(m.vision) << types;
    EXPECT_EQ(m.spec.head_dim, 72) << types;  // 1152 / 16
    EXPECT_EQ(m.spec.stream_layout, StreamLayout::axial) << types;
    EXPECT_EQ(m.spec.pairing, Pairing::half) << types;
    EXPECT_EQ(m.spec.sections, std::vector<int64_t>({18, 18})) << types;
    EXPECT_EQ(make_schedule(m.spec), make_schedule(vl.spec)) << types;
    EXPECT_TRUE(has_note(m, "VisionRotaryEmbedding(head_dim // 2)")) << types;
  }
}

// ---- layers: which apply the resolved RoPE ----

TEST(HfConfig, Gemma3SlidingLayersAreNotResolvedAsFullAttention) {
  const std::string layers = R"("num_hidden_layers": 6, "layer_types": ["sliding_attention", "sliding_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"])";
  const std::string head = R"({"model_type": "gemma3_text", "hidden_size": 1152, "head_dim": 256, "num_attention_heads": 4,
      "num_key_value_heads": 1, "max_position_embeddings": 32768, )" + layers;
  const std::vector<bool> full_only = {false, false, false, false, false, true};
  // transformers 4.5x config.json
  const ModelRope v4 = read(head + R"(, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
      "rope_scaling": {"factor": 8.0, "rope_type": "linear"}})");
  EXPECT_EQ(v4.spec.base, 1e6);
  EXPECT_EQ(v4.spec.schedule, ScheduleType::linear);
  EXPECT_EQ(v4.rope_layers, full_only);
  EXPECT_TRUE(has_note(v4, "sliding_attention layers rotate with base rope_local_base_freq=10000 and the default schedule"));
  // transformers 4.50 config.json: sliding_window_pattern instead of layer_types
  const ModelRope pattern = read(R"({"model_type": "gemma3_text", "hidden_size": 1152, "head_dim": 256,
      "num_attention_heads": 4, "num_hidden_layers": 6, "sliding_window_pattern": 6, "rope_theta": 1000000.0,
      "rope_local_base_freq": 10000.0})");
  EXPECT_EQ(pattern.rope_layers, full_only);
  // transformers 5 config.json: rope_parameters per layer type
  const ModelRope v5 = read(head + R"(, "rope_parameters": {
      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}})");
  EXPECT_EQ(v5.spec.base, 1e6);
  EXPECT_EQ(v5.spec.schedule, ScheduleType::linear);
  EXPECT_EQ(v5.rope_layers, full_only);
  EXPECT_TRUE(has_note(v5, "spec describes the full_attention layers"));
  // A single layer type is the whole model's RoPE.
  const ModelRope single = read(head + R"(, "rope_parameters": {"sliding_attention": {"rope_theta": 10000.0}}})");
  EXPECT_EQ(single.spec.base, 10000.0);
  EXPECT_EQ(single.rope_layers, std::vector<bool>({true, true, true, true, true, false}));
  EXPECT_ROTARY_ERROR(read(R"({"hidden_size": 64, "num_attention_heads": 1, "num_hidden_layers": 6, "layer_types": ["full_attention"],
                              "rope_parameters": {"full_attention": {}, "sliding_attention": {}}})"),
                      "layer_types has 1 values but num_hidden_layers=6");
  // One RoPE for every layer type (Qwen3, GPT-OSS): every layer applies spec.
  EXPECT_TRUE(read(head + R"(, "rope_theta": 10000.0})").rope_layers.empty());
}

// ---- Llama 4 ----

// transformers' _compute_llama3_parameters for one frequency, written out in double from
// modeling_rope_utils.py (torch.where over the bands, the medium band by ~(<) * ~(>)).
double transformers_llama3(double inv_freq, double factor, double low_freq_factor, double high_freq_factor,
                           double old_context_len) {
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;
  const double wavelen = 2 * std::numbers::pi / inv_freq;
  const double inv_freq_llama = wavelen > low_freq_wavelen ? inv_freq / factor : inv_freq;
  const double smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
  const double smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama;
  const bool is_medium_freq = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
  return is_medium_freq ? smoothed_inv_freq : inv_freq_llama;
}

TEST(HfConfig, Llama4ScoutResolvesAsTransformers) {
  const ModelRope m = load_preset("llama-4-scout-17b-16e");
  EXPECT_EQ(m.model_type, "llama4_text");
  EXPECT_EQ(m.spec.pairing, Pairing::interleaved);  // apply_rotary_emb: view_as_complex(x.reshape(..., -1, 2))
  EXPECT_EQ(m.spec.schedule, ScheduleType::llama3);
  EXPECT_EQ(*m.spec.factor, 16.0);
  EXPECT_EQ(*m.spec.low_freq_factor, 1.0);
  EXPECT_EQ(*m.spec.high_freq_factor, 1.0);
  EXPECT_EQ(*m.spec.original_max_position, 8192);
  EXPECT_EQ(m.max_position_embeddings, 10485760);
  ASSERT_EQ(m.rope_layers.size(), 48u);
  for (size_t i = 0; i < 48; ++i) EXPECT_EQ(m.rope_layers[i], (i + 1) % 4 != 0) << "layer " << i;
  EXPECT_TRUE(has_note(m, "12 of 48 layers apply no RoPE (no_rope_layers: 1 = RoPE): 3, 7, 11, 15, 19, 23, 27, 31, "
                          "35, 39, 43, 47"));
  EXPECT_TRUE(has_note(m, "on its 12 layers without RoPE, Llama 4 multiplies queries by "
                          "log1p(floor((p + 1) / floor_scale)) * attn_scale + 1 at position p "
                          "(floor_scale=8192, attn_scale=0.1;"));

  // Equal band factors: two bands, each pair kept or divided by 16, never NaN.
  const Schedule s = make_schedule(m.spec);
  int kept = 0, divided = 0;
  for (size_t i = 0; i < 64; ++i) {
    const double plain = std::exp(-(2.0 * static_cast<double>(i) / 128.0) * std::log(500000.0));
    const double expected = transformers_llama3(plain, 16.0, 1.0, 1.0, 8192.0);
    ASSERT_TRUE(std::isfinite(expected)) << "pair " << i;  // no wavelength sits exactly on 8192
    EXPECT_NEAR(s.inv_freq[i], expected, 1e-14 * expected) << "pair " << i;
    (expected == plain ? kept : divided) += 1;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  // Before the 10M-context revision: high_freq_factor 4, the usual three bands.
  const ModelRope first = read(R"({"model_type": "llama4_text", "head_dim": 128, "num_attention_heads": 40,
      "max_position_embeddings": 262144, "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0,
      "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}})");
  EXPECT_NO_THROW(make_schedule(first.spec));
}

// Layers whose layer_types entry is a recurrent or convolutional mixer (transformers'
// "linear_attention", the legacy "mamba", LFM2's "conv") have no attention and no RoPE: Qwen3-Next
// and Qwen3.5 rotate only their full_attention layers. Found by tests/conformance.
TEST(HfConfig, LinearAttentionLayersApplyNoRope) {
  const std::string head = R"({"model_type": "qwen3_next", "hidden_size": 2048, "num_attention_heads": 16,
      "head_dim": 256, "num_hidden_layers": 8)";
  const std::vector<bool> every_fourth = {false, false, false, true, false, false, false, true};
  // Qwen3NextConfig builds layer_types from full_attention_interval (default 4) when absent.
  const ModelRope built = read(head + "}");
  EXPECT_EQ(built.rope_layers, every_fourth);
  EXPECT_TRUE(has_note(built, "6 of 8 layers are recurrent or convolutional (layer_types linear_attention, mamba or "
                              "conv) and apply no RoPE: 0, 1, 2, 4, 5, 6"));
  EXPECT_EQ(built.layer_types, std::vector<std::string>({"full_attention"}));  // one RoPE layer type
  EXPECT_EQ(read(head + R"(, "layer_types": null})").rope_layers, every_fourth);
  EXPECT_EQ(read(head + R"(, "full_attention_interval": 2})").rope_layers,
            std::vector<bool>({false, true, false, true, false, true, false, true}));
  EXPECT_ROTARY_ERROR(read(head + R"(, "full_attention_interval": 0})"), "full_attention_interval=0 must be >= 1");
  // Explicit layer_types, on any model type; the legacy and convolutional names as well.
  const std::string types = R"(, "layer_types": ["full_attention", "linear_attention", "mamba", "conv",
      "sliding_attention", "full_attention", "linear_attention", "full_attention"]})";
  EXPECT_EQ(read(head + types).rope_layers, std::vector<bool>({true, false, false, false, true, true, false, true}));
  const std::string llama =
      R"({"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 8)";
  EXPECT_EQ(read(llama + types).rope_layers, std::vector<bool>({true, false, false, false, true, true, false, true}));
  EXPECT_TRUE(read(llama + R"(, "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
      "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]})")
                  .rope_layers.empty());  // gpt-oss: every layer attends with the one RoPE
  EXPECT_TRUE(read(llama + "}").rope_layers.empty());
  EXPECT_ROTARY_ERROR(read(llama + R"(, "layer_types": ["full_attention", 7, "full_attention", "full_attention",
      "full_attention", "full_attention", "full_attention", "full_attention"]})"),
                      "layer_types[1]=7 must be a string");
  EXPECT_ROTARY_ERROR(read(llama + R"(, "layer_types": ["linear_attention", "full_attention"]})"),
                      "layer_types has 2 values but num_hidden_layers=8");
  // Bamba: attention at attn_layer_indices, Mamba elsewhere (BambaConfig.layers_block_type).
  const std::string bamba =
      R"({"model_type": "bamba", "hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 6)";
  EXPECT_EQ(read(bamba + R"(, "attn_layer_indices": [1, 4]})").rope_layers,
            std::vector<bool>({false, true, false, false, true, false}));
  EXPECT_EQ(read(bamba + "}").rope_layers, std::vector<bool>(6, false));  // no attention layer at all
  EXPECT_ROTARY_ERROR(read(bamba + R"(, "attn_layer_indices": [1, 6]})"),
                      "attn_layer_indices holds 6, not a layer index in [0, 6)");
  EXPECT_ROTARY_ERROR(read(bamba + R"(, "attn_layer_indices": 3})"),
                      "attn_layer_indices=3 must be a list of layer indices");
  // RecurrentGemma: block_types repeated (default recurrent, recurrent, attention).
  const std::string griffin = R"({"model_type": "recurrent_gemma", "hidden_size": 2560, "num_attention_heads": 10,
      "num_hidden_layers": 5)";
  EXPECT_EQ(read(griffin + "}").rope_layers, std::vector<bool>({false, false, true, false, false}));
  EXPECT_EQ(read(griffin + R"(, "block_types": ["attention", "recurrent"]})").rope_layers,
            std::vector<bool>({true, false, true, false, true}));
  EXPECT_ROTARY_ERROR(read(griffin + R"(, "block_types": []})"),
                      "block_types=a list of 0 items must be a non-empty list");
  // Zamba2 and GraniteMoeHybrid configs name the list layers_block_type (legacy names).
  EXPECT_EQ(read(R"({"model_type": "zamba2", "hidden_size": 2560, "num_attention_heads": 32, "num_hidden_layers": 4,
      "use_mem_rope": true, "layers_block_type": ["mamba", "hybrid", "mamba", "mamba"]})").rope_layers,
            std::vector<bool>({false, true, false, false}));
  // Together with NoPE layers: both take their layers out.
  EXPECT_EQ(read(llama + R"(, "no_rope_layers": [1, 1, 1, 1, 0, 1, 1, 1])" + types).rope_layers,
            std::vector<bool>({true, false, false, false, false, true, false, true}));
}

TEST(HfConfig, NoRopeLayersExplicitOrBuiltAsTransformers) {
  const std::string head = R"({"model_type": "llama4_text", "head_dim": 64, "num_attention_heads": 4, "num_hidden_layers": 8)";
  const std::vector<bool> every_fourth = {true, true, true, false, true, true, true, false};
  EXPECT_EQ(read(head + "}").rope_layers, every_fourth);  // no_rope_layers absent: interval 4
  EXPECT_EQ(read(head + R"(, "no_rope_layers": []})").rope_layers, every_fourth);  // empty: the same
  EXPECT_EQ(read(head + R"(, "no_rope_layer_interval": 2})").rope_layers,
            std::vector<bool>({true, false, true, false, true, false, true, false}));
  EXPECT_EQ(read(head + R"(, "no_rope_layers": [0, 1, 1, 1, 1, 1, 1, 1, 0]})").rope_layers,
            std::vector<bool>({false, true, true, true, true, true, true, true}));
  EXPECT_TRUE(read(head + R"(, "no_rope_layers": [1, 1, 1, 1, 1, 1, 1, 1]})").rope_layers.empty());
  EXPECT_ROTARY_ERROR(read(head + R"(, "no_rope_layers": [1, 1]})"), "no_rope_layers has 2 values but num_hidden_layers=8");
  EXPECT_ROTARY_ERROR(read(head + R"(, "no_rope_layers": [1, "x", 1, 1, 1, 1, 1, 1]})"),
                      "no_rope_layers[1]='x' must be a boolean or a number");
  EXPECT_ROTARY_ERROR(read(head + R"(, "no_rope_layer_interval": 0})"), "no_rope_layer_interval=0 must be >= 1");
  EXPECT_ROTARY_ERROR(read(R"({"model_type": "llama4_text", "head_dim": 64, "num_attention_heads": 4,
                              "num_hidden_layers": 1e12})"),
                      "num_hidden_layers=1000000000000 must be in [1, 2^20]");
  // The query temperature: noted unless switched off; its constants from the config.
  EXPECT_FALSE(has_note(read(head + R"(, "attn_temperature_tuning": false})"), "multiplies queries"));
  EXPECT_TRUE(has_note(read(head + R"(, "attn_temperature_tuning": 4, "floor_scale": 4096, "attn_scale": 0.2})"),
                       "(floor_scale=4096, attn_scale=0.2;"));
  // SmolLM3 builds the same default list, and has no query temperature; notes list 16 layers at most.
  const ModelRope smol = read(R"({"model_type": "smollm3", "hidden_size": 64, "num_attention_heads": 1,
                                 "num_hidden_layers": 40, "no_rope_layer_interval": 2})");
  EXPECT_EQ(smol.rope_layers.size(), 40u);
  EXPECT_TRUE(has_note(smol, "20 of 40 layers apply no RoPE (no_rope_layers: 1 = RoPE): 1, 3, 5, 7, 9, 11, 13, 15, "
                             "17, 19, 21, 23, 25, 27, 29, 31, ..."));
  EXPECT_FALSE(has_note(smol, "multiplies queries"));
  // Other model types read an explicit list, and build none.
  EXPECT_EQ(read(R"({"hidden_size": 64, "num_attention_heads": 1, "no_rope_layers": [1, 0]})").rope_layers,
            std::vector<bool>({true, false}));
  EXPECT_TRUE(read(R"({"hidden_size": 64, "num_attention_heads": 1, "num_hidden_layers": 8})").rope_layers.empty());
}

}  // namespace
}  // namespace rotary
