// The command-line contract: info/table JSON, readable output, errors (exit 2, one line).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <fstream>
#include <random>
#include <sstream>
#include <tuple>

#include "bench.hpp"
#include "cli.hpp"
#include "dev.hpp"
#include "parse.hpp"
#include "rotary/doctor.hpp"
#include "rotary/rotary.h"
#include "rotary/hf_config.hpp"
#include "rotary/schedule.hpp"
#include "rotary/table.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

struct Result {
  int status;
  std::string out;
  std::string err;
};

// `rotary ARGS`, or `rotary-dev ARGS` for its subcommands (demo, bench).
Result run(std::vector<std::string> args) {
  const bool dev = !args.empty() && (args[0] == "demo" || args[0] == "bench");
  args.insert(args.begin(), dev ? "rotary-dev" : "rotary");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int status = (dev ? cli::run_dev : cli::run)(static_cast<int>(argv.size()), argv.data(), out, err);
  return {status, out.str(), err.str()};
}

// demo and bench live in the developer's rotary-dev, not in the user's rotary (nor the reverse).
TEST(Cli, DemoAndBenchAreTheDeveloperToolsOwn) {
  for (const char* sub : {"demo", "bench"}) {
    std::vector<std::string> args{"rotary", sub};
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    std::ostringstream out, err;
    EXPECT_EQ(cli::run(static_cast<int>(argv.size()), argv.data(), out, err), 2) << sub;
    EXPECT_EQ(err.str(), "rotary: error: unknown subcommand '" + std::string(sub) +
                             "' (known: info, table, presets, apply, convert-weights, doctor)\n");
  }
  std::vector<const char*> argv{"rotary-dev", "info"};
  std::ostringstream out, err;
  EXPECT_EQ(cli::run_dev(2, argv.data(), out, err), 2);
  EXPECT_EQ(err.str(), "rotary-dev: error: unknown subcommand 'info' (known: demo, bench)\n");
}

