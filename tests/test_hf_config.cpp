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

#include "model_types.hpp"
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
      EXPECT_ROTARY_ERROR(read(config_of_type(type, on)), "model_type '" + type + "' rotates several position streams");
      EXPECT_ROTARY_ERROR(read(wrapper + config_of_type("unknown_text", on) + "}"),
                          "model_type '" + type + "' rotates several position streams");
      continue;
    }
    if (!key.empty()) {  // RoPE switched off: no rotation to resolve
      EXPECT_ROTARY_ERROR(read(config_of_type(type, ", \"" + key + "\": \"off\"")),
                          key + "='off': model_type '" + type + "' applies RoPE only with " + key + "=");
    }
    const ModelRope m = read(config_of_type(type, on));
    EXPECT_FALSE(has_note(m, "assumed pairing")) << type;
    EXPECT_EQ(read(wrapper + config_of_type("unknown_text", on) + "}").spec.pairing, m.spec.pairing) << type;
    const bool formula_applies = e.pairing_flag.empty() || e.pairing_flag_default;
    EXPECT_EQ(m.rotates_backward, formula_applies && detail::rotates_backward(e.formula)) << type;
    // A partial rotary factor matches only code that rotates part of the head.
    const int64_t head_dim = e.rotary_dim_key == "qk_rope_head_dim" ? 64 : 128;
    EXPECT_EQ(m.spec.head_dim, head_dim) << type;
    const std::string half_rotated = config_of_type(type, on + R"(, "partial_rotary_factor": 0.5)");
    if (e.rotary_dim_key == "rotary_dim") {
      EXPECT_EQ(read(config_of_type(type, on + R"(, "rotary_dim": 32)")).spec.resolved_rotary_dim(), 32) << type;
      EXPECT_ROTARY_ERROR(read(config_of_type(type, on + R"(, "rotary_dim": 33)")), "rotary_dim=33 must be even and > 0");
    } else if (e.partial_rotary) {
      const ModelRope partial = read(half_rotated);
      EXPECT_EQ(partial.spec.resolved_rotary_dim(), head_dim / 2) << type;
      EXPECT_EQ(partial.spec.head_dim, e.trailing_rotary ? head_dim / 2 : head_dim) << type;
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

// ---- fields rotary does not implement: an error naming them, never a silent drop ----

TEST(HfConfig, UnimplementedRopeFieldsAreRefusedByName) {
  const std::string head = R"({"model_type": "frobnicator", "hidden_size": 128, "num_attention_heads": 1, )";
  const std::pair<std::string, std::string> cases[] = {
      // Qwen2-VL (v4 config)
      {R"("rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}})",
       "rope_scaling.mrope_section=a list of 3 items asks for multimodal RoPE, several position streams"},
      // Qwen3-VL: rope_type default, sections interleaved
      {R"("rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": true}})",
       "rope_scaling.mrope_section=a list of 3 items asks for multimodal RoPE"},
      {R"("rope_scaling": {"rope_type": "default", "mrope_interleaved": true}})",
       "rope_scaling.mrope_interleaved=true asks for interleaved multimodal RoPE (Qwen3-VL)"},
      // GLM-4.1V (v5 config)
      {R"("partial_rotary_factor": 0.5, "rope_parameters": {"rope_type": "default", "mrope_section": [8, 12, 12]}})",
       "rope_parameters.mrope_section=a list of 3 items asks for multimodal RoPE"},
      {R"("rope_3d": true, "freq_allocation": 20})", "rope_3d=true asks for 3-D multimodal RoPE (ERNIE-4.5-VL)"},
      {R"("mrope_section": [2, 3, 3]})", "mrope_section=a list of 3 items asks for multimodal RoPE"},
      {R"("rope_scaling": {"type": "mrope"}})", "rope_scaling.rope_type='mrope' asks for multimodal RoPE"},
      // Gemma 4's full attention
      {R"("rope_parameters": {"rope_type": "proportional", "partial_rotary_factor": 0.25}})",
       "rope_parameters.rope_type='proportional' is not supported"},
      {R"("rope_interleave": true})", "rope_interleave=true on a model type rotary does not know"},
      {R"("rope_parameters": {"sliding_attention": {"rope_theta": 10000}, "chunked_attention": {"rope_theta": 10000}}})",
       "rope_parameters is per layer type (2 types) without a full_attention entry"},
      {R"("rope_parameters": {"full_attention": {"rope_type": "default"}, "rope_theta": 1000000.0}})",
       "rope_parameters.rope_theta=1000000.0 must be an object"},
  };
  for (const auto& [fields, needle] : cases) {
    const std::string m = message_of(head + fields);
    EXPECT_NE(m.find(needle), std::string::npos) << "'" << m << "' lacks '" << needle << "'";
    EXPECT_LT(m.size(), 400u);
  }
  // A known multimodal model type whose config names the field is refused by the field (Qwen3-VL).
  EXPECT_ROTARY_ERROR(
      read(R"({"model_type": "qwen3_vl", "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 4096,
               "num_attention_heads": 32, "head_dim": 128, "rope_theta": 5000000,
               "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": true}}})"),
      "rope_scaling.mrope_section=a list of 3 items asks for multimodal RoPE");
  // Switched off, they are nothing to refuse.
  EXPECT_NO_THROW(read(head + R"("rope_3d": false, "rope_scaling": {"mrope_interleaved": false}})"));
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
