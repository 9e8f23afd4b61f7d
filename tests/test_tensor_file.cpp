// .npy / .safetensors readers and writers, the file commands, and every malformed-file case.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "cli.hpp"
#include "dev.hpp"
#include "commands.hpp"
#include "rotary/apply.hpp"
#include "rotary/error.hpp"
#include "rotary/pairing.hpp"
#include "support/oracle.hpp"
#include "tensor_file.hpp"

namespace rotary {
namespace {

namespace fs = std::filesystem;
using cli::HostTensor;
using cli::TensorFile;

HostTensor tensor(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, uint64_t seed) {
  HostTensor t{name, dtype, shape, {}};
  t.data.resize(static_cast<size_t>(t.elements() * cli::dtype_size(dtype)));
  std::mt19937_64 rng(seed);
  if (dtype == "F32") {
    std::normal_distribution<float> normal(0, 1);
    for (size_t i = 0; i < t.data.size(); i += 4) { const float v = normal(rng); std::memcpy(&t.data[i], &v, 4); }
  } else {
    for (auto& b : t.data) b = static_cast<unsigned char>(rng());
  }
  return t;
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("rotary-test-" + std::to_string(std::random_device{}()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

struct RunResult {
  int status;
  std::string out, err;
};
// `rotary ARGS`, or `rotary-dev ARGS` for its subcommands (demo, bench).
RunResult run(std::vector<std::string> args) {
  const bool dev = !args.empty() && (args[0] == "demo" || args[0] == "bench");
  args.insert(args.begin(), dev ? "rotary-dev" : "rotary");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int status = (dev ? cli::run_dev : cli::run)(static_cast<int>(argv.size()), argv.data(), out, err);
  return {status, out.str(), err.str()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int files_in(const fs::path& dir) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) { (void)entry; ++files; }
  return files;
}

// Every error of the CLI: exit status 2, nothing on stdout, one line on stderr holding `needle`.
void expect_user_error(const RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.status, 2) << needle << ": " << r.err;
  EXPECT_TRUE(r.out.empty()) << needle;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr '" << r.err << "' lacks '" << needle << "'";
  EXPECT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err;
}

// f32 tensors `back` = `original` rotated and rotated back: within two roundings per value
// (the values are below 4 in magnitude).
void expect_round_trip(const HostTensor& original, const HostTensor& back) {
  ASSERT_EQ(back.data.size(), original.data.size());
  for (int64_t i = 0; i < original.elements(); ++i) {
    float a, b;
    std::memcpy(&a, &original.data[static_cast<size_t>(i * 4)], 4);
    std::memcpy(&b, &back.data[static_cast<size_t>(i * 4)], 4);
    ASSERT_NEAR(a, b, 4 * 0x1p-23 * (std::fabs(a) + 4)) << "element " << i;
  }
}

TEST(TensorFile, NpyRoundTripAndHeaderLayout) {
  for (const auto& [dtype, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"F32", {2, 3, 4, 8}}, {"F64", {5}}, {"F16", {3, 2}}, {"I64", {2, 7}}, {"I32", {}}}) {
    const HostTensor t = tensor("array", dtype, shape, 1);
    const std::string bytes = cli::format_npy(t);
    EXPECT_EQ(bytes.substr(0, 6), "\x93NUMPY");
    const size_t header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    EXPECT_EQ((10 + header_len) % 64, 0u);  // numpy aligns the data to 64 bytes
    const TensorFile back = cli::parse_npy(bytes);
    ASSERT_EQ(back.tensors.size(), 1u);
    EXPECT_EQ(back.tensors[0].dtype, dtype);
    EXPECT_EQ(back.tensors[0].shape, shape);
    EXPECT_EQ(back.tensors[0].data, t.data);
  }
  // A header as numpy writes it, typed out by hand.
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1), }";
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header;
  const float values[2] = {1.5f, -2.0f};
  bytes.append(reinterpret_cast<const char*>(values), 8);
  const TensorFile parsed = cli::parse_npy(bytes);
  EXPECT_EQ(parsed.tensors[0].shape, (std::vector<int64_t>{2, 1}));
}

TEST(TensorFile, SafetensorsRoundTripKeepsMetadataOrderAndBits) {
  TensorFile file;
  file.metadata = {{"format", "pt"}, {"note", "hello"}};
  file.tensors = {tensor("b.weight", "BF16", {4, 3}, 2), tensor("a.weight", "F32", {2, 2}, 3),
                  tensor("c.bias", "I64", {5}, 4), tensor("empty", "F16", {0, 7}, 5)};
  const std::string bytes = cli::format_safetensors(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const TensorFile back = cli::parse_safetensors(bytes);
  EXPECT_EQ(back.metadata, file.metadata);
  ASSERT_EQ(back.tensors.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(back.tensors[i].name, file.tensors[i].name);
    EXPECT_EQ(back.tensors[i].shape, file.tensors[i].shape);
    EXPECT_EQ(back.tensors[i].data, file.tensors[i].data);
  }
  EXPECT_EQ(cli::format_safetensors(back), bytes);
}

std::string safetensors_with_header(const std::string& json, size_t buffer_bytes) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + std::string(buffer_bytes, '\x01');
}

// A version-1 .npy with the given header text (length computed here) and data bytes.
std::string npy_with_header(const std::string& header, size_t data_bytes) {
  std::string out = std::string("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  return out + header + std::string(data_bytes, '\0');
}

TEST(TensorFile, MalformedFilesGiveErrorsNotCrashes) {
  const std::vector<std::pair<std::string, std::string>> npy_cases = {
      {"", ".npy magic is missing"},
      {"\x93NUMPX\x01\x00\x10\x00", ".npy magic is missing"},
      {std::string("\x93NUMPY\x01\x00\xff\x00", 10) + "{}", ".npy header is truncated"},
      {std::string("\x93NUMPY\x09\x00\x02\x00", 10) + "{}", ".npy version 9 is unsupported"},
      {npy_with_header("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }\n", 4), "'>f4' is unsupported"},
      {npy_with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }\n", 4), "fortran_order=True"},
      {npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }\n", 0), ".npy data has 0 bytes but shape and dtype need 16"},
      {npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (999999999999, 999999999), }\n", 0), "more than 2^40 elements"},
      {npy_with_header("{'descr': '<f4', 'shap", 0), "malformed"},
      {npy_with_header("{'descr': '<f4', 'fortran_order': False}", 0), "missing descr, fortran_order or shape"},
      // Python would not read these as a dict of a tuple; nor does the reader.
      {npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2 3), }\n", 24), "expected ',' or ')'"},
      {npy_with_header("{'descr': '<f4' 'fortran_order': False, 'shape': (2,), }\n", 8), "expected ',' or '}'"},
      {std::string("\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12) + "{}", ".npy header is truncated"},
  };
  for (const auto& [bytes, needle] : npy_cases) EXPECT_ROTARY_ERROR(cli::parse_npy(bytes), needle);
  const std::vector<std::pair<std::string, std::string>> st_cases = {
      {"abc", "shorter than its 8-byte header size"},
      {std::string("\xff\0\0\0\0\0\0\0{}", 10), "header size 255 exceeds the file"},
      {safetensors_with_header("{not json}", 0), "header is not valid JSON"},
      {safetensors_with_header("[1]", 0), "header is not a JSON object"},
      {safetensors_with_header(R"({"x": {"dtype": "F32", "shape": [2]}})", 8), "needs dtype, shape and data_offsets"},
      {safetensors_with_header(R"({"x": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", 8), "dtype 'Q4' is unknown"},
      {safetensors_with_header(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 80]}})", 8), "lie outside the 8-byte buffer"},
      {safetensors_with_header(R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8), "has 8 bytes but shape and dtype need 12"},
      {safetensors_with_header(R"({"x": {"dtype": "F32", "shape": [1099511627777], "data_offsets": [0, 8]}})", 8), "is too large"},
      {safetensors_with_header(R"({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 8]}})", 8), "shape has a non-integer"},
      {safetensors_with_header(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12), "overlaps another tensor"},
      {safetensors_with_header(R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8), "has a hole before tensor 'x'"},
      {safetensors_with_header(R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8), "bytes no tensor covers"},
      {safetensors_with_header(R"({"__metadata__": {"a": 1}})", 0), "__metadata__.a must be a string"},
      {safetensors_with_header(R"({"x": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})", 4), "dtype must be a string"},
      {safetensors_with_header(std::string(100, '[') + std::string(100, ']'), 0), "deeper than 64 levels"},
      // A user's text in a message: excerpted, NUL and newline escaped.
      {safetensors_with_header("{\"" + std::string(5000, 'n') + "\": 1}", 0), "'nnnnn"},
      {safetensors_with_header(R"({"a\u0000\nb": {"dtype": "F32", "shape": [1]}})", 0), "tensor 'a\\x00\\x0ab' needs"},
  };
  for (const auto& [bytes, needle] : st_cases) EXPECT_ROTARY_ERROR(cli::parse_safetensors(bytes), needle);
  try {
    cli::parse_safetensors(safetensors_with_header("{\"" + std::string(5000, 'n') + "\": 1}", 0));
    ADD_FAILURE() << "no error";
  } catch (const rotary::Error& e) {
    EXPECT_LT(std::strlen(e.what()), 300u) << e.what();  // not the 5000-character name
  }
}

// The reference writer gives a zero-size tensor the offset where the next one starts; sorting by
// begin alone could put the zero-size tensor after its neighbour and call the pair overlapping.
TEST(TensorFile, ZeroSizeTensorSharesItsOffsetWithTheNext) {
  const std::string json = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},)"
                           R"( "b": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},)"
                           R"( "first": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                           R"( "z": {"dtype": "F16", "shape": [3, 0], "data_offsets": [16, 16]}})";
  const TensorFile file = cli::parse_safetensors(safetensors_with_header(json, 16));
  std::vector<std::string> names;
  for (const HostTensor& t : file.tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"first", "b", "a", "z"}));  // offset order, zero-size first
  EXPECT_EQ(cli::parse_safetensors(cli::format_safetensors(file)).tensors.size(), 4u);
  EXPECT_ROTARY_ERROR(cli::parse_safetensors(safetensors_with_header(
                          R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                          R"( "b": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})", 8)),
                      "tensor 'b' overlaps another tensor");  // zero-size, but inside 'a'
}