// `rotary info --build`: version, the CPU kernels' Highway target, and the CUDA kernels (built or
// not; their architectures and whether a device runs them), readable or as JSON.
TEST(Cli, InfoBuildSaysWhatThisBuildRunsOn) {
  const Result text = run({"info", "--build"});
  ASSERT_EQ(text.status, 0) << text.err;
  const Result r = run({"info", "--build", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::ordered_json::parse(r.out);
  EXPECT_EQ(j["version"], rotary_version());
  const std::string target = j["cpu_target"];
  EXPECT_NE(text.out.find("rotary " + std::string(rotary_version()) + "\nCPU kernels: Highway target " + target +
                          " on this machine (built: "),
            std::string::npos)
      << text.out;
  const auto& cuda = j["cuda"];
#ifdef ROTARY_CLI_CUDA
  EXPECT_EQ(cuda["compiled"], true);
  const auto architectures = cuda["architectures"].get<std::vector<std::string>>();
  EXPECT_NE(std::find(architectures.begin(), architectures.end(), "sm_90"), architectures.end()) << r.out;
  EXPECT_NE(text.out.find("CUDA kernels: built for sm_"), std::string::npos) << text.out;
  if (cuda["usable"] == true) {
    EXPECT_TRUE(cuda["why_not"].is_null()) << r.out;
    EXPECT_NE(text.out.find(", usable\n"), std::string::npos) << text.out;
  } else {
    EXPECT_FALSE(cuda["why_not"].get<std::string>().empty()) << r.out;
    EXPECT_NE(text.out.find("CUDA device: not usable: " + cuda["why_not"].get<std::string>()), std::string::npos)
        << text.out;
  }
#else
  EXPECT_EQ(cuda["compiled"], false);
  EXPECT_NE(text.out.find("CUDA kernels: not built"), std::string::npos) << text.out;
#endif
}

TEST(Cli, InfoJsonIsExactlyTheContract) {
  const Result r = run({"info", "--head-dim", "64", "--rotary-dim", "32", "--schedule", "yarn",
                        "--factor", "4", "--original-max-position", "4096", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::ordered_json::parse(r.out);
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"head_dim", "rotary_dim", "pairing", "schedule", "base", "inv_freq",
                                            "attention_factor", "layout", "rotary_offset", "blocks", "streams",
                                            "pair_stream", "xpos_scale_base", "xpos_center"}));
  EXPECT_EQ(j["layout"], "half");
  EXPECT_EQ(j["rotary_offset"], 0);
  EXPECT_EQ(j["blocks"], 1);
  EXPECT_EQ(j["streams"], 1);
  EXPECT_EQ(j["pair_stream"], std::vector<int>(16, 0));
  EXPECT_EQ(j["head_dim"], 64);
  EXPECT_EQ(j["rotary_dim"], 32);
  EXPECT_EQ(j["pairing"], "half");
  EXPECT_EQ(j["schedule"], "yarn");
  EXPECT_EQ(j["base"], 10000.0);
  // Doubles round-trip: parsed values are bit-identical to the library's.
  const Schedule s = make_schedule(Spec{.head_dim = 64, .rotary_dim = 32, .schedule = ScheduleType::yarn,
                                        .factor = 4.0, .original_max_position = 4096});
  ASSERT_EQ(j["inv_freq"].size(), 16u);
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(j["inv_freq"][i].get<double>(), s.inv_freq[i]);
  EXPECT_EQ(j["attention_factor"].get<double>(), s.attention_factor);
  EXPECT_EQ(r.out.find(' '), std::string::npos);  // compact
}

// The descriptor: layout, rotary_offset, streams and the pair -> stream map, in both forms.
TEST(Cli, InfoShowsTheDescriptor) {
  const Result r = run({"info", "--head-dim", "128", "--base", "1000000", "--stream-layout", "sections",
                        "--sections", "16,24,24", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const Schedule s = make_schedule(Spec{.head_dim = 128, .base = 1000000, .stream_layout = StreamLayout::sections,
                                        .sections = {16, 24, 24}});
  EXPECT_EQ(j["streams"], 3);
  EXPECT_EQ(j["layout"], "half");
  std::vector<int> want;
  for (int64_t p = 0; p < s.pairs(); ++p) want.push_back(s.stream_of(p));
  EXPECT_EQ(j["pair_stream"], want);
  EXPECT_EQ(want[15], 0);
  EXPECT_EQ(want[16], 1);
  EXPECT_EQ(want[40], 2);
  const Result text = run({"info", "--head-dim", "128", "--stream-layout", "sections", "--sections", "16,24,24"});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("layout half  rotary_offset 0  blocks 1  streams 3  pair_stream 0-15:0 16-39:1 40-63:2\n"),
            std::string::npos) << text.out;
  const Result slice = run({"info", "--head-dim", "16", "--rotary-dim", "8", "--rotary-offset", "8", "--json"});
  ASSERT_EQ(slice.status, 0) << slice.err;
  EXPECT_EQ(nlohmann::json::parse(slice.out)["rotary_offset"], 8);
  const Result blocks = run({"info", "--head-dim", "64", "--blocks", "2", "--stream-layout", "axial", "--sections",
                             "16,16", "--base", "100"});
  ASSERT_EQ(blocks.status, 0) << blocks.err;
  EXPECT_NE(blocks.out.find("layout block_half  rotary_offset 0  blocks 2  streams 2  pair_stream 0-15:0 16-31:1"),
            std::string::npos) << blocks.out;
  const Result prop = run({"info", "--head-dim", "64", "--schedule", "proportional", "--partial-rotary-factor", "0.25",
                           "--json"});
  ASSERT_EQ(prop.status, 0) << prop.err;
  const auto pj = nlohmann::json::parse(prop.out);
  EXPECT_GT(pj["inv_freq"][7].get<double>(), 0.0);
  EXPECT_EQ(pj["inv_freq"][8].get<double>(), 0.0);
}

// xPos: its settings and reach (80 gamma / ln(7/2), written out here) in the text, none without it.
TEST(Cli, InfoShowsXpos) {
  const Result r = run({"info", "--head-dim", "64", "--xpos-scale-base", "512", "--xpos-center", "100"});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string want = fmt::format("xpos scale_base 512  center 100  reach |position - center| <= {:.1f}\n",
                                       80 * 512 / std::log(3.5));
  EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  const Result plain = run({"info", "--head-dim", "64"});
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(plain.out.find("xpos"), std::string::npos);
  const Result alone = run({"info", "--head-dim", "64", "--xpos-center", "3"});
  EXPECT_EQ(alone.status, 2);
  EXPECT_NE(alone.err.find("xpos_center is set but xpos_scale_base is not"), std::string::npos) << alone.err;
}

// A config's layer types: listed by info, one chosen with --layer-type; the vision tower with --vision.
TEST(Cli, LayerTypesAndVisionTower) {
  const Result full = run({"info", "--preset", "gemma-3-4b-it", "--json"});
  ASSERT_EQ(full.status, 0) << full.err;
  const auto fj = nlohmann::json::parse(full.out);
  EXPECT_EQ(fj["layer_types"], (std::vector<std::string>{"sliding_attention", "full_attention"}));
  EXPECT_EQ(fj["layer_type"], "full_attention");
  EXPECT_EQ(fj["vision"], false);
  const Result local = run({"info", "--preset", "gemma-3-4b-it", "--layer-type", "sliding_attention", "--json"});
  ASSERT_EQ(local.status, 0) << local.err;
  const auto lj = nlohmann::json::parse(local.out);
  EXPECT_EQ(lj["layer_type"], "sliding_attention");
  EXPECT_EQ(lj["schedule"], "default");
  EXPECT_EQ(lj["base"], 10000.0);
  const ModelRope want = load_preset("gemma-3-4b-it", ReadOptions{.layer_type = "sliding_attention"});
  EXPECT_EQ(lj["inv_freq"].get<std::vector<double>>(), make_schedule(want.spec).inv_freq);
  const Result text = run({"info", "--preset", "gemma-3-4b-it"});
  EXPECT_NE(text.out.find("layer types: sliding_attention, full_attention (this: full_attention; others with "
                          "--layer-type)"), std::string::npos) << text.out;
  const Result vision = run({"info", "--preset", "qwen2.5-vl-7b-instruct", "--vision", "--json"});
  ASSERT_EQ(vision.status, 0) << vision.err;
  const auto vj = nlohmann::json::parse(vision.out);
  EXPECT_EQ(vj["vision"], true);
  EXPECT_EQ(vj["streams"], 2);
  const Result mrope = run({"info", "--preset", "qwen2.5-vl-7b-instruct", "--json"});
  ASSERT_EQ(mrope.status, 0) << mrope.err;
  EXPECT_EQ(nlohmann::json::parse(mrope.out)["streams"], 3);
}

TEST(Cli, TableJsonRoundTripsFloats) {
  const Result r = run({"table", "--head-dim", "8", "--pairing", "interleaved", "--base", "500000",
                        "--positions", "0,1,4095,2147483647", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["positions"], (std::vector<int64_t>{0, 1, 4095, 2147483647}));
  ASSERT_EQ(j["cos"].size(), 4u);
  ASSERT_EQ(j["cos"][0].size(), 4u);
  const Schedule s = make_schedule(Spec{.head_dim = 8, .base = 500000});
  const int64_t p = 2147483647;
  for (size_t i = 0; i < 4; ++i) {
    const float c = j["cos"][3][i].get<float>();
    const float sn = j["sin"][3][i].get<float>();
    EXPECT_LE(test::table_error_ulps(c, p, s.inv_freq[i], 1.0, false), 1.0);
    EXPECT_LE(test::table_error_ulps(sn, p, s.inv_freq[i], 1.0, true), 1.0);
  }
  EXPECT_EQ(j["cos"][0][0].get<float>(), 1.0f);
  EXPECT_EQ(j["sin"][0][0].get<float>(), 0.0f);
}

TEST(Cli, ReadableOutputs) {
  const Result info = run({"info", "--head-dim", "8", "--schedule", "linear", "--factor", "2"});
  ASSERT_EQ(info.status, 0);
  EXPECT_NE(info.out.find("wavelength"), std::string::npos);
  EXPECT_NE(info.out.find("0.5"), std::string::npos);  // ratio to default
  const Result table = run({"table", "--head-dim", "4", "--positions", "3"});
  ASSERT_EQ(table.status, 0);
  EXPECT_NE(table.out.find("position"), std::string::npos);
  const Result help = run({"info", "--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("--head-dim"), std::string::npos);
}

TEST(Cli, EverySpecOptionReachesTheSchedule) {
  const Result r = run({"info", "--head-dim", "16", "--schedule", "longrope", "--original-max-position",
                        "4096", "--max-position", "131072", "--seq-len", "5000", "--short-factor",
                        "1,1,1,1,1,1,1,1", "--long-factor", "2,2,2,2,2,2,2,2", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["inv_freq"][0].get<double>(), 0.5);  // long factors chosen: 5000 > 4096
  const Result m = run({"info", "--head-dim", "16", "--schedule", "monotone", "--max-length", "100",
                        "--monotone-scale", "0.01", "--json"});
  ASSERT_EQ(m.status, 0) << m.err;
  EXPECT_EQ(nlohmann::json::parse(m.out)["inv_freq"][0].get<double>(), 0.01);
  const Result y = run({"info", "--head-dim", "16", "--schedule", "yarn", "--factor", "4",
                        "--max-position", "2048", "--beta-fast", "16", "--beta-slow", "2",
                        "--mscale", "0.707", "--mscale-all-dim", "1", "--no-truncate", "--json"});
  ASSERT_EQ(y.status, 0) << y.err;
  const Result l = run({"info", "--head-dim", "16", "--schedule", "llama3", "--factor", "8",
                        "--original-max-position", "8192", "--low-freq-factor", "1",
                        "--high-freq-factor", "4", "--attention-factor", "0.9", "--json"});
  ASSERT_EQ(l.status, 0) << l.err;
  EXPECT_EQ(nlohmann::json::parse(l.out)["attention_factor"].get<double>(), 0.9);
}

TEST(Cli, BadInputExitsTwoWithOneLineNamingTheOption) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"info"}, "--head-dim is required"},
      {{"info", "--head-dim", "abc"}, "--head-dim='abc' is not an integer"},
      {{"info", "--head-dim", "64", "--rotary-dim", "63"}, "--rotary-dim: rotary_dim=63 must be even"},
      {{"info", "--head-dim", "64", "--rotary-dim", "130"}, "rotary_dim=130 exceeds head_dim=64"},
      {{"info", "--head-dim", "64", "--base", "0.5"}, "--base: base=0.5 must be > 1"},
      {{"info", "--head-dim", "64", "--base", "1e400"}, "--base='1e400' is not a number"},
      {{"info", "--head-dim", "64", "--pairing", "neox"}, "--pairing='neox' must be interleaved or half"},
      {{"info", "--head-dim", "64", "--schedule", "su"}, "--schedule='su' must be one of"},
      {{"info", "--head-dim", "64", "--stream-layout", "diag"}, "--stream-layout='diag' must be one of single, sections"},
      {{"info", "--head-dim", "64", "--stream-layout", "sections", "--sections", "16,a"},
       "--sections='a' is not an integer"},
      {{"info", "--head-dim", "64", "--stream-layout", "sections", "--sections", "16,15"}, "--sections: sections"},
      {{"info", "--head-dim", "64", "--sections", "16,16"}, "--sections: sections is set but stream_layout single"},
      {{"info", "--head-dim", "64", "--rotary-dim", "32", "--rotary-offset", "33"}, "--rotary-offset: rotary_offset=33"},
      {{"info", "--head-dim", "64", "--blocks", "0"}, "--blocks: blocks=0"},
      {{"info", "--head-dim", "64", "--layer-type", "x"}, "--layer-type needs --config or --preset"},
      {{"info", "--head-dim", "64", "--vision"}, "--vision needs --config or --preset"},
      {{"info", "--preset", "gemma-3-4b-it", "--layer-type", "chunked"}, "--preset 'gemma-3-4b-it': "},
      {{"info", "--preset", "llama-3-8b", "--vision"}, "--preset 'llama-3-8b': "},
      {{"info", "--preset", "llama-3-8b", "--sections", "1,2"}, "--sections cannot be combined with --config/--preset"},
      {{"info", "--head-dim", "64", "--schedule", "linear", "--factor", "-2"}, "--factor: factor=-2 must be > 0"},
      {{"info", "--head-dim", "64", "--schedule", "linear", "--factor", "nan"}, "--factor: factor=nan must be finite"},
      {{"info", "--head-dim", "8", "--schedule", "longrope", "--max-position", "10", "--short-factor", "1,,2"},
       "--short-factor='1,,2' has an empty item at 1"},
      {{"info", "--head-dim", "64", "--factor", "2"}, "--factor: factor is set but schedule default does not use it"},
      {{"info", "--head-dim", "64", "--frobnicate", "2"}, "frobnicate"},
      {{"table", "--head-dim", "8", "--positions", "1,-2"}, "--positions: position=-2 must be in [0, 2^31)"},
      {{"table", "--head-dim", "8", "--positions", "2147483648"}, "position=2147483648"},
      {{"table", "--head-dim", "8"}, "--positions is required"},
      {{}, "subcommand"},
      {{"foo", "--head-dim", "8"}, "unknown subcommand 'foo' (known: info, table, presets, apply"},
      {{"info", "--head-dim", "64", "--json", "extra"}, "extra"},
      {{"table", "--head-dim", "8", "--positions", "0", "--angles", "float"}, "--angles='float' must be exact or hf-float32"},
      {{"apply", "--head-dim", "8", "--angles", "x", "--q", "q.npy", "--out", "o.npy"}, "--angles='x'"},
      {{"bench", "--dtypes", "f8"}, "--dtypes='f8' must be one of f32, bf16, f16"},
      {{"bench", "--threads", "100000"}, "--threads=100000 must be in [0, 1024]"},
      {{"convert-weights", "--in", "a.safetensors", "--out", "b.safetensors", "--to", "half", "--num-heads", "2.5",
        "--num-kv-heads", "1", "--q-name", "q", "--k-name", "k"}, "--num-heads='2.5' is not an integer"},
  };
  for (const auto& [args, needle] : cases) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 2) << needle;
    EXPECT_TRUE(r.out.empty()) << needle;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr '" << r.err << "' lacks '" << needle << "'";
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err;
  }
}

