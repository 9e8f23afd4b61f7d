// The command-line contract: info/table JSON, readable output, errors (exit 2, one line).
#include <nlohmann/json.hpp>

#include <sstream>

#include "cli.hpp"
#include "rotary/schedule.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

struct Result {
  int status;
  std::string out;
  std::string err;
};

Result run(std::vector<std::string> args) {
  args.insert(args.begin(), "rotary");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int status = cli::run(static_cast<int>(argv.size()), argv.data(), out, err);
  return {status, out.str(), err.str()};
}

TEST(Cli, InfoJsonIsExactlyTheContract) {
  const Result r = run({"info", "--head-dim", "64", "--rotary-dim", "32", "--schedule", "yarn",
                        "--factor", "4", "--original-max-position", "4096", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::ordered_json::parse(r.out);
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"head_dim", "rotary_dim", "pairing", "schedule", "base",
                                            "inv_freq", "attention_factor"}));
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

}  // namespace
}  // namespace rotary