// Reading and writing take O(n log n) in the number of tensors: 30000 tensors took over 20 s when
// the final sort looked each tensor's offset up by linear search (and writing was quadratic too).
TEST(TensorFile, ThirtyThousandTensorsRoundTripInOffsetOrder) {
  constexpr int kTensors = 30000;
  TensorFile file;
  for (int i = 0; i < kTensors; ++i) {
    // Names in the reverse of file order, so that name order (the JSON object's) is not offset order.
    HostTensor t{fmt::format("layer.{:05}", kTensors - 1 - i), "I32", {i % 3}, {}};
    t.data.resize(t.bytes());
    for (size_t b = 0; b < t.data.size(); ++b) t.data[b] = static_cast<unsigned char>(i + b);
    file.tensors.push_back(std::move(t));
  }
  const TensorFile back = cli::parse_safetensors(cli::format_safetensors(file));
  ASSERT_EQ(back.tensors.size(), file.tensors.size());
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    ASSERT_EQ(back.tensors[i].name, file.tensors[i].name) << i;
    ASSERT_EQ(back.tensors[i].data, file.tensors[i].data) << i;
  }
}

TEST(TensorFile, AtomicWriteLeavesNothingBehindOnFailure) {
  TempDir dir;
  const std::string target = dir / "x.npy";
  cli::write_file_atomically(target, "first");
  cli::write_file_atomically(target, "second");
  std::ifstream in(target);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "second");
  EXPECT_ROTARY_ERROR(cli::write_file_atomically(dir / "missing-folder/y.npy", "z"), "cannot be written");
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path)) { (void)entry; ++files; }
  EXPECT_EQ(files, 1);  // no temporary left behind
}

TEST(TensorFile, WildcardMatch) {
  EXPECT_TRUE(cli::wildcard_match("model.layers.*.self_attn.q_proj.weight", "model.layers.17.self_attn.q_proj.weight"));
  EXPECT_FALSE(cli::wildcard_match("model.layers.*.self_attn.q_proj.weight", "model.layers.17.self_attn.k_proj.weight"));
  EXPECT_TRUE(cli::wildcard_match("*q_proj*", "a.q_proj.bias"));
  EXPECT_TRUE(cli::wildcard_match("a?c", "abc"));
  EXPECT_FALSE(cli::wildcard_match("a?c", "ac"));
}

TEST(CliFiles, ApplyThenInverseGivesTheInputBack) {
  TempDir dir;
  HostTensor q = tensor("array", "F32", {2, 5, 4, 64}, 9);
  write_bytes(dir / "q.npy", cli::format_npy(q));
  HostTensor k = tensor("array", "F32", {2, 5, 2, 64}, 10);
  write_bytes(dir / "k.npy", cli::format_npy(k));
  ASSERT_EQ(run({"apply", "--preset", "llama-3-8b", "--q", dir / "q.npy", "--k", dir / "k.npy", "--offset", "1000",
                 "--out", dir / "q_rot.npy", "--k-out", dir / "k_rot.npy", "--head-dim", "64"}).status, 2);  // spec + preset
  RunResult r = run({"apply", "--head-dim", "64", "--base", "500000", "--q", dir / "q.npy", "--k", dir / "k.npy",
               "--offset", "1000", "--out", dir / "q_rot.npy", "--k-out", dir / "k_rot.npy"});
  ASSERT_EQ(r.status, 0) << r.err;
  const HostTensor rotated = cli::read_tensor_file(dir / "q_rot.npy").tensors[0];
  EXPECT_NE(rotated.data, q.data);
  r = run({"apply", "--head-dim", "64", "--base", "500000", "--q", dir / "q_rot.npy", "--offset", "1000", "--inverse",
           "--out", dir / "q_back.npy"});
  ASSERT_EQ(r.status, 0) << r.err;
  expect_round_trip(q, cli::read_tensor_file(dir / "q_back.npy").tensors[0]);
  // Per-token positions from a file, and hf-float32 angles, and a safetensors container.
  HostTensor pos{"array", "I64", {5}, std::vector<unsigned char>(40)};
  for (int64_t i = 0; i < 5; ++i) { const int64_t v = 7 * i + 3; std::memcpy(&pos.data[static_cast<size_t>(i * 8)], &v, 8); }
  write_bytes(dir / "pos.npy", cli::format_npy(pos));
  TensorFile st;
  st.tensors = {tensor("q", "F32", {1, 5, 4, 64}, 11), tensor("ids", "I64", {3}, 12)};
  write_bytes(dir / "in.safetensors", cli::format_safetensors(st));
  r = run({"apply", "--preset", "llama-3.2-1b", "--q", dir / "in.safetensors", "--tensor", "q", "--positions",
           dir / "pos.npy", "--angles", "hf-float32", "--out", dir / "out.safetensors"});
  ASSERT_EQ(r.status, 0) << r.err;
  const TensorFile out = cli::read_tensor_file(dir / "out.safetensors");
  ASSERT_EQ(out.tensors.size(), 2u);
  EXPECT_EQ(out.tensors[1].data, st.tensors[1].data);  // untouched tensor, same bits
  EXPECT_NE(out.tensors[0].data, st.tensors[0].data);
}

// --order (the tensors' dimension order) and --numerics (how angles are computed) are the names;
// --layout and --angles, their old names, still work for one release: the same bits, a note on
// stderr after the run, and an error (one line, naming the new name) when the two disagree.
TEST(CliFiles, OrderAndNumericsAreTheNamesAndTheOldOnesStillWork) {
  TempDir dir;
  write_bytes(dir / "q.npy", cli::format_npy(tensor("array", "F32", {2, 5, 5, 64}, 13)));  // seq 5 either way
  HostTensor pos{"array", "I64", {5}, std::vector<unsigned char>(40)};
  for (int64_t i = 0; i < 5; ++i) { const int64_t v = 90000 + 11 * i; std::memcpy(&pos.data[static_cast<size_t>(i * 8)], &v, 8); }
  write_bytes(dir / "pos.npy", cli::format_npy(pos));
  const std::vector<std::string> base = {"apply", "--head-dim", "64", "--base", "500000", "--q", dir / "q.npy",
                                         "--positions", dir / "pos.npy"};
  const auto with = [&](std::vector<std::string> extra, const std::string& out) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--out", dir / out});
    return run(args);
  };
  RunResult r = with({"--order", "bhsd", "--numerics", "hf-float32"}, "new.npy");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  r = with({"--layout", "bhsd", "--angles", "hf-float32"}, "old.npy");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("--layout is the old name of --order"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--angles is the old name of --numerics"), std::string::npos) << r.err;
  r = with({"--order", "bshd", "--numerics", "exact"}, "other.npy");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string renamed = read_bytes(dir / "new.npy");
  EXPECT_EQ(renamed, read_bytes(dir / "old.npy"));
  EXPECT_NE(renamed, read_bytes(dir / "other.npy"));  // the options took effect
  // Both spellings, agreeing: taken; disagreeing: refused, nothing written.
  r = with({"--order", "bhsd", "--layout", "bhsd"}, "both.npy");
  EXPECT_EQ(r.status, 0) << r.err;
  expect_user_error(with({"--order", "bshd", "--layout", "bhsd"}, "bad.npy"),
                    "--order='bshd' and --layout='bhsd' (its old name) disagree (give --order)");
  expect_user_error(with({"--numerics", "exact", "--angles", "hf-float32"}, "bad.npy"),
                    "--numerics='exact' and --angles='hf-float32' (its old name) disagree (give --numerics)");
  EXPECT_FALSE(fs::exists(dir / "bad.npy"));
  // Messages name the spelling given.
  expect_user_error(with({"--order", "sbhd"}, "bad.npy"), "--order='sbhd' must be bshd or bhsd");
  expect_user_error(with({"--layout", "sbhd"}, "bad.npy"), "--layout='sbhd' must be bshd or bhsd");
  expect_user_error(with({"--numerics", "float"}, "bad.npy"), "--numerics='float' must be exact or hf-float32");
  // table takes --numerics too.
  const RunResult t_new = run({"table", "--head-dim", "8", "--positions", "3,70000", "--numerics", "hf-float32"});
  const RunResult t_old = run({"table", "--head-dim", "8", "--positions", "3,70000", "--angles", "hf-float32"});
  const RunResult t_exact = run({"table", "--head-dim", "8", "--positions", "3,70000"});
  ASSERT_EQ(t_new.status, 0) << t_new.err;
  ASSERT_EQ(t_old.status, 0) << t_old.err;
  EXPECT_EQ(t_new.out, t_old.out);
  EXPECT_NE(t_new.out, t_exact.out);
  EXPECT_TRUE(t_new.err.empty()) << t_new.err;
  EXPECT_NE(t_old.err.find("--angles is the old name of --numerics"), std::string::npos) << t_old.err;
}