void expect_one_line_error(const Result& r, const std::string& needle) {
  EXPECT_EQ(r.status, 2) << needle;
  EXPECT_TRUE(r.out.empty()) << needle;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr '" << r.err.substr(0, 500) << "' lacks '" << needle << "'";
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err.substr(0, 500);
}

// A 2-million-item --short-factor once made a 4 MB error line; every value is excerpted.
TEST(Cli, ErrorsEchoAtMostAnExcerptOfTheValue) {
  std::string factors;
  for (int i = 0; i < 2'000'000; ++i) factors += "1,";  // ends in an empty item
  const std::string huge(1 << 20, '7');
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"info", "--head-dim", "8", "--schedule", "longrope", "--max-position", "10", "--short-factor", factors},
       "--short-factor='1,1,1,"},
      {{"info", "--head-dim", "8", "--schedule", "longrope", "--max-position", "10", "--short-factor",
        factors + "1", "--long-factor", "1,1,1,1"}, "short_factor has 2000001 values but rotary_dim/2=4"},
      {{"table", "--head-dim", "8", "--positions", "1," + huge + "x"}, "--positions='7777"},
      {{"info", "--head-dim", huge}, "--head-dim='7777"},
      {{"info", "--head-dim", "8", "--base", "1e" + huge}, "--base='1e777"},
      {{"apply", "--head-dim", "8", "--q", "q.npy", "--out", "o.npy", "--layout", huge}, "--layout='7777"},
      {{"apply", "--head-dim", "8", "--q", huge + ".npy", "--out", "o.npy"}, "--q '7777"},
      {{"bench", "--cases", huge}, "--cases='7777"},
      {{"info", "--head-dim", "8", "--" + huge}, "777"},
  };
  for (const auto& [args, needle] : cases) {
    const Result r = run(args);
    expect_one_line_error(r, needle);
    EXPECT_LT(r.err.size(), 500u) << needle;
  }
}

