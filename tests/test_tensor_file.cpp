// .npy / .safetensors readers and writers, the file commands, and every malformed-file case.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli.hpp"
#include "commands.hpp"
#include "rotary/apply.hpp"
#include "rotary/layout.hpp"
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
RunResult run(std::vector<std::string> args) {
  args.insert(args.begin(), "rotary");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int status = cli::run(static_cast<int>(argv.size()), argv.data(), out, err);
  return {status, out.str(), err.str()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
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
  };
  for (const auto& [bytes, needle] : st_cases) EXPECT_ROTARY_ERROR(cli::parse_safetensors(bytes), needle);
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
  const HostTensor back = cli::read_tensor_file(dir / "q_back.npy").tensors[0];
  for (int64_t i = 0; i < q.elements(); ++i) {
    float a, b;
    std::memcpy(&a, &q.data[static_cast<size_t>(i * 4)], 4);
    std::memcpy(&b, &back.data[static_cast<size_t>(i * 4)], 4);
    ASSERT_NEAR(a, b, 4 * 0x1p-23 * (std::fabs(a) + 4));
  }
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
  EXPECT_EQ(back.metadata, model.metadata);
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

}  // namespace
}  // namespace rotary