// A model whose code turns pairs by -angle (NanoChat): `apply --config` rotates as the model does,
// i.e. as rotary's inverse with the same frequencies; --inverse undoes it.
TEST(CliFiles, ApplyWithAConfigRotatesTheWayTheModelDoes) {
  TempDir dir;
  write_bytes(dir / "config.json", R"({"model_type": "nanochat", "hidden_size": 128, "num_attention_heads": 2,
                                       "max_position_embeddings": 2048})");
  const HostTensor q = tensor("array", "F32", {1, 3, 2, 64}, 21);
  write_bytes(dir / "q.npy", cli::format_npy(q));
  RunResult r = run({"apply", "--config", dir / "config.json", "--q", dir / "q.npy", "--offset", "77",
                     "--out", dir / "model.npy"});
  ASSERT_EQ(r.status, 0) << r.err;
  r = run({"apply", "--head-dim", "64", "--q", dir / "q.npy", "--offset", "77", "--inverse",
           "--out", dir / "plain_inverse.npy"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_bytes(dir / "model.npy"), read_bytes(dir / "plain_inverse.npy"));
  r = run({"apply", "--config", dir / "config.json", "--q", dir / "model.npy", "--offset", "77", "--inverse",
           "--out", dir / "back.npy"});
  ASSERT_EQ(r.status, 0) << r.err;
  expect_round_trip(q, cli::read_tensor_file(dir / "back.npy").tensors[0]);
}

TEST(CliFiles, ErrorsExitTwoAndWriteNothing) {
  TempDir dir;
  write_bytes(dir / "q.npy", cli::format_npy(tensor("array", "F32", {1, 3, 2, 8}, 1)));
  write_bytes(dir / "bad.npy", "not a numpy file");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"apply", "--head-dim", "8", "--q", dir / "q.npy", "--out", dir / "q.npy"}, "is also an input"},
      {{"apply", "--head-dim", "8", "--q", dir / "bad.npy", "--out", dir / "o.npy"}, ".npy magic is missing"},
      {{"apply", "--head-dim", "16", "--q", dir / "q.npy", "--out", dir / "o.npy"}, "q.head_dim=8 differs"},
      {{"apply", "--head-dim", "8", "--q", dir / "q.npy", "--layout", "sbhd", "--out", dir / "o.npy"}, "--layout='sbhd'"},
      {{"apply", "--head-dim", "8", "--q", dir / "q.npy", "--offset", "-4", "--out", dir / "o.npy"}, "offset=-4"},
      {{"apply", "--head-dim", "8", "--q", dir / "missing.npy", "--out", dir / "o.npy"}, "cannot be read"},
      {{"apply", "--head-dim", "8", "--q", dir / "q.npy", "--out", dir / "o.txt"}, "must end in .npy or .safetensors"},
      {{"convert-weights", "--in", dir / "q.npy", "--out", dir / "o.safetensors", "--to", "half", "--num-heads", "2",
        "--num-kv-heads", "1", "--q-name", "q", "--k-name", "k"}, "must be a .safetensors file"},
  };
  for (const auto& [args, needle] : cases) {
    const RunResult r = run(args);
    EXPECT_EQ(r.status, 2) << needle;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  }
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path)) { (void)entry; ++files; }
  EXPECT_EQ(files, 2);  // q.npy and bad.npy only
}

double dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * b[i];
  return s;
}

TEST(CliFiles, ConvertWeightsRoundTripAndEqualScoresWithGqa) {
  TempDir dir;
  const int64_t hq = 32, hk = 8, d = 16, hidden = 24, seq = 4;
  TensorFile model;
  model.metadata = {{"format", "pt"}};
  model.tensors = {tensor("layers.0.q_proj.weight", "F32", {hq * d, hidden}, 1),
                   tensor("layers.0.k_proj.weight", "F32", {hk * d, hidden}, 2),
                   tensor("layers.0.v_proj.weight", "F32", {hk * d, hidden}, 3),
                   tensor("layers.0.q_proj.bias", "F32", {hq * d}, 4)};
  write_bytes(dir / "meta.safetensors", cli::format_safetensors(model));
  RunResult r = run({"convert-weights", "--in", dir / "meta.safetensors", "--out", dir / "hf.safetensors", "--to", "half",
               "--num-heads", "32", "--num-kv-heads", "8", "--q-name", "*.q_proj.*", "--k-name", "*.k_proj.weight"});
  ASSERT_EQ(r.status, 0) << r.err;
  r = run({"convert-weights", "--in", dir / "hf.safetensors", "--out", dir / "back.safetensors", "--to", "interleaved",
           "--num-heads", "32", "--num-kv-heads", "8", "--q-name", "*.q_proj.*", "--k-name", "*.k_proj.weight"});
  ASSERT_EQ(r.status, 0) << r.err;
  const TensorFile hf = cli::read_tensor_file(dir / "hf.safetensors");
  const TensorFile back = cli::read_tensor_file(dir / "back.safetensors");
  // The pairing each conversion wrote is recorded, the rest of the metadata kept.
  EXPECT_EQ(hf.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"rotary.pairing", "half"}}));
  EXPECT_EQ(back.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"rotary.pairing", "interleaved"}}));
  for (size_t i = 0; i < model.tensors.size(); ++i) EXPECT_EQ(back.tensors[i].data, model.tensors[i].data) << i;
  EXPECT_EQ(hf.tensors[2].data, model.tensors[2].data);  // v untouched
  EXPECT_NE(hf.tensors[0].data, model.tensors[0].data);
  // Attention scores: interleaved RoPE with the original weights == half RoPE with the converted ones.
  const std::vector<float> x = test::random_floats(static_cast<size_t>(seq * hidden), 5);
  auto scores = [&](const TensorFile& f, Pairing pairing) {
    auto weights = [&](size_t t) { return reinterpret_cast<const float*>(f.tensors[t].data.data()); };
    std::vector<float> q(static_cast<size_t>(seq * hq * d)), k(static_cast<size_t>(seq * hk * d));
    for (int64_t s = 0; s < seq; ++s) {
      for (int64_t row = 0; row < hq * d; ++row) q[s * hq * d + row] = static_cast<float>(dot(weights(0) + row * hidden, &x[s * hidden], hidden));
      for (int64_t row = 0; row < hk * d; ++row) k[s * hk * d + row] = static_cast<float>(dot(weights(1) + row * hidden, &x[s * hidden], hidden));
    }
    const Schedule sch = make_schedule(Spec{.head_dim = d, .pairing = pairing});
    apply(sch, {.q = TensorView::bshd(q.data(), DType::f32, 1, seq, hq, d), .k = TensorView::bshd(k.data(), DType::f32, 1, seq, hk, d),
                .positions = Positions::sequential(5000)});
    std::vector<double> out;
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < seq; ++i)
        for (int64_t j = 0; j < seq; ++j)
          out.push_back(dot(&q[(i * hq + h) * d], &k[(j * hk + h / (hq / hk)) * d], d));
    return out;
  };
  const auto a = scores(model, Pairing::interleaved);
  const auto b = scores(hf, Pairing::half);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4 * (1 + std::fabs(a[i]))) << i;
}


// Loads a .npy or .safetensors tensor and rotates it in memory with the library, for comparison.
std::vector<unsigned char> rotated_in_memory(HostTensor t, const Schedule& schedule, bool bhsd,
                                             const std::vector<int64_t>& token_positions, AngleMode angles) {
  const DType dtype = t.dtype == "F64" ? DType::f64 : DType::f32;
  const auto& s = t.shape;
  const TensorView view = bhsd ? TensorView::bhsd(t.data.data(), dtype, s[0], s[1], s[2], s[3])
                               : TensorView::bshd(t.data.data(), dtype, s[0], s[1], s[2], s[3]);
  std::optional<Table> table;
  if (angles == AngleMode::hf_float32) table = Table::at(schedule, token_positions, angles);
  apply(schedule, ApplyArgs{.q = view, .positions = Positions::per_token(token_positions),
                            .table = table ? &*table : nullptr});
  return t.data;
}