// An unknown option is named first, each unexpected argument excerpted: CLI11 listed them last to
// first, whole, and the message cut to 300 characters showed only a long value, never the option.
TEST(Cli, UnexpectedArgumentsAreNamedOptionFirst) {
  const std::string huge(5000, '9');
  Result r = run({"info", "--head-dim", "64", "--bogus", huge});
  expect_one_line_error(r, "unknown option '--bogus' for 'rotary info' (then '9999");
  EXPECT_NE(r.err.find("... (5000 bytes)"), std::string::npos) << r.err.substr(0, 500);
  EXPECT_LT(r.err.size(), 400u) << r.err.substr(0, 500);
  r = run({"info", "--head-dim", "64", huge, "--bogus", "a", "b", "c", "d"});
  expect_one_line_error(r, "unexpected argument '9999");
  EXPECT_NE(r.err.find("(then '--bogus', 'a', 'b' and 2 more)"), std::string::npos) << r.err.substr(0, 500);
  EXPECT_LT(r.err.size(), 400u) << r.err.substr(0, 500);
  // Before any subcommand, an unknown option was reported only as "A subcommand is required".
  expect_one_line_error(run({"-xxxx"}), "unknown option '-xxxx' for 'rotary'");
  expect_one_line_error(run({"-xxxx", "info", "--head-dim", "64"}), "unknown option '-xxxx' for 'rotary'");
  expect_one_line_error(run({"apply", "--q", std::string("a\0b", 3), "--qq", std::string("x\ny", 3)}),
                        "unknown option '--qq' for 'rotary apply' (then 'x\\x0ay')");
}

struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("rotary-cli-test-" + std::to_string(std::random_device{}()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string file = (path / name).string();
    std::ofstream(file, std::ios::binary) << text;
    return file;
  }
};

// Errors name what the user gave: the option of a spec field, or the --config / --preset the
// settings came from (an inv_freq error from a config's factor used to blame --factor).
TEST(Cli, ErrorsBlameTheOptionTheUserGave) {
  TempDir dir;
  const std::string tiny = dir.write("tiny.json", R"({"model_type": "llama", "hidden_size": 512,
      "num_attention_heads": 32, "rope_scaling": {"rope_type": "linear", "factor": 1e-10}})");
  const std::string dynamic = dir.write("dynamic.json", R"({"model_type": "llama", "hidden_size": 512,
      "num_attention_heads": 32, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "dynamic", "factor": 1e300}})");
  Result r = run({"info", "--config", tiny});
  expect_one_line_error(r, "--config '" + tiny + "': inv_freq[0]=10000000000 must be finite");
  EXPECT_EQ(r.err.find("--factor"), std::string::npos) << r.err;
  r = run({"info", "--config", dynamic, "--seq-len", "2000000000"});
  expect_one_line_error(r, "--config '" + dynamic + "': base after dynamic scaling is inf");
  EXPECT_EQ(r.err.find("--base"), std::string::npos) << r.err;
  expect_one_line_error(run({"info", "--config", dynamic, "--seq-len", "-1"}), "--seq-len: seq_len=-1 must be in");
  expect_one_line_error(run({"info", "--config", dir.write("bad.json", "{")}), "--config '");
  expect_one_line_error(run({"info", "--config", (dir.path / "none.json").string()}), "--config '");
  expect_one_line_error(run({"info", "--preset", "no-such-model"}), "--preset 'no-such-model' is unknown");
  // Spec options: the option named, and only when given.
  expect_one_line_error(run({"info", "--head-dim", "8", "--schedule", "yarn"}), "--schedule: schedule yarn needs factor");
  r = run({"info", "--head-dim", "8", "--schedule", "linear", "--factor", "1e-10"});
  expect_one_line_error(r, "inv_freq[0]=10000000000");
  // Positions: a list for table, a file for apply.
  expect_one_line_error(run({"table", "--head-dim", "8", "--positions", "5,-1"}), "--positions: position=-1");
}

