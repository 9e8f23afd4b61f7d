// Each model type's pairing, held against the rotation written out from its cited modeling code.
#include <algorithm>
#include <cmath>
#include <complex>
#include <string>
#include <string_view>
#include <vector>

#include "config/model_types.hpp"
#include "rotary/rotary.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

using detail::find_model_type;
using detail::model_type_table;
using detail::ModelTypeRope;
using detail::RopeFormula;
using Vec = std::vector<double>;

// apply's f32 contract is |result - exact| <= 2^-23 (|a| + |b|) per pair (DESIGN.md §3), at most
// 2^-22 max|x| for any channel of the head; the written-out formulas (double, MPFR cos/sin) are
// exact to ~2^-52. Allowed: twice the contract, in units of max|x|. A wrong pairing misses by O(1).
constexpr double kAgreement = 0x1p-21;
// The same check with the pairing flipped must miss by at least this much (in units of max|x|),
// or it could not tell a wrong entry from a right one.
constexpr double kWrongPairingMiss = 0.05;

// Llama 3 / Qwen3 heads are 128 wide; GLM-4 rotates half of them (partial_rotary_factor 0.5).
constexpr int64_t kHeadDim = 128;
constexpr int64_t kPartialRotaryDim = 64;

std::vector<int64_t> test_positions() {
  return {0, 1, 2, 7, 4097, 131071, int64_t{1} << 20, 1000003, max_position_limit - 1};
}

// ---- the formulas as the modeling code writes them, in double, on one head ----

// cos and sin of the angles p * inv_freq[i], i < r/2 (exact product, MPFR): what the modeling
// code calls freqs.cos() and freqs.sin() before it lays them out.
struct Freqs {
  Vec cos;
  Vec sin;
};

Freqs freqs_at(const Schedule& s, int64_t p) {
  Freqs f;
  for (double inv_freq : s.inv_freq) {
    const test::Exact e = test::mpfr_cos_sin(p, inv_freq, s.attention_factor);
    f.cos.push_back(e.cos);
    f.sin.push_back(e.sin);
  }
  return f;
}

// emb = cat(freqs, freqs): entry j holds freq j % (r/2).
Vec cat_twice(const Vec& half) {
  Vec out(half);
  out.insert(out.end(), half.begin(), half.end());
  return out;
}

// emb = freqs.repeat_interleave(2): entry j holds freq j / 2.
Vec repeat_interleave2(const Vec& v) {
  Vec out;
  for (double value : v) out.insert(out.end(), {value, value});
  return out;
}

// rotate_half = cat(-x2, x1) (Llama), or cat(x2, -x1) (NanoChat).
Vec rotate_half_cat(const Vec& x, bool negated) {
  const size_t h = x.size() / 2;
  Vec out(x.size());
  for (size_t i = 0; i < h; ++i) {
    out[i] = negated ? x[i + h] : -x[i + h];
    out[i + h] = negated ? -x[i] : x[i];
  }
  return out;
}

// stack((-x[1::2], x[::2]), -1).flatten(-2): GPT-J's rotate_every_two, Cohere's and GLM's rotate_half.
Vec rotate_even_odd(const Vec& x) {
  Vec out(x.size());
  for (size_t i = 0; i + 1 < x.size(); i += 2) {
    out[i] = -x[i + 1];
    out[i + 1] = x[i];
  }
  return out;
}

// x * cos + rotated * sin, elementwise.
Vec mul_add(const Vec& x, const Vec& cos, const Vec& rotated, const Vec& sin) {
  Vec out(x.size());
  for (size_t j = 0; j < x.size(); ++j) out[j] = x[j] * cos[j] + rotated[j] * sin[j];
  return out;
}

// (a) Llama: cos/sin = cat(freqs, freqs); x * cos + rotate_half(x) * sin. NanoChat flips rotate_half.
Vec llama_rotate_half(const Vec& x, const Freqs& f, bool negated) {
  return mul_add(x, cat_twice(f.cos), rotate_half_cat(x, negated), cat_twice(f.sin));
}

// (b) GPT-J: sin/cos repeat_interleave(2) after the table lookup; x * cos + rotate_every_two(x) * sin.
Vec gptj_rotate_every_two(const Vec& x, const Freqs& f) {
  return mul_add(x, repeat_interleave2(f.cos), rotate_even_odd(x), repeat_interleave2(f.sin));
}