// Inputs larger than a block (4 MiB) are rotated a block at a time; the bits equal one in-memory
// call for every way a tensor is cut: whole tokens (bshd), some heads of one token (bshd, a token
// over 4 MiB), whole planes (bhsd) and part of a plane (bhsd, a [seq, head_dim] plane over 4 MiB),
// with exact and hf-float32 angles and positions shared by the batch rows.
TEST(CliFiles, ApplyInBlocksEqualsOneCallInMemory) {
  TempDir dir;
  struct Case {
    std::string dtype, layout;
    std::vector<int64_t> shape;  // as stored
    std::string angles;
  };
  const std::vector<Case> cases = {{"F32", "bshd", {3, 2100, 8, 64}, "exact"},
                                   {"F64", "bshd", {1, 2, 8200, 64}, "exact"},
                                   {"F32", "bhsd", {2, 5, 700, 64}, "hf-float32"},
                                   {"F32", "bhsd", {2, 1, 17000, 64}, "exact"},
                                   {"F32", "bshd", {2, 17000, 2, 64}, "hf-float32"}};
  const Schedule schedule = make_schedule(Spec{.head_dim = 64, .base = 500000});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.layout + " " + c.dtype + " " + c.angles);
    const HostTensor q = tensor("array", c.dtype, c.shape, 21);
    write_bytes(dir / "q.npy", cli::format_npy(q));
    const int64_t batch = c.shape[0], seq = c.layout == "bshd" ? c.shape[1] : c.shape[2];
    HostTensor pos{"array", "I32", {seq}, std::vector<unsigned char>(static_cast<size_t>(4 * seq))};
    std::vector<int64_t> token_positions;
    std::mt19937 rng(7);
    for (int64_t i = 0; i < seq; ++i) {
      const auto v = static_cast<int32_t>(rng() % 200000);  // repeats, out of order
      std::memcpy(&pos.data[static_cast<size_t>(4 * i)], &v, 4);
    }
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < seq; ++i) {
        int32_t v;
        std::memcpy(&v, &pos.data[static_cast<size_t>(4 * i)], 4);
        token_positions.push_back(v);
      }
    }
    write_bytes(dir / "pos.npy", cli::format_npy(pos));
    const RunResult r = run({"apply", "--head-dim", "64", "--base", "500000", "--q", dir / "q.npy", "--layout",
                             c.layout, "--positions", dir / "pos.npy", "--angles", c.angles, "--out", dir / "out.npy"});
    ASSERT_EQ(r.status, 0) << r.err;
    const HostTensor out = cli::read_tensor_file(dir / "out.npy").tensors.at(0);
    const AngleMode mode = c.angles == "exact" ? AngleMode::exact : AngleMode::hf_float32;
    EXPECT_TRUE(out.data == rotated_in_memory(q, schedule, c.layout == "bhsd", token_positions, mode));
  }
}

TEST(CliFiles, OutputsNamingOneFileOrAnInputAreRefusedInAnySpelling) {
  TempDir dir;
  write_bytes(dir / "q.npy", cli::format_npy(tensor("array", "F32", {1, 3, 2, 8}, 1)));
  write_bytes(dir / "k.npy", cli::format_npy(tensor("array", "F32", {1, 3, 1, 8}, 2)));
  write_bytes(dir / "old.npy", "old");
  fs::create_directory(dir.path / "sub");
  fs::create_symlink(dir.path / "q.npy", dir.path / "link-to-q.npy");
  fs::create_hard_link(dir.path / "old.npy", dir.path / "hard-old.npy");
  write_bytes(dir / "config.npy", R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8})");
  const std::string q = dir / "q.npy", k = dir / "k.npy";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      // Two outputs, one file: a new file spelled twice, a hard link, a folder and back.
      {{"--q", q, "--k", k, "--out", dir / "new.npy", "--k-out", (dir.path / "sub/../new.npy").string()},
       "name the same file"},
      {{"--q", q, "--k", k, "--out", dir / "old.npy", "--k-out", dir / "hard-old.npy"}, "name the same file"},
      // An output that is an input: through a symbolic link, the positions, the config.
      {{"--q", q, "--out", dir / "link-to-q.npy"}, "is also an input (--q="},
      {{"--q", q, "--k", k, "--out", dir / "o.npy", "--k-out", (dir.path / "sub/../k.npy").string()},
       "is also an input (--k="},
      {{"--q", q, "--positions", dir / "old.npy", "--out", dir / "hard-old.npy"}, "is also an input (--positions="},
  };
  for (const auto& [args, needle] : cases) {
    std::vector<std::string> full = {"apply", "--head-dim", "8"};
    full.insert(full.end(), args.begin(), args.end());
    expect_user_error(run(full), needle);
  }
  expect_user_error(run({"apply", "--config", dir / "config.npy", "--q", q, "--out", dir / "config.npy"}),
                    "is also an input (--config=");
  EXPECT_EQ(read_bytes(dir / "old.npy"), "old");
  EXPECT_EQ(files_in(dir.path), 7);  // nothing written: q, k, old, sub, link-to-q, hard-old, config
  // Reading one file as both q and k is fine.
  const RunResult both = run({"apply", "--head-dim", "8", "--q", q, "--k", q, "--out", dir / "a.npy", "--k-out",
                              dir / "b.npy"});
  ASSERT_EQ(both.status, 0) << both.err;
  EXPECT_EQ(read_bytes(dir / "a.npy"), read_bytes(dir / "b.npy"));
}

TEST(CliFiles, OutputsAreAllOrNothing) {
  TempDir dir;
  write_bytes(dir / "q.npy", cli::format_npy(tensor("array", "F32", {1, 3, 2, 8}, 1)));
  write_bytes(dir / "k.npy", cli::format_npy(tensor("array", "F32", {1, 3, 1, 8}, 2)));
  write_bytes(dir / "q_out.npy", "the previous q output");
  fs::create_directory(dir.path / "a-folder");
  // The second output cannot be written (its folder is missing; it is a folder): the first,
  // which exists, keeps its content, and no temporary file is left.
  const std::pair<std::string, std::string> cases[] = {
      {dir / "missing/k_out.npy", "--k-out='" + dir / "missing/k_out.npy" + "' cannot be written"},
      {dir / "a-folder", "--k-out '" + dir / "a-folder" + "' must end in .npy"}};
  for (const auto& [k_out, needle] : cases) {
    const RunResult r = run({"apply", "--head-dim", "8", "--q", dir / "q.npy", "--k", dir / "k.npy", "--out",
                             dir / "q_out.npy", "--k-out", k_out});
    expect_user_error(r, needle);
    EXPECT_EQ(read_bytes(dir / "q_out.npy"), "the previous q output");
    EXPECT_EQ(files_in(dir.path), 4);
  }
}

TEST(CliFiles, ReplacedOutputKeepsItsPermissionBits) {
  TempDir dir;
  write_bytes(dir / "q.npy", cli::format_npy(tensor("array", "F32", {1, 3, 2, 8}, 1)));
  write_bytes(dir / "shared.npy", "old");
  fs::permissions(dir.path / "shared.npy", fs::perms(0640));
  const mode_t old_mask = ::umask(022);
  const RunResult a = run({"apply", "--head-dim", "8", "--q", dir / "q.npy", "--out", dir / "shared.npy"});
  const RunResult b = run({"apply", "--head-dim", "8", "--q", dir / "q.npy", "--out", dir / "new.npy"});
  ::umask(old_mask);
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_NE(read_bytes(dir / "shared.npy"), "old");
  EXPECT_EQ(fs::status(dir.path / "shared.npy").permissions(), fs::perms(0640));
  EXPECT_EQ(fs::status(dir.path / "new.npy").permissions(), fs::perms(0644));  // 0666 less the umask
}

// The setuid, setgid and sticky bits were dropped (mode & 0777).
TEST(CliFiles, ReplacedOutputKeepsItsSpecialModeBits) {
  TempDir dir;
  write_bytes(dir / "q.npy", cli::format_npy(tensor("array", "F32", {1, 3, 2, 8}, 1)));
  for (const auto mode : {fs::perms(02755), fs::perms(04700), fs::perms(01644)}) {
    write_bytes(dir / "perm.npy", "old");
    fs::permissions(dir.path / "perm.npy", mode);
    const RunResult r = run({"apply", "--head-dim", "8", "--q", dir / "q.npy", "--out", dir / "perm.npy"});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(read_bytes(dir / "perm.npy"), "old");
    EXPECT_EQ(fs::status(dir.path / "perm.npy").permissions(), mode) << std::oct << static_cast<int>(mode);
  }
}