// A note of a config is printed only when the command succeeds: a failing command prints one line.
TEST(Cli, NotesDoNotJoinAnError) {
  TempDir dir;
  const std::string config = dir.write("config.json", R"({"hidden_size": 512, "num_attention_heads": 32})");
  const Result ok = run({"info", "--config", config});
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_NE(ok.err.find("rotary: note: config has no model_type"), std::string::npos) << ok.err;
  expect_one_line_error(run({"apply", "--config", config}), "--q is required");
  expect_one_line_error(run({"table", "--config", config, "--positions", "-1"}), "--positions: position=-1");
}

// The drift line of `info` for a model: the Float32Drift at `position`, the model's last, with the
// schedule at that sequence length.
std::string drift_line(const ModelRope& model, int64_t position, const std::string& context) {
  const Float32Drift d = hf_float32_drift(make_schedule(model.spec, position + 1), position);
  return fmt::format("float32 pipeline (transformers) at the model's last position {} (context {}): angle off by up "
                     "to {:.3g} rad (pair {}); cos/sin off by up to {:.0f} ulp; rotary's exact tables: <= 1 ulp\n",
                     position, context, d.max_angle_error, d.worst_pair, d.max_ulps);
}

// info gives transformers' float32 drift at the model's own last position and says how its config states
// the length. It took max_position_embeddings - 1: 32767 for Qwen2.5's YaRN, whose context is 4 x 32768.
TEST(Cli, InfoDriftIsAtTheModelsLastPosition) {
  const std::vector<std::tuple<std::string, int64_t, std::string>> cases = {
      {"qwen2.5-7b-instruct", 131071, "131072 = factor 4 x original length 32768"},  // yarn, L = its max
      {"llama-3.1-8b", 131071, "131072 = max_position_embeddings"},                   // llama3, factor 8 x 8192
      {"llama-3.2-1b", 131071, "131072 = max_position_embeddings"},                   // not factor 32 x 8192
      {"phi-3.5-mini-instruct", 131071, "131072 = max_position_embeddings"},          // longrope: long factors
      {"deepseek-v3", 163839, "163840 = max_position_embeddings"},                    // yarn, factor 40 x 4096
      {"llama-3-8b", 8191, "8192 = max_position_embeddings"}};                        // default
  for (const auto& [preset, last, context] : cases) {
    const Result r = run({"info", "--preset", preset});
    ASSERT_EQ(r.status, 0) << preset << ": " << r.err;
    const std::string want = drift_line(load_preset(preset), last, context);
    EXPECT_NE(r.out.find(want), std::string::npos) << preset << ": want\n" << want << "got\n" << r.out;
  }
  // Spec options: the lengths they state; a window past rotary's positions is measured at its last one.
  const Result yarn =
      run({"info", "--head-dim", "16", "--schedule", "yarn", "--factor", "4", "--max-position", "2048"});
  EXPECT_NE(yarn.out.find("at the model's last position 8191 (context 8192 = factor 4 x original length 2048)"),
            std::string::npos) << yarn.out;
  const Result mono = run({"info", "--head-dim", "16", "--schedule", "monotone", "--max-length", "100"});
  EXPECT_NE(mono.out.find("at the model's last position 99 (context 100 = max_length)"), std::string::npos)
      << mono.out;
  const Result far =
      run({"info", "--head-dim", "16", "--schedule", "yarn", "--factor", "1e9", "--max-position", "2048"});
  EXPECT_NE(far.out.find("at rotary's last position 2147483647 (context 2048000000000 = factor 1000000000 x original "
                         "length 2048, beyond rotary's positions)"), std::string::npos) << far.out;
  EXPECT_EQ(run({"info", "--head-dim", "16"}).out.find("float32 pipeline"), std::string::npos);  // no length stated
}

// JSON has no inf: a factor whose cos/sin overflow float32 is an error, never `inf` in the output.
TEST(Cli, JsonNeverPrintsInfOrNan) {
  for (const char* factor : {"1e39", "3.5e38"}) {
    const Result r = run({"table", "--head-dim", "8", "--attention-factor", factor, "--positions", "0,1", "--json"});
    expect_one_line_error(r, "attention");
    EXPECT_EQ(r.out.find("inf"), std::string::npos);
  }
  const Result big = run({"table", "--head-dim", "8", "--attention-factor", "3.4e38", "--positions", "0", "--json"});
  ASSERT_EQ(big.status, 0) << big.err;
  EXPECT_EQ(big.out.find("inf"), std::string::npos) << big.out;
  EXPECT_TRUE(nlohmann::json::accept(big.out));
  // The check every JSON number passes first (info, table, bench).
  EXPECT_ROTARY_ERROR(cli::require_finite_for_json(std::numeric_limits<double>::infinity(), "cos at position 0 pair 1"),
                      "cos at position 0 pair 1=inf is not finite; --json prints only finite numbers");
  EXPECT_ROTARY_ERROR(cli::require_finite_for_json(std::nan(""), "median_ns"), "median_ns=nan is not finite");
  EXPECT_NO_THROW(cli::require_finite_for_json(3.4e38, "cos"));
}