// (c) Meta LLaMA: view_as_complex over (x[2i], x[2i+1]) times polar(1, angle), view_as_real back.
Vec complex_polar(const Vec& x, const Freqs& f) {
  Vec out(x.size());
  for (size_t i = 0; i < f.cos.size(); ++i) {
    const std::complex<double> z = std::complex<double>(x[2 * i], x[2 * i + 1]) *
                                   std::complex<double>(f.cos[i], f.sin[i]);
    out[2 * i] = z.real();
    out[2 * i + 1] = z.imag();
  }
  return out;
}

// (d) Cohere: emb = freqs.repeat_interleave(2) before cos/sin (cos of a repeated angle is the repeated
// cos); rotate_half = stack((-x[1::2], x[::2]), -1).flatten(-2).
Vec cohere_rotate_half(const Vec& x, const Freqs& f) {
  const Vec cos = repeat_interleave2(f.cos), sin = repeat_interleave2(f.sin);
  return mul_add(x, cos, rotate_even_odd(x), sin);
}

// (e) GLM: cos/sin = cat(freqs, freqs); apply_rotary_pos_emb keeps cos[..., :r/2] and
// repeat_interleave(2)s it; rotate_half pairs the even and odd channels.
Vec glm_rotate_half(const Vec& x, const Freqs& f) {
  const Vec cos_full = cat_twice(f.cos), sin_full = cat_twice(f.sin);
  const auto h = static_cast<std::ptrdiff_t>(cos_full.size() / 2);
  const Vec cos = repeat_interleave2(Vec(cos_full.begin(), cos_full.begin() + h));
  const Vec sin = repeat_interleave2(Vec(sin_full.begin(), sin_full.begin() + h));
  return mul_add(x, cos, rotate_even_odd(x), sin);
}

// GPT-OSS: first, second = chunk(x, 2); cat(first * cos - second * sin, second * cos + first * sin).
Vec gpt_oss_chunks(const Vec& x, const Freqs& f) {
  const size_t h = x.size() / 2;
  Vec out(x.size());
  for (size_t i = 0; i < h; ++i) {
    out[i] = x[i] * f.cos[i] - x[i + h] * f.sin[i];
    out[i + h] = x[i + h] * f.cos[i] + x[i] * f.sin[i];
  }
  return out;
}

// first, second = x[::2], x[1::2]; stack((first * cos - second * sin, second * cos + first * sin)).flatten().
Vec even_odd_chunks(const Vec& x, const Freqs& f) {
  Vec out(x.size());
  for (size_t i = 0; i < f.cos.size(); ++i) {
    out[2 * i] = x[2 * i] * f.cos[i] - x[2 * i + 1] * f.sin[i];
    out[2 * i + 1] = x[2 * i + 1] * f.cos[i] + x[2 * i] * f.sin[i];
  }
  return out;
}

// Perception Encoder: x.reshape(..., -1, 1, 2) * stack((cos, -sin, sin, cos)).view(..., 2, 2), summed
// over the last axis: row j of the 2x2 matrix dotted with the pair.
Vec pair_matrix(const Vec& x, const Freqs& f) {
  Vec out(x.size());
  for (size_t i = 0; i < f.cos.size(); ++i) {
    const double m[2][2] = {{f.cos[i], -f.sin[i]}, {f.sin[i], f.cos[i]}};
    for (size_t row = 0; row < 2; ++row) out[2 * i + row] = x[2 * i] * m[row][0] + x[2 * i + 1] * m[row][1];
  }
  return out;
}

// DeepSeek-V3 rope_interleave: cos = cat(freqs, freqs)[..., :r/2]; x1, x2 = x[0::2], x[1::2];
// cat(x1 * cos - x2 * sin, x2 * cos + x1 * sin).
Vec deepseek_interleave(const Vec& x, const Freqs& f) {
  const size_t h = x.size() / 2;
  Vec out(x.size());
  for (size_t i = 0; i < h; ++i) {
    out[i] = x[2 * i] * f.cos[i] - x[2 * i + 1] * f.sin[i];
    out[i + h] = x[2 * i + 1] * f.cos[i] + x[2 * i] * f.sin[i];
  }
  return out;
}