// An output that is a symbolic link was replaced by a regular file, its target left as it was.
TEST(CliFiles, OutputThroughASymbolicLinkWritesWhereItLeads) {
  TempDir dir;
  const std::string q = dir / "q.npy";
  write_bytes(q, cli::format_npy(tensor("array", "F32", {1, 3, 2, 8}, 1)));
  ASSERT_EQ(run({"apply", "--head-dim", "8", "--q", q, "--out", dir / "expected.npy"}).status, 0);
  const std::string expected = read_bytes(dir / "expected.npy");
  fs::create_directory(dir.path / "sub");
  fs::permissions(dir.path / "sub", fs::perms(0750));
  write_bytes(dir / "sub/target.npy", "old");
  fs::permissions(dir.path / "sub/target.npy", fs::perms(0640));
  fs::create_symlink("sub/target.npy", dir.path / "link.npy");          // existing target, relative
  fs::create_symlink("../link.npy", dir.path / "sub/chain.npy");        // a chain of two
  fs::create_symlink("sub/new.npy", dir.path / "dangling.npy");         // a file still to create
  fs::create_symlink("loop-b.npy", dir.path / "loop-a.npy");
  fs::create_symlink("loop-a.npy", dir.path / "loop-b.npy");
  for (const std::string& link : {dir / "link.npy", dir / "sub/chain.npy"}) {
    write_bytes(dir / "sub/target.npy", "old");
    const RunResult r = run({"apply", "--head-dim", "8", "--q", q, "--out", link});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(fs::is_symlink(link)) << link;
    EXPECT_EQ(read_bytes(dir / "sub/target.npy"), expected) << link;
    EXPECT_EQ(fs::status(dir.path / "sub/target.npy").permissions(), fs::perms(0640)) << link;
  }
  const RunResult r = run({"apply", "--head-dim", "8", "--q", q, "--out", dir / "dangling.npy"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(dir.path / "dangling.npy"));
  EXPECT_EQ(read_bytes(dir / "sub/new.npy"), expected);
  expect_user_error(run({"apply", "--head-dim", "8", "--q", q, "--out", dir / "loop-a.npy"}),
                    "--out='" + dir / "loop-a.npy" + "' is a symbolic link that cannot be followed");
  EXPECT_EQ(files_in(dir.path), 7);  // q, expected, sub, link, dangling, loop-a, loop-b: no temporary left
  EXPECT_EQ(files_in(dir.path / "sub"), 3);  // target, chain, new
}

// A dangling symbolic link and the file it would create were compared by name only: both were
// written, and the second rename replaced the link by a regular file.
TEST(CliFiles, DanglingLinkAndTheFileItLeadsToAreOneOutput) {
  TempDir dir;
  write_bytes(dir / "q.npy", cli::format_npy(tensor("array", "F32", {1, 3, 2, 8}, 1)));
  write_bytes(dir / "k.npy", cli::format_npy(tensor("array", "F32", {1, 3, 1, 8}, 2)));
  fs::create_directory(dir.path / "sub");
  fs::create_symlink("sub/../newt.npy", dir.path / "dang.npy");
  const RunResult r = run({"apply", "--head-dim", "8", "--q", dir / "q.npy", "--k", dir / "k.npy", "--out",
                           dir / "dang.npy", "--k-out", dir / "newt.npy"});
  expect_user_error(r, "--out='" + dir / "dang.npy" + "' and --k-out='" + dir / "newt.npy" + "' name the same file");
  EXPECT_TRUE(fs::is_symlink(dir.path / "dang.npy"));
  EXPECT_EQ(files_in(dir.path), 4);  // q, k, sub, dang: nothing written
}

// A failed write named the input and tensor being rotated, never the output option.
TEST(CliFiles, WriteErrorsNameTheOutputOption) {
  TempDir dir;
  write_bytes(dir / "q.npy", cli::format_npy(tensor("array", "F32", {1, 3, 2, 8}, 1)));     // 320 bytes
  write_bytes(dir / "k.npy", cli::format_npy(tensor("array", "F32", {1, 64, 1, 8}, 2)));    // 2176 bytes
  write_bytes(dir / "not-a-folder.npy", "x");
  const std::vector<std::string> args = {"apply", "--head-dim", "8", "--q", dir / "q.npy", "--k", dir / "k.npy",
                                         "--out", dir / "q_out.npy", "--k-out"};
  // A file limit of 1 KiB: the first output fits, the second fails part way through its tensor.
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 1024;
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::vector<std::string> full = args;
  full.push_back(dir / "k_out.npy");
  const RunResult too_large = run(full);
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  expect_user_error(too_large, "rotary: error: --k-out='" + dir / "k_out.npy" + "' could not be written: ");
  EXPECT_EQ(too_large.err.find("tensor"), std::string::npos) << too_large.err;
  // A folder that is a file: the temporary cannot be created.
  full.back() = dir / "not-a-folder.npy/k_out.npy";
  expect_user_error(run(full), "rotary: error: --k-out='" + full.back() + "' cannot be written (folder missing");
  EXPECT_EQ(files_in(dir.path), 3);  // q, k, not-a-folder: no output, no temporary
}

TEST(CliFiles, PositionsFileIsCheckedAndNamed) {
  TempDir dir;
  write_bytes(dir / "q.npy", cli::format_npy(tensor("array", "F32", {2, 3, 2, 8}, 1)));
  auto positions = [&](const std::string& name, const std::string& dtype, std::vector<int64_t> values) {
    HostTensor t{"array", dtype, {static_cast<int64_t>(values.size())}, {}};
    for (int64_t v : values) {
      if (dtype == "I32") {
        const auto v32 = static_cast<int32_t>(v);
        t.data.insert(t.data.end(), reinterpret_cast<const unsigned char*>(&v32), reinterpret_cast<const unsigned char*>(&v32) + 4);
      } else {
        t.data.insert(t.data.end(), reinterpret_cast<const unsigned char*>(&v), reinterpret_cast<const unsigned char*>(&v) + 8);
      }
    }
    write_bytes(dir / name, cli::format_npy(t));
    return dir / name;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      // An empty file used to mean sequential positions, silently.
      {positions("empty.npy", "I64", {}), "--positions '" + dir / "empty.npy" + "' has no entries"},
      {positions("negative.npy", "I32", {0, 1, -2}),
       "--positions '" + dir / "negative.npy" + "': positions[2]=-2 must be in [0, 2^31)"},
      {positions("large.npy", "I64", {0, int64_t{1} << 31, 2, 3, 4, 5}), "positions[1]=2147483648 must be in [0, 2^31)"},
      {positions("five.npy", "I64", {0, 1, 2, 3, 4}), "has 5 entries; the tensor needs batch*seq=6 or seq=3"},
      {dir / "q.npy", "has 4 dimensions; positions are [streams, batch, seq], [batch, seq] or [seq]"},
  };
  for (const auto& [file, needle] : cases) {
    expect_user_error(run({"apply", "--head-dim", "8", "--q", dir / "q.npy", "--positions", file, "--out", dir / "o.npy"}),
                      needle);
  }
  EXPECT_FALSE(fs::exists(dir.path / "o.npy"));
}

// A positions file of any shape or kind: every stream count, dtype and value checked before a write.
TEST(CliFiles, StreamAndFloatPositionsAreCheckedAndNamed) {
  TempDir dir;
  write_bytes(dir / "q.npy", cli::format_npy(tensor("array", "F32", {2, 3, 2, 128}, 1)));
  auto positions = [&](const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                       std::vector<double> values) {
    HostTensor t{"array", dtype, std::move(shape), {}};
    for (const double v : values) {
      const auto f = static_cast<float>(v);
      const auto i = static_cast<int64_t>(v);
      const unsigned char* bytes = dtype == "F32" ? reinterpret_cast<const unsigned char*>(&f)
                                   : dtype == "F64" ? reinterpret_cast<const unsigned char*>(&v)
                                                    : reinterpret_cast<const unsigned char*>(&i);
      t.data.insert(t.data.end(), bytes, bytes + cli::dtype_size(dtype));
    }
    write_bytes(dir / name, cli::format_npy(t));
    return dir / name;
  };
  const std::vector<double> six(6, 1.0), nine(9, 1.0);
  std::vector<double> negative(9, 1.0), nan(9, 1.0), fraction(9, 1.0);
  negative[4] = -0.25;
  nan[8] = std::nan("");
  fraction[2] = 2.5;
  const std::vector<std::string> mrope = {"apply", "--head-dim", "128", "--stream-layout", "sections", "--sections",
                                          "16,24,24"};
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--positions", positions("two.npy", "I64", {2, 1, 3}, six)},
       "--positions '" + dir / "two.npy" + "' has 2 streams but the schedule reads 3 (give 3 or 1"},
      {{"--positions", positions("nine.npy", "I64", {9, 1, 1}, nine)}, "has 9 streams (its first dimension); at most 8"},
      {{"--positions", positions("four.npy", "I32", {3, 1, 1, 3}, nine)}, "has 4 dimensions"},
      {{"--positions", positions("neg.npy", "F32", {3, 1, 3}, negative)}, "positions[1][1]=-0.25 must be in [0, 2^31)"},
      {{"--positions", positions("nan.npy", "F64", {3, 1, 3}, nan)}, "positions[2][2]=nan must be in [0, 2^31)"},
      {{"--positions", positions("short.npy", "F64", {3, 1, 2}, six)},
       "has 2 entries per stream; the tensor needs batch*seq=6 or seq=3"},
      {{"--positions", positions("frac.npy", "F64", {3, 1, 3}, fraction), "--angles", "hf-float32"},
       "holds fractional positions; --angles=hf-float32 needs whole ones"},
  };
  for (const auto& [extra, needle] : cases) {
    std::vector<std::string> args = mrope;
    args.insert(args.end(), {"--q", dir / "q.npy", "--out", dir / "o.npy"});
    args.insert(args.end(), extra.begin(), extra.end());
    expect_user_error(run(args), needle);
  }
  HostTensor f16{"array", "F16", {3}, std::vector<unsigned char>(6)};
  write_bytes(dir / "f16.npy", cli::format_npy(f16));
  expect_user_error(run({"apply", "--head-dim", "128", "--q", dir / "q.npy", "--positions", dir / "f16.npy", "--out",
                         dir / "o.npy"}),
                    "must be int32, int64, float32 or float64, not F16");
  EXPECT_FALSE(fs::exists(dir.path / "o.npy"));
}