// doctor --json: the report of rotary::doctor for the config, as its fields say (the issue's contract:
// context, float32_drift.{threshold_rad, first_position, max_rad_at_context}, wrap_distance, hazards).
TEST(Cli, DoctorJsonIsTheLibrarysReport) {
  TempDir dir;
  const std::string config = dir.write("llama.json", preset_config("llama-3.1-8b"));
  const ModelRope model = read_hf_config_file(config);
  for (const std::optional<int64_t> context : {std::optional<int64_t>(), std::optional<int64_t>(70000)}) {
    std::vector<std::string> args = {"doctor", "--config", config, "--json"};
    if (context) args.insert(args.end(), {"--context", std::to_string(*context)});
    const Result r = run(args);
    ASSERT_EQ(r.status, 0) << r.err;
    const DoctorReport want = doctor(model, context);
    EXPECT_EQ(r.out, to_json(want) + "\n");
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["context"], context.value_or(131072));  // default: max_position_embeddings
    EXPECT_EQ(j["float32_drift"]["threshold_rad"].get<double>(), 1e-3);
    EXPECT_EQ(j["float32_drift"]["first_position"], *want.float32_drift.first_position);
    EXPECT_EQ(j["float32_drift"]["max_rad_at_context"].get<double>(), want.float32_drift.max_rad_at_context);
    EXPECT_EQ(j["wrap_distance"].size(), 64u);
    ASSERT_FALSE(j["hazards"].empty());
    for (const auto& h : j["hazards"]) {
      EXPECT_TRUE(h["kind"].is_string() && h["position"].is_number_integer() && h["detail"].is_string()) << h;
    }
  }
  // Without --json, the report for a reader; --preset and spec options work as for info.
  const Result text = run({"doctor", "--config", config});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_EQ(text.out, to_text(doctor(model)));
  EXPECT_EQ(text.out.find("rotary doctor: schedule llama3, 64 pairs, context 131072 (max_position_embeddings)\n"), 0u);
  EXPECT_NE(text.out.find("\nfloat32_drift at "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("\nllama3_bands at 8192: "), std::string::npos) << text.out;
  EXPECT_EQ(run({"doctor", "--preset", "llama-3.1-8b"}).out, text.out);
  const Result spec = run({"doctor", "--head-dim", "64", "--schedule", "monotone", "--max-length", "4096"});
  ASSERT_EQ(spec.status, 0) << spec.err;
  EXPECT_NE(spec.out.find("context 4096 (max_length)"), std::string::npos) << spec.out;
}

// --layer-type picks one RoPE of a model whose layer types differ (Gemma 3: its sliding layers run
// the default schedule at base 10000, its full layers linear at 1e6).
TEST(Cli, DoctorTakesTheLayerType) {
  TempDir dir;
  const std::string config = dir.write("gemma.json", preset_config("gemma-3-4b-it"));
  const Result full = run({"doctor", "--config", config, "--json", "--context", "5000"});
  const Result sliding = run({"doctor", "--config", config, "--layer-type", "sliding_attention", "--json",
                              "--context", "5000"});
  ASSERT_EQ(full.status, 0) << full.err;
  ASSERT_EQ(sliding.status, 0) << sliding.err;
  EXPECT_EQ(nlohmann::json::parse(full.out)["schedule"], "linear");
  EXPECT_EQ(nlohmann::json::parse(sliding.out)["schedule"], "default");
  EXPECT_EQ(sliding.out,
            to_json(doctor(read_hf_config_file(config, {.layer_type = "sliding_attention"}), 5000)) + "\n");
}

TEST(Cli, DoctorRefusesBadInput) {
  TempDir dir;
  const std::string config = dir.write("llama.json", preset_config("llama-3.1-8b"));
  expect_one_line_error(run({"doctor", "--config", config, "--context", "0"}),
                        "--context=0 must be in [1, 2^31] (positions 0 .. context-1)");
  expect_one_line_error(run({"doctor", "--config", config, "--context", "2147483649"}),
                        "--context=2147483649 must be in [1, 2^31]");
  expect_one_line_error(run({"doctor", "--config", config, "--context", "12k"}),
                        "--context='12k' is not an integer");
  expect_one_line_error(run({"doctor", "--config", config, "--layer-type", "nope"}), "'nope'");
  expect_one_line_error(run({"doctor", "--config", (dir.path / "none.json").string()}), "--config '");
  expect_one_line_error(run({"doctor", "--config", dir.write("bad.json", "{")}), "--config '");
  expect_one_line_error(run({"doctor", "--config", config, "--seq-len", "5"}), "--seq-len: the doctor takes the schedule");
  expect_one_line_error(run({"doctor", "--head-dim", "8"}), "--context is needed: the settings state no length");
  expect_one_line_error(run({"doctor", "--layer-type", "x", "--head-dim", "8"}), "--layer-type needs --config");
}