// The rotated channels as the formula writes them.
Vec rotate_as_written(RopeFormula formula, const Vec& x, const Freqs& f) {
  switch (formula) {
    case RopeFormula::rotate_half: return llama_rotate_half(x, f, false);
    case RopeFormula::rotate_half_negated: return llama_rotate_half(x, f, true);
    case RopeFormula::half_chunks: return gpt_oss_chunks(x, f);
    case RopeFormula::rotate_every_two: return gptj_rotate_every_two(x, f);
    case RopeFormula::cohere: return cohere_rotate_half(x, f);
    case RopeFormula::glm: return glm_rotate_half(x, f);
    case RopeFormula::complex: return complex_polar(x, f);
    case RopeFormula::even_odd_chunks: return even_odd_chunks(x, f);
    case RopeFormula::pair_matrix: return pair_matrix(x, f);
    case RopeFormula::interleave_to_half: return deepseek_interleave(x, f);
  }
  ADD_FAILURE() << "unknown formula";
  return x;
}

// Where the rotated slice sits in a head of `head_dim`: first rotary_dim channels, or the last.
int64_t rotated_offset(int64_t head_dim, int64_t rotary_dim, bool trailing) {
  return trailing ? head_dim - rotary_dim : 0;
}

// The whole head as the modeling code leaves it: the slice rotated by the formula, the rest passed.
Vec modeling_code(RopeFormula formula, bool trailing, const Vec& x, const Schedule& s, int64_t p) {
  const auto offset =
      static_cast<std::ptrdiff_t>(rotated_offset(static_cast<int64_t>(x.size()), s.rotary_dim, trailing));
  const Vec slice(x.begin() + offset, x.begin() + offset + s.rotary_dim);
  const Vec rotated = rotate_as_written(formula, slice, freqs_at(s, p));
  Vec out(x);
  std::copy(rotated.begin(), rotated.end(), out.begin() + offset);
  return out;
}

// ---- rotary's side ----

// The schedule rotary builds for the slice: a head of its own when the slice trails.
Schedule schedule_for(Pairing pairing, int64_t head_dim, int64_t rotary_dim, bool trailing) {
  return make_schedule(Spec{.head_dim = trailing ? rotary_dim : head_dim, .rotary_dim = rotary_dim,
                            .pairing = pairing});
}

// rotary::apply on one f32 head at position p; a trailing slice is passed as its own head. The
// result is laid out as `formula` writes it (interleave_to_half writes pair i to (i, i + r/2)).
Vec rotary_apply(const Schedule& s, RopeFormula formula, Direction direction, const Vec& x, int64_t p) {
  const int64_t head_dim = static_cast<int64_t>(x.size());
  const int64_t offset = rotated_offset(head_dim, s.rotary_dim, s.head_dim != head_dim);
  std::vector<float> buffer(x.begin(), x.end());
  apply(s, ApplyArgs{.q = TensorView::bshd(buffer.data() + offset, DType::f32, 1, 1, 1, s.head_dim),
                     .positions = Positions::sequential(p),
                     .direction = direction});
  Vec out(buffer.begin(), buffer.end());
  if (detail::deinterleaves_output(formula)) {
    const int64_t h = s.rotary_dim / 2;
    for (int64_t i = 0; i < h; ++i) {
      out[static_cast<size_t>(offset + i)] = buffer[static_cast<size_t>(offset + 2 * i)];
      out[static_cast<size_t>(offset + i + h)] = buffer[static_cast<size_t>(offset + 2 * i + 1)];
    }
  }
  return out;
}

// Random f32-representable head in [-1, 1).
Vec random_head(int64_t head_dim, uint64_t seed) {
  const std::vector<float> values = test::random_floats(static_cast<size_t>(head_dim), seed);
  return Vec(values.begin(), values.end());
}