// M-RoPE through the CLI: [3, batch, seq] and [3, 1, seq] positions (int64, whole float32,
// fractional float64) give exactly what one library call gives.
TEST(CliFiles, ApplyMropePositionsEqualsTheLibrary) {
  TempDir dir;
  const Spec spec{.head_dim = 128, .base = 1000000, .stream_layout = StreamLayout::sections, .sections = {16, 24, 24}};
  const Schedule schedule = make_schedule(spec);
  const HostTensor q = tensor("array", "F32", {2, 5, 3, 128}, 4);
  write_bytes(dir / "q.npy", cli::format_npy(q));
  struct Case {
    std::string dtype;
    int64_t rows;  // batch rows in the file: 2, or 1 broadcast
    bool fractional;
  };
  for (const Case& c : {Case{"I64", 2, false}, Case{"F32", 1, false}, Case{"F64", 2, true}, Case{"I32", 1, false}}) {
    SCOPED_TRACE(c.dtype + " rows " + std::to_string(c.rows));
    std::mt19937 rng(11);
    std::vector<double> values;
    for (int64_t i = 0; i < 3 * c.rows * 5; ++i) {
      values.push_back(static_cast<double>(rng() % 100000) + (c.fractional ? 0.375 : 0.0));
    }
    HostTensor pos{"array", c.dtype, {3, c.rows, 5}, {}};
    for (const double v : values) {
      const auto f = static_cast<float>(v);
      const auto i64 = static_cast<int64_t>(v);
      const auto i32 = static_cast<int32_t>(v);
      const unsigned char* bytes = c.dtype == "F32" ? reinterpret_cast<const unsigned char*>(&f)
                                   : c.dtype == "F64" ? reinterpret_cast<const unsigned char*>(&v)
                                   : c.dtype == "I64" ? reinterpret_cast<const unsigned char*>(&i64)
                                                      : reinterpret_cast<const unsigned char*>(&i32);
      pos.data.insert(pos.data.end(), bytes, bytes + cli::dtype_size(c.dtype));
    }
    write_bytes(dir / "pos.npy", cli::format_npy(pos));
    const RunResult r = run({"apply", "--head-dim", "128", "--base", "1000000", "--stream-layout", "sections",
                             "--sections", "16,24,24", "--q", dir / "q.npy", "--positions", dir / "pos.npy", "--out",
                             dir / "out.npy"});
    ASSERT_EQ(r.status, 0) << r.err;
    HostTensor want = q;
    const TensorView view = TensorView::bshd(want.data.data(), DType::f32, 2, 5, 3, 128);
    std::vector<int64_t> whole(values.begin(), values.end());
    const Positions p = c.fractional ? Positions::per_token(std::span<const double>(values), 3)
                                     : Positions::per_token(std::span<const int64_t>(whole), 3);
    apply(schedule, ApplyArgs{.q = view, .positions = p});
    EXPECT_TRUE(cli::read_tensor_file(dir / "out.npy").tensors.at(0).data == want.data);
  }
}

// Positions by shape, not count: every undocumented shape holding batch*seq entries is refused,
// where it used to rotate tokens at other tokens' positions.
TEST(CliFiles, PositionsAreCheckedByShape) {
  TempDir dir;
  const HostTensor q = tensor("array", "F32", {2, 3, 2, 8}, 1);  // batch 2, seq 3
  write_bytes(dir / "q.npy", cli::format_npy(q));
  auto positions = [&](const std::string& name, std::vector<int64_t> shape) {
    HostTensor t{"array", "I64", shape, {}};
    int64_t n = 1;
    for (const int64_t e : shape) n *= e;
    for (int64_t v = 0; v < n; ++v) {
      const int64_t value = 100 + 7 * v;
      t.data.insert(t.data.end(), reinterpret_cast<const unsigned char*>(&value),
                    reinterpret_cast<const unsigned char*>(&value) + 8);
    }
    write_bytes(dir / name, cli::format_npy(t));
    return dir / name;
  };
  const std::vector<std::pair<std::string, std::string>> refused = {
      {positions("transposed.npy", {3, 2}), "has shape [3, 2]; the tensor needs [batch=2, seq=3] or [1, seq=3] (or "
                                            "[seq=3]): it looks transposed"},
      {positions("column.npy", {6, 1}), "has shape [6, 1]"},
      {positions("row.npy", {1, 6}), "has shape [1, 6]"},
      {positions("flat.npy", {6}), "has shape [6]"},
  };
  for (const auto& [file, needle] : refused) {
    expect_user_error(run({"apply", "--head-dim", "8", "--q", dir / "q.npy", "--positions", file, "--out",
                           dir / "o.npy"}), needle);
  }
  // M-RoPE's [S, seq, batch] is refused the same way.
  expect_user_error(run({"apply", "--head-dim", "8", "--stream-layout", "sections", "--sections", "1,1,2", "--q",
                         dir / "q.npy", "--positions", positions("mrope.npy", {3, 3, 2}), "--out", dir / "o.npy"}),
                    "has shape [3, 3, 2]; the tensor needs [3, batch=2, seq=3] or [3, 1, seq=3]");
  // Three streams given to a one-stream schedule (the message once said "give 1 or 1").
  expect_user_error(run({"apply", "--head-dim", "8", "--q", dir / "q.npy", "--positions",
                         positions("three.npy", {3, 1, 3}), "--out", dir / "o.npy"}),
                    "has 3 streams but the schedule reads 1 (give [batch, seq] or [seq])");
  EXPECT_FALSE(fs::exists(dir.path / "o.npy"));
  // The documented shapes rotate as the library does with the same positions.
  const Schedule s = make_schedule(Spec{.head_dim = 8});
  for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"batch_seq.npy", {2, 3}}, {"one_seq.npy", {1, 3}}, {"seq.npy", {3}}}) {
    const std::string file = positions(name, shape);
    const RunResult r = run({"apply", "--head-dim", "8", "--q", dir / "q.npy", "--positions", file, "--out",
                             dir / ("out_" + name)});
    ASSERT_EQ(r.status, 0) << r.err;
    HostTensor want = q;
    std::vector<int64_t> values;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t t = 0; t < 3; ++t) values.push_back(100 + 7 * (shape.size() == 2 && shape[0] == 2 ? b * 3 + t : t));
    }
    apply(s, ApplyArgs{.q = TensorView::bshd(want.data.data(), DType::f32, 2, 3, 2, 8),
                       .positions = Positions::per_token(values)});
    EXPECT_EQ(cli::read_tensor_file(dir / ("out_" + name)).tensors.at(0).data, want.data) << name;
  }
}

// xPos through the CLI: --k holds keys, scaled by ζ^-(p-c)/γ (it was rotated as a query, losing xPos's
// decay in q.k), and keys alone are a form of their own: --k with --k-out and no --q.
TEST(CliFiles, KeysAreRotatedAsKeys) {
  TempDir dir;
  const HostTensor q = tensor("array", "F32", {1, 4, 2, 64}, 31), k = tensor("array", "F32", {1, 4, 1, 64}, 32);
  write_bytes(dir / "q.npy", cli::format_npy(q));
  write_bytes(dir / "k.npy", cli::format_npy(k));
  const std::vector<std::string> spec = {"--head-dim", "64", "--xpos-scale-base", "512", "--xpos-center", "100",
                                         "--offset", "2000"};
  auto with_spec = [&](std::vector<std::string> args) {
    args.insert(args.begin() + 1, spec.begin(), spec.end());
    return run(args);
  };
  RunResult r = with_spec({"apply", "--q", dir / "q.npy", "--k", dir / "k.npy", "--out", dir / "q_rot.npy", "--k-out",
                           dir / "k_rot.npy"});
  ASSERT_EQ(r.status, 0) << r.err;
  r = with_spec({"apply", "--k", dir / "k.npy", "--k-out", dir / "k_alone.npy"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + dir / "k_alone.npy"), std::string::npos) << r.out;
  // The library's q and k in one call.
  const Schedule s = make_schedule(Spec{.head_dim = 64, .xpos_scale_base = 512, .xpos_center = 100});
  HostTensor wq = q, wk = k;
  apply(s, ApplyArgs{.q = TensorView::bshd(wq.data.data(), DType::f32, 1, 4, 2, 64),
                     .k = TensorView::bshd(wk.data.data(), DType::f32, 1, 4, 1, 64),
                     .positions = Positions::sequential(2000)});
  EXPECT_EQ(cli::read_tensor_file(dir / "q_rot.npy").tensors.at(0).data, wq.data);
  EXPECT_EQ(cli::read_tensor_file(dir / "k_rot.npy").tensors.at(0).data, wk.data);
  EXPECT_EQ(cli::read_tensor_file(dir / "k_alone.npy").tensors.at(0).data, wk.data);
  expect_user_error(with_spec({"apply", "--out", dir / "o.npy"}), "--q is required (or --k with --k-out: keys alone)");
  expect_user_error(with_spec({"apply", "--k", dir / "k.npy", "--k-out", dir / "o.npy", "--out", dir / "p.npy"}),
                    "--out is set but --q is not");
}