// `rotary-dev bench --cases rerotate,switch` times the long-context operations as apply's cases are
// timed: one row per case, dtype, pairing and placement, with the angles the operation uses, finite
// ratios to a memcpy of the same bytes and prefill's target (0.60 in place). One placement, dtype
// and pairing, 3 repetitions: the cases' shapes are fixed (a 4096-token cache, 96 MiB of buffers),
// and the scalar reference's timing alone takes about a second per row.
TEST(Cli, BenchTimesRerotateAndSwitch) {
  const Result r = run({"bench", "--cases", "switch,rerotate", "--dtypes", "f32", "--pairings", "half", "--placement",
                        "inplace", "--threads", "1", "--reps", "3", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 2u) << r.out;
  EXPECT_EQ(rows[0]["case"], "rerotate");
  EXPECT_EQ(rows[0]["angles"], "caller");
  EXPECT_EQ(rows[1]["case"], "switch");
  EXPECT_EQ(rows[1]["angles"], "on_the_fly");
  for (const auto& row : rows) {
    EXPECT_EQ(row["dtype"], "f32");
    EXPECT_EQ(row["pairing"], "half");
    EXPECT_EQ(row["inplace"], true);
    EXPECT_EQ(row["threads"], 1);
    for (const char* field : {"median_ns", "memcpy_median_ns", "ratio_to_memcpy", "gbps", "speedup_vs_reference",
                              "touch_ratio_to_memcpy", "compute_floor_ratio"}) {
      ASSERT_TRUE(row.contains(field)) << field << " missing in " << row;
      const double v = row[field].get<double>();
      EXPECT_TRUE(std::isfinite(v) && v > 0) << field << "=" << v << " in " << row;
    }
    EXPECT_EQ(row["target"].get<double>(), 0.60) << row;
    EXPECT_EQ(row["target_against"], "memcpy");
    EXPECT_FALSE(row.contains("ratio_to_single_stream")) << row;
  }
  expect_one_line_error(run({"bench", "--cases", "rerotate,shift"}),
                        "--cases='shift' must be one of prefill_q, prefill_k, decode, batched_decode, mrope, "
                        "rerotate, switch");
}

// `rotary-dev bench --cases rope_store,qk_norm_rope,rerotate_cache` times the fused operations: a
// prefill and a decode row each (rerotate_cache: the eviction of a 4096-token cache only), every
// ratio finite, decode rows against a plain apply call.
TEST(Cli, BenchTimesTheFusedOperations) {
  const Result r = run({"bench", "--cases", "rope_store,qk_norm_rope,rerotate_cache", "--dtypes", "bf16", "--angles",
                        "table", "--threads", "1", "--reps", "3", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 5u) << r.out;
  const std::vector<std::pair<std::string, std::string>> want = {{"rope_store", "prefill"}, {"rope_store", "decode"},
                                                                 {"qk_norm_rope", "prefill"},
                                                                 {"qk_norm_rope", "decode"},
                                                                 {"rerotate_cache", "prefill"}};
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    EXPECT_EQ(row["case"], want[i].first) << row;
    EXPECT_EQ(row["shape"], want[i].second) << row;
    EXPECT_EQ(row["tokens"], want[i].second == "prefill" ? 4096 : 1) << row;
    std::vector<const char*> fields = {"median_ns", "unfused_median_ns", "ratio_to_unfused", "memcpy_median_ns",
                                       "ratio_to_memcpy", "gbps"};
    if (want[i].second == "decode") fields.push_back("ratio_to_apply");
    for (const char* field : fields) {
      ASSERT_TRUE(row.contains(field)) << field << " missing in " << row;
      const double v = row[field].get<double>();
      EXPECT_TRUE(std::isfinite(v) && v > 0) << field << "=" << v << " in " << row;
    }
  }
}

// `rotary-dev bench --device cuda` where it cannot run (CI: no CUDA device; or a build without the CUDA
// backend): exit 2 and one line naming why, after every option is checked (the same error for the
// same command line on any machine). --device takes cpu or cuda, excerpted when it is neither.
TEST(Cli, BenchOnCudaWithoutADeviceSaysWhy) {
  expect_one_line_error(run({"bench", "--device", "gpu"}), "--device='gpu' must be cpu or cuda");
  const Result huge = run({"bench", "--device", std::string(5000, 'x')});
  expect_one_line_error(huge, "--device='xxxx");
  EXPECT_LT(huge.err.size(), 400u) << huge.err.substr(0, 500);
  expect_one_line_error(run({"bench", "--device", "cuda", "--cases", "decode,prefill_q"}),
                        "--cases='prefill_q' must be one of prefill, decode, batched_decode");
  expect_one_line_error(run({"bench", "--device", "cuda", "--threads", "1"}), "--threads applies to --device cpu only");
  expect_one_line_error(run({"bench", "--device", "cuda", "--dtypes", "f64"}), "--dtypes='f64' must be one of");
  expect_one_line_error(run({"bench", "--device", "cuda", "--reps", "2"}), "--reps=2 must be in [3, 1000]");
  expect_one_line_error(run({"bench", "--device", "cpu", "--cases", "prefill"}),
                        "--cases='prefill' must be one of prefill_q, prefill_k");
  const std::string why = cli::cuda_bench_unavailable();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is present (BenchOnCudaTimesEveryCase runs the bench)";
#ifdef ROTARY_CLI_CUDA
  EXPECT_TRUE(why.starts_with("no CUDA device (cudaGetDeviceCount: ")) << why;
#else
  EXPECT_EQ(why, "this rotary was built without CUDA");
#endif
  expect_one_line_error(run({"bench", "--device", "cuda"}), "rotary-dev: error: --device cuda: " + why);
  expect_one_line_error(run({"bench", "--device", "cuda", "--cases", "batched_decode,prefill", "--dtypes", "bf16",
                             "--reps", "3", "--json"}),
                        "rotary-dev: error: --device cuda: " + why);
}

// The named CUDA cases and the caller's cos/sin pass the options' checks (then, without a device,
// the one-line error); the CPU bench has no "caller" angles for apply.
TEST(Cli, BenchOnCudaTakesTheNamedCasesAndTheCallersAngles) {
  expect_one_line_error(run({"bench", "--angles", "caller"}), "--angles='caller' must be one of table, on_the_fly");
  expect_one_line_error(run({"bench", "--device", "cuda", "--angles", "cos"}),
                        "--angles='cos' must be one of table, on_the_fly, caller");
  expect_one_line_error(run({"bench", "--device", "cuda", "--cases", "partial"}),
                        "--cases='partial' must be one of prefill, decode, batched_decode, mrope, partial_deepseek_v3, "
                        "partial_phi");
  const std::string why = cli::cuda_bench_unavailable();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is present (BenchOnCudaTimesTheNamedCases runs them)";
  expect_one_line_error(run({"bench", "--device", "cuda", "--cases", "mrope,partial_deepseek_v3,partial_phi",
                             "--angles", "table,on_the_fly,caller"}),
                        "rotary-dev: error: --device cuda: " + why);
  expect_one_line_error(run({"bench", "--device", "cuda", "--cases", "rope_store,qk_norm_rope", "--angles", "caller"}),
                        "rotary-dev: error: --device cuda: " + why);
}

// The fused operations on the device are named cases too; the CPU's rerotate_cache row is not one.
TEST(Cli, BenchOnCudaTakesTheFusedCases) {
  expect_one_line_error(run({"bench", "--device", "cuda", "--cases", "rope_store,rerotate_cache"}),
                        "--cases='rerotate_cache' must be one of prefill, decode, batched_decode, mrope, "
                        "partial_deepseek_v3, partial_phi, rope_store, qk_norm_rope");
}

// On a CUDA device (skipped elsewhere): rope_store and qk_norm_rope, prefill and decode, each row's
// q, k and caches equal to the CPU's bit for bit, timed against the unfused composition and a copy
// (prefill: the 1.15x target and faster than unfused; decode: graph replay, 1.5x of a plain call).
TEST(Cli, BenchOnCudaTimesTheFusedOperations) {
  if (const std::string why = cli::cuda_bench_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const Result r = run({"bench", "--device", "cuda", "--cases", "qk_norm_rope,rope_store", "--dtypes", "bf16",
                        "--pairings", "half", "--angles", "table,caller", "--reps", "3", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 8u) << r.out;  // 2 ops (rope_store first) x prefill, decode x 2 angles
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    const bool decode = i % 4 >= 2;
    EXPECT_EQ(row["case"], i < 4 ? "rope_store" : "qk_norm_rope") << row;
    EXPECT_EQ(row["shape"], decode ? "decode" : "prefill") << row;
    EXPECT_EQ(row["angles"], i % 2 == 0 ? "table" : "caller") << row;
    EXPECT_EQ(row["timing"], decode ? "graph" : "events") << row;
    EXPECT_EQ(row["bitwise"], true) << row;
    EXPECT_EQ(row["target"].get<double>(), decode ? 1.5 : 1.15) << row;
    EXPECT_EQ(row.contains("ratio_to_plain"), decode) << row;
    for (const char* field : {"median_ns", "unfused_median_ns", "memcpy_median_ns", "ratio_to_unfused", "gbps"}) {
      const double v = row[field].get<double>();
      EXPECT_TRUE(std::isfinite(v) && v > 0) << field << "=" << v << " in " << row;
    }
  }
}

// On a CUDA device (skipped elsewhere): M-RoPE and the partial-rotary cases, with the caller's
// cos/sin, each row bitwise against the CPU and held against its plain variant timed in the same row.
TEST(Cli, BenchOnCudaTimesTheNamedCases) {
  if (const std::string why = cli::cuda_bench_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const Result r = run({"bench", "--device", "cuda", "--cases", "mrope,partial_deepseek_v3,partial_phi", "--dtypes",
                        "bf16", "--pairings", "interleaved", "--angles", "caller,on_the_fly", "--placement",
                        "outofplace", "--reps", "3", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 6u) << r.out;  // 3 cases x 2 angles
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    EXPECT_EQ(row["case"], (std::vector<std::string>{"mrope", "partial_deepseek_v3", "partial_phi"}[i / 2])) << row;
    EXPECT_EQ(row["angles"], i % 2 == 0 ? "caller" : "on_the_fly") << row;
    EXPECT_EQ(row["bitwise"], true) << row;
    EXPECT_EQ(row["timing"], "events") << row;
    EXPECT_EQ(row["target_against"], "plain") << row;
    EXPECT_EQ(row["target"].get<double>(), 1.05) << row;
    for (const char* field : {"median_ns", "memcpy_median_ns", "plain_median_ns", "ratio_to_plain"}) {
      const double v = row[field].get<double>();
      EXPECT_TRUE(std::isfinite(v) && v > 0) << field << "=" << v << " in " << row;
    }
  }
}

// On a CUDA device (skipped elsewhere): a row for every case, angles and placement, each equal to
// rotary::apply on the CPU bit for bit, with finite times against the copy; prefill timed by events
// against 1.15x (table) and 1.20x (on the fly) of the copy, decode-sized cases by graph replay
// against 3 us per call, with their eager time beside.
TEST(Cli, BenchOnCudaTimesEveryCase) {
  if (const std::string why = cli::cuda_bench_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const Result r = run({"bench", "--device", "cuda", "--dtypes", "bf16", "--pairings", "half", "--reps", "3",
                        "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 12u) << r.out;  // 3 cases x 2 angles x 2 placements
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    const std::string name = row["case"];
    EXPECT_EQ(name, (std::vector<std::string>{"prefill", "decode", "batched_decode"}[i / 4])) << row;
    EXPECT_EQ(row["device"], "cuda");
    EXPECT_EQ(row["dtype"], "bf16");
    EXPECT_EQ(row["angles"], i % 4 < 2 ? "table" : "on_the_fly") << row;
    EXPECT_EQ(row["inplace"], i % 2 == 0) << row;
    EXPECT_EQ(row["bitwise"], true) << row;
    const bool graph = name != "prefill";
    EXPECT_EQ(row["timing"], graph ? "graph" : "events") << row;
    EXPECT_EQ(row["target_against"], graph ? "us" : "memcpy") << row;
    EXPECT_EQ(row["target"].get<double>(), graph ? 3.0 : i % 4 < 2 ? 1.15 : 1.20) << row;
    EXPECT_EQ(row.contains("eager_median_ns"), graph) << row;
    for (const char* field : {"median_ns", "memcpy_median_ns", "ratio_to_memcpy", "gbps"}) {
      const double v = row[field].get<double>();
      EXPECT_TRUE(std::isfinite(v) && v > 0) << field << "=" << v << " in " << row;
    }
  }
}

}  // namespace
}  // namespace rotary