double max_abs(const Vec& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

// Worst |rotary - modeling code| over the positions, in units of the head's largest input; the
// passed-through channels must come back bit for bit.
double worst_miss(const ModelTypeRope& e, RopeFormula formula, Pairing pairing, Direction direction,
                  int64_t rotary_dim) {
  const Schedule s = schedule_for(pairing, kHeadDim, rotary_dim, e.trailing_rotary);
  const int64_t offset = rotated_offset(kHeadDim, rotary_dim, e.trailing_rotary);
  double worst = 0;
  for (int64_t p : test_positions()) {
    const Vec x = random_head(kHeadDim, static_cast<uint64_t>(p) * 31 + 5);
    const Vec want = modeling_code(formula, e.trailing_rotary, x, s, p);
    const Vec got = rotary_apply(s, formula, direction, x, p);
    for (int64_t j = 0; j < kHeadDim; ++j) {
      const auto u = static_cast<size_t>(j);
      if (j < offset || j >= offset + rotary_dim) {
        EXPECT_EQ(got[u], x[u]) << e.model_type << ": passed-through channel " << j << " position " << p;
        continue;
      }
      worst = std::max(worst, std::fabs(got[u] - want[u]) / max_abs(x));
    }
  }
  return worst;
}

// The rotated widths an entry's code supports: the whole head, and a partial slice if it has one.
std::vector<int64_t> rotary_dims(const ModelTypeRope& e) {
  if (e.trailing_rotary) return {kPartialRotaryDim};
  if (e.partial_rotary) return {kHeadDim, kPartialRotaryDim};
  return {kHeadDim};
}

Direction direction_of(RopeFormula formula) {
  return detail::rotates_backward(formula) ? Direction::inverse : Direction::forward;
}

Pairing other(Pairing pairing) { return pairing == Pairing::half ? Pairing::interleaved : Pairing::half; }

// ---- the table's shape ----

TEST(ModelTypes, TableIsSortedAndUnique) {
  const auto table = model_type_table();
  ASSERT_GT(table.size(), 200u);
  for (size_t i = 1; i < table.size(); ++i) EXPECT_LT(table[i - 1].model_type, table[i].model_type);
}

TEST(ModelTypes, FindModelTypeFindsExactNamesOnly) {
  ASSERT_NE(find_model_type("llama"), nullptr);
  EXPECT_EQ(find_model_type("llama")->model_type, "llama");
  EXPECT_EQ(find_model_type("llama")->pairing, Pairing::half);
  ASSERT_NE(find_model_type("cohere"), nullptr);
  EXPECT_EQ(find_model_type("cohere")->pairing, Pairing::interleaved);
  // Every entry at its own address, the bisection's edges (first and last) included.
  for (const ModelTypeRope& e : model_type_table()) EXPECT_EQ(find_model_type(e.model_type), &e) << e.model_type;
  for (std::string_view unknown : {"", "LLAMA", "llama ", "llam", "llama2", "zzz", "bloom", "mpt", "gpt2"}) {
    EXPECT_EQ(find_model_type(unknown), nullptr) << '"' << unknown << '"';
  }
  EXPECT_EQ(find_model_type(std::string_view("llama\0x", 7)), nullptr);
}

bool is_name(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// "modeling_<name>.py" with <name> of [a-z0-9_].
bool is_modeling_file(std::string_view file) {
  constexpr std::string_view prefix = "modeling_", suffix = ".py";
  return file.size() > prefix.size() + suffix.size() && file.starts_with(prefix) && file.ends_with(suffix) &&
         is_name(file.substr(prefix.size(), file.size() - prefix.size() - suffix.size()));
}

// transformers: "models/<dir>/modeling_<name>.py: <what decides>"; remote code:
// "github.com/<owner>/<repo> <path>/modeling_<name>.py: <what decides>".
bool cites_modeling_file(std::string_view source) {
  const size_t colon = source.find(".py: ");
  if (colon == std::string_view::npos) return false;
  const std::string_view path = source.substr(0, colon + 3), why = source.substr(colon + 5);
  if (why.size() < 10 || why.front() == ' ') return false;
  const std::string_view file = path.substr(path.rfind('/') + 1);
  if (path.starts_with("models/")) {
    const std::string_view dir = path.substr(7, path.size() - 7 - file.size());
    return dir.size() > 1 && dir.back() == '/' && is_name(dir.substr(0, dir.size() - 1)) && is_modeling_file(file);
  }
  const size_t space = path.find(' ');
  return path.starts_with("github.com/") && space != std::string_view::npos &&
         std::count(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(space), '/') == 2 &&
         is_modeling_file(file);
}

TEST(ModelTypes, EverySourceCitesAModelingFile) {
  for (const ModelTypeRope& e : model_type_table()) {
    EXPECT_TRUE(cites_modeling_file(e.source)) << e.model_type << ": " << e.source;
  }
  // The check itself rejects what is not a citation.
  EXPECT_TRUE(cites_modeling_file("models/glm/modeling_glm.py: rotate_half pairs even and odd"));
  for (std::string_view bad :
       {"", "modeling_glm.py: rotate_half pairs even and odd", "models/glm/modeling_glm.py: ",
        "models/glm/configuration_glm.py: rotate_half pairs", "models//modeling_glm.py: rotate_half pairs even",
        "models/GLM/modeling_glm.py: x y z w v u", "github.com/a modeling_x.py: rotate_half pairs even and odd"}) {
    EXPECT_FALSE(cites_modeling_file(bad)) << bad;
  }
}

// The citation states the code that makes the formula, so an entry's formula cannot change
// without its evidence: any one of these must appear in the source.
std::vector<std::string_view> evidence_of(RopeFormula formula) {
  switch (formula) {
    case RopeFormula::rotate_half:
      return {"rotate_half splits x at x.shape[-1] // 2", "cats (-x[..., d // 2:], x[..., :d // 2])"};
    case RopeFormula::rotate_half_negated: return {"cat(x2, -x1)"};
    case RopeFormula::half_chunks: return {"chunks x into halves"};
    case RopeFormula::rotate_every_two:
      return {"stacks (-x[..., 1::2], x[..., ::2])", "stacks (-x[..., 1::2], x[..., 0::2])"};
    case RopeFormula::cohere: return {"repeat_interleave(2)s freqs"};
    case RopeFormula::glm: return {"repeat_interleave(2)s cos[..., :d // 2]"};
    case RopeFormula::complex: return {"view_as_complex"};
    case RopeFormula::even_odd_chunks: return {"rotates (x[..., ::2], x[..., 1::2]) and stacks"};
    case RopeFormula::pair_matrix: return {"[[cos, -sin], [sin, cos]]"};
    case RopeFormula::interleave_to_half:
      return {"apply_rotary_pos_emb_interleave rotates (x[..., 0::2], x[..., 1::2])"};
  }
  return {};
}

TEST(ModelTypes, EverySourceStatesTheCodeOfItsFormula) {
  for (const ModelTypeRope& e : model_type_table()) {
    const auto evidence = evidence_of(e.formula);
    EXPECT_TRUE(std::any_of(evidence.begin(), evidence.end(),
                            [&](std::string_view needle) { return e.source.find(needle) != std::string_view::npos; }))
        << e.model_type << ": " << e.source;
  }
}

// The JSON text a rope switch compares with: true, false, null or a plain "string".
bool is_json_scalar(std::string_view text) {
  if (text == "true" || text == "false" || text == "null") return true;
  return text.size() >= 2 && text.front() == '"' && text.back() == '"' &&
         text.substr(1, text.size() - 2).find_first_of("\"\\") == std::string_view::npos;
}

TEST(ModelTypes, FieldsAgreeWithTheFormula) {
  for (const ModelTypeRope& e : model_type_table()) {
    SCOPED_TRACE(std::string(e.model_type));
    EXPECT_EQ(e.pairing, detail::pairing_of(e.formula));
    if (!e.pairing_flag.empty()) {
      // The flag's default picks `formula`; the other value falls back to Llama's rotate_half.
      EXPECT_TRUE(e.pairing_flag_default);
      EXPECT_EQ(e.pairing, Pairing::interleaved);
    } else {
      EXPECT_FALSE(e.pairing_flag_default);
    }
    EXPECT_EQ(e.rope_switch_key.empty(), e.rope_switch_value.empty());
    EXPECT_EQ(e.rope_switch_key.empty(), e.rope_switch_default.empty());
    if (!e.rope_switch_key.empty()) {
      EXPECT_TRUE(is_json_scalar(e.rope_switch_value)) << e.rope_switch_value;
      EXPECT_TRUE(is_json_scalar(e.rope_switch_default)) << e.rope_switch_default;
    }
    EXPECT_TRUE(!e.trailing_rotary || e.partial_rotary) << "a trailing slice is a partial rotation";
  }
}

TEST(ModelTypes, ListsTheModelTypesThatUseRope) {
  for (std::string_view name :
       {"llama", "llama4", "llama4_text", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi",
        "phi3", "phimoe", "gemma", "gemma2", "gemma3", "gemma3_text", "gpt_neox", "gpt_neox_japanese", "gptj",
        "codegen", "cohere", "cohere2", "glm", "glm4", "deepseek_v2", "deepseek_v3", "stablelm", "olmo", "olmo2",
        "granite", "starcoder2", "falcon", "persimmon", "ernie4_5", "exaone4", "internlm", "internlm2",
        "internlm3", "minicpm", "minicpm3", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text",
        "qwen3_vl", "qwen3_vl_text", "glm4v", "glm4v_text", "kimi_k2"}) {
    EXPECT_NE(find_model_type(name), nullptr) << name;
  }
  // ALiBi, learned, sinusoidal or relative positions; a rotate_half no attention calls; 2-D vision
  // towers; rotary outside attention (musicflamingo) or on one head only (qwen2_5_omni_dit).
  for (std::string_view name : {"bloom", "mpt", "gpt2", "gpt_bigcode", "opt", "bert", "t5", "falcon_mamba",
                                "mamba", "jamba", "nemotron_h", "parakeet_encoder", "seamless_m4t", "moshi_depth",
                                "musicflamingo", "qwen2_5_omni_dit", "pixtral", "qwen2_vl_vision"}) {
    EXPECT_EQ(find_model_type(name), nullptr) << name;
  }
}

// The cases: transformers rotates these interleaved, which a half default got wrong.
TEST(ModelTypes, CohereGlmAndDeepseekV2AreInterleaved) {
  for (std::string_view name : {"cohere", "cohere2", "glm", "glm4", "deepseek_v2"}) {
    ASSERT_NE(find_model_type(name), nullptr) << name;
    EXPECT_EQ(find_model_type(name)->pairing, Pairing::interleaved) << name;
  }
  EXPECT_EQ(find_model_type("cohere")->formula, RopeFormula::cohere);
  EXPECT_EQ(find_model_type("glm")->formula, RopeFormula::glm);
  EXPECT_EQ(find_model_type("deepseek_v2")->formula, RopeFormula::complex);
  EXPECT_EQ(find_model_type("deepseek_v3")->pairing_flag, "rope_interleave");
  EXPECT_TRUE(find_model_type("qwen2_vl_text")->multimodal_positions);
  EXPECT_EQ(find_model_type("falcon")->rope_switch_key, "alibi");
}

// ---- every entry against its formula ----

TEST(ModelTypes, EveryEntryMatchesItsFormulaWrittenOut) {
  int checked = 0;
  for (const ModelTypeRope& e : model_type_table()) {
    for (int64_t rotary_dim : rotary_dims(e)) {
      const double miss = worst_miss(e, e.formula, e.pairing, direction_of(e.formula), rotary_dim);
      EXPECT_LE(miss, kAgreement) << e.model_type << " rotary_dim " << rotary_dim << ": " << e.source;
      ++checked;
    }
  }
  EXPECT_GE(checked, static_cast<int>(model_type_table().size()));
}

// With the flag off, the code falls back to Llama's rotate_half: pairing half.
TEST(ModelTypes, PairingFlagOffMatchesRotateHalf) {
  int checked = 0;
  for (const ModelTypeRope& e : model_type_table()) {
    if (e.pairing_flag.empty()) continue;
    const double miss = worst_miss(e, RopeFormula::rotate_half, Pairing::half, Direction::forward, kHeadDim);
    EXPECT_LE(miss, kAgreement) << e.model_type;
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

// The check above is only worth something if a wrong entry fails it: the other pairing (and, for
// a formula that turns backward, the forward direction) must miss by far more than the tolerance.
TEST(ModelTypes, AWrongPairingFailsTheCheck) {
  for (const ModelTypeRope& e : model_type_table()) {
    const int64_t rotary_dim = rotary_dims(e).back();
    EXPECT_GT(worst_miss(e, e.formula, other(e.pairing), direction_of(e.formula), rotary_dim), kWrongPairingMiss)
        << e.model_type;
    if (detail::rotates_backward(e.formula)) {
      EXPECT_GT(worst_miss(e, e.formula, e.pairing, Direction::forward, rotary_dim), kWrongPairingMiss)
          << e.model_type;
    }
  }
}

}  // namespace
}  // namespace rotary