// --undo takes a forward rotation back (the attention factor and xPos's scale divided out);
// --inverse is the transpose and, with a factor, does not.
TEST(CliFiles, UndoTakesBackForwardWhereInverseDoesNot) {
  TempDir dir;
  const HostTensor k = tensor("array", "F32", {1, 3, 2, 64}, 41);
  write_bytes(dir / "k.npy", cli::format_npy(k));
  const std::vector<std::string> spec = {"--head-dim", "64", "--schedule", "yarn", "--factor", "16",
                                         "--original-max-position", "4096", "--xpos-scale-base", "512", "--offset",
                                         "700"};
  auto keys = [&](const std::string& in, const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> args = {"apply", "--k", dir / in, "--k-out", dir / out};
    args.insert(args.end(), spec.begin(), spec.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  };
  ASSERT_EQ(keys("k.npy", "k_rot.npy", {}).status, 0);
  RunResult r = keys("k_rot.npy", "k_back.npy", {"--undo"});
  ASSERT_EQ(r.status, 0) << r.err;
  expect_round_trip(k, cli::read_tensor_file(dir / "k_back.npy").tensors[0]);
  ASSERT_EQ(keys("k_rot.npy", "k_transposed.npy", {"--inverse"}).status, 0);
  EXPECT_NE(read_bytes(dir / "k_transposed.npy"), read_bytes(dir / "k_back.npy"));
  expect_user_error(keys("k_rot.npy", "o.npy", {"--undo", "--inverse"}), "--inverse and --undo cannot both be given");
  expect_user_error(keys("k_rot.npy", "o.npy", {"--undo", "--angles", "hf-float32"}),
                    "--undo with --angles=hf-float32 needs attention_factor 1");
  EXPECT_FALSE(fs::exists(dir.path / "o.npy"));
}

// Options whose value the CLI once ignored or read as their default.
TEST(CliFiles, IgnoredOptionValuesAreErrors) {
  TempDir dir;
  write_bytes(dir / "q.npy", cli::format_npy(tensor("array", "F32", {1, 3, 2, 8}, 1)));
  TensorFile one;
  one.tensors = {tensor("q", "F32", {1, 3, 2, 8}, 2)};
  write_bytes(dir / "one.safetensors", cli::format_safetensors(one));
  const std::string q = dir / "q.npy", o = dir / "o.npy";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"apply", "--head-dim", "8", "--q", q, "--out", o, "--offset", ""}, "--offset='' is empty"},
      {{"apply", "--head-dim", "8", "--q", q, "--out", o, "--threads", ""}, "--threads='' is empty"},
      {{"apply", "--head-dim", "8", "--q", q, "--out", o, "--tensor", "q"},
       "--tensor='q' names a tensor of a .safetensors input, but --q='" + q + "' is a .npy file"},
      {{"apply", "--head-dim", "8", "--q", dir / "one.safetensors", "--out", dir / "o.safetensors", "--tensor", "k"},
       "--tensor='k' is not in --q="},
      {{"doctor", "--head-dim", "8", "--context", ""}, "--context='' is empty"},
      {{"demo", "--seed", "-1"}, "--seed=-1 must be in [0, 2^63)"},
      {{"demo", "--seed", "x"}, "--seed='x' is not an integer"},
  };
  for (const auto& [args, needle] : cases) expect_user_error(run(args), needle);
  EXPECT_FALSE(fs::exists(o));
  EXPECT_FALSE(fs::exists(dir.path / "o.safetensors"));
}

TEST(CliFiles, BadInputNamesTheOptionInOneLine) {
  TempDir dir;
  write_bytes(dir / "q.npy", cli::format_npy(tensor("array", "F32", {1, 3, 2, 8}, 1)));
  TensorFile st;
  st.tensors = {tensor(std::string("name\0with\nnul", 13), "I64", {3}, 2)};
  write_bytes(dir / "ids.safetensors", cli::format_safetensors(st));
  fs::create_symlink("/dev/zero", dir.path / "zero.npy");
  const std::string q = dir / "q.npy", o = dir / "o.npy";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"apply", "--head-dim", "8", "--q", q, "--out", o, "--threads", "100000"}, "--threads=100000 must be in [0, 1024]"},
      {{"apply", "--head-dim", "8", "--q", q, "--out", o, "--threads", "-1"}, "--threads=-1 must be in [0, 1024]"},
      {{"bench", "--threads", "1,100000"}, "--threads=100000 must be in [0, 1024]"},
      {{"apply", "--head-dim", "8", "--q", "/missing/q.npy", "--out", o}, "--q '/missing/q.npy' cannot be read"},
      {{"apply", "--head-dim", "8", "--q", dir / "zero.npy", "--out", o}, "is not a regular file and holds more than 64 MiB"},
      {{"apply", "--head-dim", "8", "--q", dir / "ids.safetensors", "--out", o},
       "--q '" + dir / "ids.safetensors" + "' tensor 'name\\x00with\\x0anul': has 1 dimensions"},
      {{"apply", "--head-dim", "8", "--q", q, "--layout", std::string(5000, 'x'), "--out", o}, "--layout='xxxx"},
      {{"apply", "--head-dim", "8", "--q", (dir.path / std::string(3000, 'p')).string() + ".npy", "--out", o},
       "... ("},
      {{"apply", "--head-dim", "16", "--q", q, "--out", o}, "--q '" + q + "' tensor 'array': q.head_dim=8 differs"},
  };
  for (const auto& [args, needle] : cases) {
    const RunResult r = run(args);
    expect_user_error(r, needle);
    EXPECT_LT(r.err.size(), 600u) << r.err.substr(0, 600);
  }
  EXPECT_FALSE(fs::exists(o));
}

// Peak resident memory of `rotary apply` stays near the size of what it rewrites: it used to hold
// about three copies of the file, and over 1 GB of tables for 10^7 positions with hf-float32.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMeasurableMemory = false;  // shadow memory and quarantine make peak RSS meaningless
#else
constexpr bool kMeasurableMemory = true;
#endif

struct ChildRun {
  int status = -1;
  int64_t peak_bytes = 0;
};

// VmHWM of a live process in bytes (0 once it has exited).
int64_t peak_resident_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmHWM:  1234 kB"
  }
  return 0;
}

// Runs the built `rotary` with args (stdout and stderr to /dev/null) and measures its peak
// resident memory. Not wait4's ru_maxrss: a forked child starts with this test's pages and the
// count survives exec. VmHWM of the exec'd image is polled every millisecond until the child
// exits; it only grows, and the peak comes while rotating, not in the last millisecond.
ChildRun run_tool(const std::string& tool, const std::vector<std::string>& args) {
  std::vector<std::string> all = {tool};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls until exec
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(exec_pipe[1]);
  char byte;
  while (::read(exec_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }  // end of file: the child has exec'd (the pipe closes on exec) or exited
  ::close(exec_pipe[0]);
  ChildRun r;
  if (pid < 0) return r;
  for (int status = 0;;) {
    r.peak_bytes = std::max(r.peak_bytes, peak_resident_bytes(pid));
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      return r;
    }
    ::usleep(1000);
  }
}

// A .npy of `shape` (F32) written a few MiB at a time, values a simple pattern.
void write_large_npy(const std::string& path, const std::string& dtype, std::vector<int64_t> shape) {
  HostTensor header{"array", dtype, shape, {}};
  std::ofstream out(path, std::ios::binary);
  out << cli::npy_header(header);
  std::vector<char> chunk(size_t{4} << 20);
  for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>((i * 2654435761u) >> 13);
  for (uint64_t left = header.bytes(); left > 0;) {
    const uint64_t n = std::min<uint64_t>(left, chunk.size());
    out.write(chunk.data(), static_cast<std::streamsize>(n));
    left -= n;
  }
}

TEST(CliMemory, ApplyPeakResidentMemoryStaysNearTheTensorBytes) {
  if (!kMeasurableMemory) GTEST_SKIP() << "peak memory is not measurable under AddressSanitizer";
#ifdef ROTARY_TOOL_PATH
  const char* tool = ROTARY_TOOL_PATH;
#else
  const char* tool = std::getenv("ROTARY_TOOL");
#endif
  if (tool == nullptr) GTEST_SKIP() << "set ROTARY_TOOL to the built rotary binary (or define ROTARY_TOOL_PATH)";
  TempDir dir;
  constexpr int64_t kMiB = int64_t{1} << 20;
  // 96 MiB of q (Llama-3-8B heads), exact angles: the old code peaked near 3 x 96 MiB.
  write_large_npy(dir / "q.npy", "F32", {1, 6144, 32, 128});
  const int64_t q_bytes = int64_t{6144} * 32 * 128 * 4;
  ChildRun r = run_tool(tool, {"apply", "--preset", "llama-3-8b", "--q", dir / "q.npy", "--out", dir / "q_out.npy"});
  ASSERT_EQ(r.status, 0);
  ASSERT_GT(r.peak_bytes, 0);
  EXPECT_EQ(fs::file_size(dir.path / "q_out.npy"), fs::file_size(dir.path / "q.npy"));
  EXPECT_LE(r.peak_bytes, q_bytes * 6 / 5 + 16 * kMiB) << "peak " << r.peak_bytes / kMiB << " MiB";
  std::printf("apply, %lld MiB of q: peak resident memory %.1f MiB\n", static_cast<long long>(q_bytes / kMiB),
              static_cast<double>(r.peak_bytes) / static_cast<double>(kMiB));
  fs::remove(dir.path / "q.npy");
  fs::remove(dir.path / "q_out.npy");
  // 2 x 10^6 tokens at distinct positions, hf-float32 angles: 16 MB of q, 8 MB of positions; the
  // old code held a std::set and a table of every position besides three copies of q (~250 MB).
  constexpr int64_t kTokens = 2'000'000;
  write_large_npy(dir / "q.npy", "F32", {kTokens, 1, 2});
  {
    HostTensor header{"array", "I32", {kTokens}, {}};
    std::ofstream out(dir / "pos.npy", std::ios::binary);
    out << cli::npy_header(header);
    std::vector<int32_t> chunk(1 << 20);
    for (int64_t first = 0; first < kTokens; first += static_cast<int64_t>(chunk.size())) {
      const int64_t n = std::min<int64_t>(kTokens - first, static_cast<int64_t>(chunk.size()));
      for (int64_t i = 0; i < n; ++i) chunk[static_cast<size_t>(i)] = static_cast<int32_t>((first + i) * 97 % kTokens);
      out.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(n * 4));
    }
  }
  r = run_tool(tool, {"apply", "--head-dim", "2", "--q", dir / "q.npy", "--positions", dir / "pos.npy", "--angles",
                      "hf-float32", "--out", dir / "q_out.npy"});
  ASSERT_EQ(r.status, 0);
  ASSERT_GT(r.peak_bytes, 0);
  EXPECT_LE(r.peak_bytes, kTokens * 8 * 6 / 5 + 16 * kMiB) << "peak " << r.peak_bytes / kMiB << " MiB";
  std::printf("apply, 2e6 distinct positions, hf-float32: peak resident memory %.1f MiB\n",
              static_cast<double>(r.peak_bytes) / static_cast<double>(kMiB));
}

TEST(CliFiles, ConvertWeightsTakesHeadCountsFromAConfigAndRefusesWrongOnes) {
  TempDir dir;
  const int64_t hq = 32, hk = 8, d = 16, hidden = 24;
  TensorFile model;
  model.tensors = {tensor("layers.0.q_proj.weight", "BF16", {hq * d, hidden}, 1),
                   tensor("layers.0.k_proj.weight", "BF16", {hk * d, hidden}, 2),
                   tensor("layers.0.k_proj.bias", "BF16", {hk * d}, 3)};
  write_bytes(dir / "meta.safetensors", cli::format_safetensors(model));
  write_bytes(dir / "config.json", R"({"model_type": "llama", "hidden_size": 512, "num_attention_heads": 32,
                                        "num_key_value_heads": 8, "head_dim": 16})");
  write_bytes(dir / "config-mha.json", R"({"model_type": "llama", "hidden_size": 512, "num_attention_heads": 32})");
  const std::vector<std::string> names = {"--q-name", "*.q_proj.*", "--k-name", "*.k_proj.*"};
  auto convert = [&](const std::string& in, const std::string& out, const std::string& to,
                     std::vector<std::string> extra) {
    std::vector<std::string> args = {"convert-weights", "--in", dir / in, "--out", dir / out, "--to", to};
    args.insert(args.end(), names.begin(), names.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  };
  RunResult r = convert("meta.safetensors", "by-config.safetensors", "half", {"--config", dir / "config.json"});
  ASSERT_EQ(r.status, 0) << r.err;
  r = convert("meta.safetensors", "by-options.safetensors", "half", {"--num-heads", "32", "--num-kv-heads", "8"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_bytes(dir / "by-config.safetensors"), read_bytes(dir / "by-options.safetensors"));
  EXPECT_EQ(cli::read_tensor_file(dir / "by-config.safetensors").metadata.at("rotary.pairing"), "half");

  // Head counts that do not split the rows as one head_dim for q and k used to permute silently.
  const std::vector<std::pair<std::vector<std::string>, std::string>> wrong = {
      {{"--num-heads", "32", "--num-kv-heads", "4"},
       "tensor 'layers.0.k_proj.weight' has 128 rows, not --num-kv-heads=4 heads x head_dim 16 = 64"},
      {{"--num-heads", "16", "--num-kv-heads", "8"},
       "tensor 'layers.0.k_proj.weight' has 128 rows, not --num-kv-heads=8 heads x head_dim 32 = 256"},
      {{"--num-heads", "32", "--num-kv-heads", "8", "--head-dim", "8"}, "has 512 rows, not --num-heads=32 heads x head_dim 8"},
      {{"--num-heads", "30", "--num-kv-heads", "8"}, "--num-heads=30 is not a multiple of --num-kv-heads=8"},
      {{"--num-heads", "0", "--num-kv-heads", "8"}, "--num-heads=0 must be > 0"},
      {{"--num-heads", "x", "--num-kv-heads", "8"}, "--num-heads='x' is not an integer"},
      {{"--num-kv-heads", "8"}, "--num-heads and --num-kv-heads are required (or --config)"},
      {{"--config", dir / "config-mha.json"}, "has 128 rows, not num_key_value_heads=32 (--config '" + dir / "config-mha.json"},
      {{"--config", dir / "config.json", "--num-heads", "32"}, "--num-heads cannot be combined with --config"},
      {{"--config", dir / "missing.json"}, "--config '" + dir / "missing.json" + "' cannot be read"},
      {{"--num-heads", "32", "--num-kv-heads", "8", "--rotary-dim", "15"}, "--rotary-dim: rotary_dim=15 must be even"},
      // head_dim derived from the rows, not given: the message says so rather than blame --head-dim.
      {{"--num-heads", "5", "--num-kv-heads", "1"},
       "tensor 'layers.0.q_proj.weight' has 512 rows, not a multiple of --num-heads=5: head_dim (rows / heads) "
       "cannot be derived from it (give --head-dim)"},
  };
  for (const auto& [extra, needle] : wrong) {
    expect_user_error(convert("meta.safetensors", "wrong.safetensors", "half", extra), needle);
  }
  EXPECT_FALSE(fs::exists(dir.path / "wrong.safetensors"));

  // Converting a converted file again would scramble q and k: refused unless --force.
  expect_user_error(convert("by-config.safetensors", "twice.safetensors", "half", {"--config", dir / "config.json"}),
                    "is already converted (__metadata__ rotary.pairing=half)");
  EXPECT_FALSE(fs::exists(dir.path / "twice.safetensors"));
  r = convert("by-config.safetensors", "twice.safetensors", "half", {"--config", dir / "config.json", "--force"});
  ASSERT_EQ(r.status, 0) << r.err;
  r = convert("by-config.safetensors", "back.safetensors", "interleaved", {"--config", dir / "config.json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const TensorFile back = cli::read_tensor_file(dir / "back.safetensors");
  EXPECT_EQ(back.metadata.at("rotary.pairing"), "interleaved");
  for (size_t i = 0; i < model.tensors.size(); ++i) EXPECT_EQ(back.tensors[i].data, model.tensors[i].data) << i;
}

// Rows wider than a block (4 MiB per head) are permuted row by row; the result is the same.
TEST(CliFiles, ConvertWeightsPermutesHugeHeadsRowByRow) {
  TempDir dir;
  TensorFile model;
  model.tensors = {tensor("q", "F32", {2 * 8, 70000}, 1), tensor("k", "F32", {8, 70000}, 2)};
  write_bytes(dir / "in.safetensors", cli::format_safetensors(model));
  const RunResult r = run({"convert-weights", "--in", dir / "in.safetensors", "--out", dir / "out.safetensors", "--to",
                           "half", "--num-heads", "2", "--num-kv-heads", "1", "--q-name", "q", "--k-name", "k"});
  ASSERT_EQ(r.status, 0) << r.err;
  const TensorFile out = cli::read_tensor_file(dir / "out.safetensors");
  for (size_t i = 0; i < 2; ++i) {
    const HostTensor& t = model.tensors[i];
    std::vector<unsigned char> expected(t.data.size());
    permute_rows(t.data.data(), expected.data(),
                 PermuteRowsArgs{.num_heads = i == 0 ? 2 : 1, .head_dim = 8, .row_bytes = 70000 * 4});
    EXPECT_TRUE(out.tensors[i].data == expected) << i;
  }
}

}  // namespace
}  // namespace rotary
