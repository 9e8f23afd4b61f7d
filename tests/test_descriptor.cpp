// The descriptor (Schedule: pairing, rotary_offset, blocks, streams, pair_stream, inv_freq >= 0),
// positions in S streams and caller-supplied angles, each against an oracle written here from the
// models' own code: transformers' M-RoPE section split, Qwen3-VL's interleaved overwrite, GLM-4V's
// repeat-interleave, ERNIE-4.5-VL's h/w stacking, the vision towers (Qwen ViT, Pixtral, Llama 4,
// Gemma 4), proportional RoPE, nope-first slices. Schedules are built by hand from DESIGN.md §5;
// the oracles compute in double with angles from MPFR (256 bits, the exact real product p * f).
// Each runs through Backend::reference and Backend::cpu on every compiled Highway target, 1 and 2
// threads, in and out of place, f32/f16/bf16/f64, contiguous and strided views, Table and on the fly.
#include <hwy/tests/hwy_gtest.h>

#include <mpfr.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <tuple>

#include "math/half.hpp"
#include "rotary/apply.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

// ---- exact angles of a real position ----

struct Exact {
  double cos;
  double sin;
};

// cos and sin of p * f (or p / f when `divide`), both doubles, the product or quotient formed in
// MPFR at 256 bits (the product exactly), rounded to double once. Memoised: the oracles ask for
// the same angle for every head.
Exact exact(double p, double f, bool divide = false) {
  static std::map<std::tuple<double, double, bool>, Exact> memo;
  const auto key = std::make_tuple(p, f, divide);
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  mpfr_t angle, factor, s, c;
  mpfr_inits2(256, angle, factor, s, c, static_cast<mpfr_ptr>(nullptr));
  mpfr_set_d(angle, p, MPFR_RNDN);
  mpfr_set_d(factor, f, MPFR_RNDN);
  if (divide) mpfr_div(angle, angle, factor, MPFR_RNDN);
  else mpfr_mul(angle, angle, factor, MPFR_RNDN);
  mpfr_sin_cos(s, c, angle, MPFR_RNDN);
  const Exact e{mpfr_get_d(c, MPFR_RNDN), mpfr_get_d(s, MPFR_RNDN)};
  mpfr_clears(angle, factor, s, c, static_cast<mpfr_ptr>(nullptr));
  memo.emplace(key, e);
  return e;
}

// transformers: inv_freq = 1 / base ** (arange(0, dim, 2) / dim), here in double.
std::vector<double> hf_inv_freq(double base, int64_t dim) {
  std::vector<double> f;
  for (int64_t i = 0; i < dim; i += 2) f.push_back(1.0 / std::pow(base, static_cast<double>(i) / dim));
  return f;
}

// ---- storage of any dtype behind a strided view ----

struct Store {
  DType dtype;
  std::vector<unsigned char> bytes;
  Store(DType t, int64_t elements) : dtype(t), bytes(static_cast<size_t>(elements * size_of(t))) {
    poison();
  }
  void poison() {
    for (int64_t i = 0; i < static_cast<int64_t>(bytes.size()) / size_of(dtype); ++i) set_bits_nan(i);
  }
  void set_bits_nan(int64_t i) {
    unsigned char* p = &bytes[static_cast<size_t>(i * size_of(dtype))];
    switch (dtype) {
      case DType::f32: { const uint32_t v = 0x7fc12345u; std::memcpy(p, &v, 4); break; }
      case DType::f64: { const uint64_t v = 0x7ff8123456789abcull; std::memcpy(p, &v, 8); break; }
      default: { const uint16_t v = 0x7e55u; std::memcpy(p, &v, 2); break; }
    }
  }
  void* at(int64_t i) { return &bytes[static_cast<size_t>(i * size_of(dtype))]; }
  void* data() { return bytes.data(); }
  void set(int64_t i, double v) {
    void* p = at(i);
    switch (dtype) {
      case DType::f32: { const float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
      case DType::f64: std::memcpy(p, &v, 8); break;
      case DType::f16: { const uint16_t h = detail::f32_to_f16(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
      case DType::bf16: { const uint16_t h = detail::f32_to_bf16(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
      default: break;  // cache dtypes (rotary/fused.hpp) are not apply's
    }
  }
  double get(int64_t i) const {
    const unsigned char* p = &bytes[static_cast<size_t>(i * size_of(dtype))];
    return test::load_element(dtype, p);
  }
  bool same_bits(const Store& other, int64_t i) const {
    return std::memcmp(&bytes[static_cast<size_t>(i * size_of(dtype))],
                       &other.bytes[static_cast<size_t>(i * size_of(dtype))], static_cast<size_t>(size_of(dtype))) == 0;
  }
};

// Views of [batch, seq, heads, head_dim] in a buffer: contiguous bshd, bhsd, channels at stride 2
// with padded heads, and seq running backwards.
struct Geometry {
  std::array<int64_t, 4> strides;
  int64_t base;    // element offset of (0, 0, 0, 0)
  int64_t extent;  // elements the buffer needs
};
constexpr int kGeometries = 4;
const char* geometry_name(int g) {
  static const char* names[] = {"bshd", "bhsd", "channel-stride-2", "seq-reversed"};
  return names[g];
}
Geometry geometry(int kind, int64_t b, int64_t s, int64_t h, int64_t d) {
  switch (kind) {
    case 0: return {{s * h * d, h * d, d, 1}, 0, b * s * h * d};
    case 1: return {{h * s * d, d, s * d, 1}, 0, b * s * h * d};
    case 2: { const int64_t hs = 2 * d + 3; return {{s * h * hs, h * hs, hs, 2}, 1, b * s * h * hs + 1}; }
    default: return {{s * h * d, -h * d, d, 1}, (s - 1) * h * d, b * s * h * d};
  }
}
int64_t element(const Geometry& g, int64_t b, int64_t s, int64_t h, int64_t j) {
  return g.base + b * g.strides[0] + s * g.strides[1] + h * g.strides[2] + j * g.strides[3];
}

// Values m/64, |m| <= 255: exact in f16, bf16, f32 and f64, so one input serves every dtype.
std::vector<double> exact_inputs(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> m(-255, 255);
  std::vector<double> out(n);
  for (double& v : out) v = m(rng) / 64.0;
  return out;
}

// The contract per pair, in units of g (|a| + |b|): f32 (and f16/bf16 before their one rounding)
// 2^-23; f64 a few double roundings with exact angles, and the Table's float32 values (each within
// one float ulp) with a Table.
double pair_unit(DType dtype, bool table, double f64_unit) {
  return dtype == DType::f64 && !table ? f64_unit : 0x1p-23;
}
double narrow_unit(DType dtype) {
  return dtype == DType::bf16 ? 0x1p-8 * 1.01 : dtype == DType::f16 ? 0x1p-11 * 1.01 : 0.0;
}
// f16 below 2^-14 rounds to a multiple of 2^-24: half of that, absolute.
double narrow_floor(DType dtype) { return dtype == DType::f16 ? 0x1p-25 : 0.0; }

// ---- a model case: a hand-built Schedule, positions, and the model's formula ----

// formula(head, token) -> the rotated head, from the model's code (double, exact angles).
using Formula = std::function<std::vector<double>(const std::vector<double>&, int64_t)>;

struct ModelCase {
  std::string name;
  Schedule schedule;
  int64_t batch = 2;
  int64_t seq = 5;
  std::vector<int32_t> positions;  // [streams, batch * seq]
  Formula formula;
  double f64_unit = 0x1p-50;
};

struct Run {
  DType dtype;
  bool table;
  bool in_place;
  int geometry;
  Backend backend;
  int threads;
};

std::string describe(const ModelCase& c, const Run& r) {
  return c.name + " " + std::string(to_string(r.dtype)) + (r.table ? " table" : " on-the-fly") +
         (r.in_place ? " in-place " : " out-of-place ") + geometry_name(r.geometry) +
         (r.backend == Backend::cpu ? " cpu" : " reference") + " threads " + std::to_string(r.threads) +
         " target " + hwy::TargetName(hwy::SupportedTargets() & -hwy::SupportedTargets());
}

// Rotated (q, k) outputs of one run, as stores laid out by the run's geometry.
struct Outputs {
  Store q;
  Store k;
};

Outputs run_once(const ModelCase& c, const Run& r, const std::vector<double>& q0, const std::vector<double>& k0,
                 int64_t hq, int64_t hk, const Table& table) {
  const int64_t d = c.schedule.head_dim;
  const Geometry gq = geometry(r.geometry, c.batch, c.seq, hq, d);
  const Geometry gk = geometry(r.geometry, c.batch, c.seq, hk, d);
  Store qin(r.dtype, gq.extent), kin(r.dtype, gk.extent);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t s = 0; s < c.seq; ++s) {
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t j = 0; j < d; ++j) qin.set(element(gq, b, s, h, j), q0[static_cast<size_t>(((b * c.seq + s) * hq + h) * d + j)]);
      for (int64_t h = 0; h < hk; ++h)
        for (int64_t j = 0; j < d; ++j) kin.set(element(gk, b, s, h, j), k0[static_cast<size_t>(((b * c.seq + s) * hk + h) * d + j)]);
    }
  Outputs out{Store(r.dtype, gq.extent), Store(r.dtype, gk.extent)};
  auto view = [&](Store& st, const Geometry& g, int64_t heads) {
    return TensorView{.data = st.at(g.base), .dtype = r.dtype, .shape = {c.batch, c.seq, heads, d},
                      .strides = g.strides};
  };
  ApplyArgs args{.q = view(qin, gq, hq), .k = view(kin, gk, hk),
                 .positions = Positions::per_token(std::span<const int32_t>(c.positions), c.schedule.streams),
                 .table = r.table ? &table : nullptr, .threads = r.threads, .backend = r.backend};
  if (!r.in_place) {
    args.q_out = view(out.q, gq, hq);
    args.k_out = view(out.k, gk, hk);
  }
  apply(c.schedule, args);
  if (r.in_place) {
    out.q = std::move(qin);
    out.k = std::move(kin);
  }
  return out;
}

// Checks one operand of a run against the formula's output, pair by pair within the contract;
// channels outside every pair equal the input bit for bit (in place: untouched; out of place:
// copied). Elements of the buffer outside the view are still poison (out of place).
void check_operand(const ModelCase& c, const Run& r, const Store& got, int64_t heads, const std::vector<double>& in,
                   const std::vector<double>& want, const char* name) {
  const Schedule& s = c.schedule;
  const int64_t d = s.head_dim;
  const Geometry g = geometry(r.geometry, c.batch, c.seq, heads, d);
  std::vector<bool> rotated(static_cast<size_t>(d), false);
  for (int64_t j = 0; j < s.pairs(); ++j) {
    rotated[static_cast<size_t>(s.channels(j).first)] = rotated[static_cast<size_t>(s.channels(j).second)] = true;
  }
  std::set<int64_t> inside;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t t = 0; t < c.seq; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const size_t base = static_cast<size_t>(((b * c.seq + t) * heads + h) * d);
        auto where = [&](int64_t j) {
          return describe(c, r) + " " + name + " batch " + std::to_string(b) + " token " + std::to_string(t) +
                 " head " + std::to_string(h) + " channel " + std::to_string(j);
        };
        for (int64_t j = 0; j < s.pairs(); ++j) {
          const auto [ca, cb] = s.channels(j);
          const double scale = s.attention_factor * (std::fabs(in[base + ca]) + std::fabs(in[base + cb]));
          for (int64_t ch : {ca, cb}) {
            const double v = got.get(element(g, b, t, h, ch));
            const double allowed = pair_unit(r.dtype, r.table, c.f64_unit) * scale + narrow_unit(r.dtype) * std::fabs(v) +
                                   narrow_floor(r.dtype);
            ASSERT_LE(std::fabs(v - want[base + ch]), allowed) << where(ch) << " pair " << j << " got " << v
                                                               << " want " << want[base + ch];
          }
        }
        for (int64_t j = 0; j < d; ++j) {
          inside.insert(element(g, b, t, h, j));
          if (rotated[static_cast<size_t>(j)]) continue;
          ASSERT_EQ(want[base + j], in[base + j]) << where(j) << ": the formula changed a pass-through channel";
          ASSERT_EQ(got.get(element(g, b, t, h, j)), in[base + j]) << where(j) << " pass-through";
        }
      }
  if (!r.in_place) {
    Store poison(r.dtype, g.extent);
    for (int64_t i = 0; i < g.extent; ++i) {
      if (!inside.count(i)) {
        ASSERT_TRUE(got.same_bits(poison, i)) << describe(c, r) << " " << name << " wrote outside the view at " << i;
      }
    }
  }
}

// The sweep: every dtype, angle source, placement and geometry; reference, cpu at 1 and 2 threads.
// With a Table the cpu bytes equal the reference's; any thread count gives the same bytes.
void check_model(const ModelCase& c) {
  validate(c.schedule);
  const int64_t hq = 3, hk = 2, d = c.schedule.head_dim, tokens = c.batch * c.seq;
  ASSERT_EQ(static_cast<int64_t>(c.positions.size()), c.schedule.streams * tokens) << c.name;
  const std::vector<double> q0 = exact_inputs(static_cast<size_t>(tokens * hq * d), 11);
  const std::vector<double> k0 = exact_inputs(static_cast<size_t>(tokens * hk * d), 12);
  std::vector<double> wq(q0.size()), wk(k0.size());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < hq; ++h) {
      const auto first = q0.begin() + (t * hq + h) * d;
      const std::vector<double> out = c.formula(std::vector<double>(first, first + d), t);
      std::copy(out.begin(), out.end(), wq.begin() + (t * hq + h) * d);
    }
    for (int64_t h = 0; h < hk; ++h) {
      const auto first = k0.begin() + (t * hk + h) * d;
      const std::vector<double> out = c.formula(std::vector<double>(first, first + d), t);
      std::copy(out.begin(), out.end(), wk.begin() + (t * hk + h) * d);
    }
  }
  std::vector<int64_t> rows(c.positions.begin(), c.positions.end());
  const Table table = Table::at(c.schedule, rows);
  int geometry_kind = 0;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (bool use_table : {false, true}) {
      for (bool in_place : {true, false}) {
        const int gk = geometry_kind++ % kGeometries;
        const Run ref{dtype, use_table, in_place, gk, Backend::reference, 1};
        const Outputs want = run_once(c, ref, q0, k0, hq, hk, table);
        check_operand(c, ref, want.q, hq, q0, wq, "q");
        check_operand(c, ref, want.k, hk, k0, wk, "k");
        if (::testing::Test::HasFatalFailure()) return;
        std::optional<Outputs> one;
        for (int threads : {1, 2}) {
          const Run cpu{dtype, use_table, in_place, gk, Backend::cpu, threads};
          Outputs got = run_once(c, cpu, q0, k0, hq, hk, table);
          check_operand(c, cpu, got.q, hq, q0, wq, "q");
          check_operand(c, cpu, got.k, hk, k0, wk, "k");
          if (::testing::Test::HasFatalFailure()) return;
          if (use_table) {
            ASSERT_EQ(got.q.bytes, want.q.bytes) << describe(c, cpu) << ": q bytes differ from the reference";
            ASSERT_EQ(got.k.bytes, want.k.bytes) << describe(c, cpu) << ": k bytes differ from the reference";
          }
          if (threads == 1) {
            one.emplace(std::move(got));
          } else {
            ASSERT_EQ(got.q.bytes, one->q.bytes) << describe(c, cpu) << ": q differs from 1 thread";
            ASSERT_EQ(got.k.bytes, one->k.bytes) << describe(c, cpu) << ": k differs from 1 thread";
          }
        }
      }
    }
  }
}

// Positions [3, batch, seq] of an M-RoPE prompt: text tokens t = h = w, an image grid (t fixed,
// h and w running), and late tokens near 2^31 - 1.
std::vector<int32_t> mrope_positions(int64_t tokens, int streams) {
  std::vector<int32_t> p(static_cast<size_t>(streams * tokens));
  auto at = [&](int k, int64_t t) -> int32_t& { return p[static_cast<size_t>(k * tokens + t)]; };
  for (int64_t t = 0; t < tokens; ++t) {
    for (int k = 0; k < streams; ++k) {
      if (t < 2) at(k, t) = static_cast<int32_t>(t);                                  // text
      else if (t < 8) at(k, t) = k == 0 ? 2 : static_cast<int32_t>(2 + (k == 1 ? (t - 2) / 3 : (t - 2) % 3));
      else at(k, t) = static_cast<int32_t>(max_position_limit - 1 - 7 * k - (t % 5));  // far
    }
  }
  return p;
}

class DescriptorModels : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(DescriptorModels);

// Qwen2-VL / Qwen2.5-VL, transformers' apply_multimodal_rotary_pos_emb: cos and sin per stream
// ([3, b, s, D] with duplicated halves), split along the last dim by mrope_section * 2, chunk i
// from stream i % 3, concatenated; then q * cos + rotate_half(q) * sin.
std::vector<double> qwen2_vl(const std::vector<double>& q, const double* pos3, const std::vector<double>& inv_freq,
                             const std::vector<int64_t>& mrope_section) {
  const int64_t dim = static_cast<int64_t>(q.size()), half = dim / 2;
  // emb = cat(freqs, freqs) per stream: channel c has frequency inv_freq[c % half]
  std::vector<int64_t> sections = mrope_section;
  sections.insert(sections.end(), mrope_section.begin(), mrope_section.end());  // mrope_section * 2
  std::vector<double> cos(static_cast<size_t>(dim)), sin(static_cast<size_t>(dim));
  int64_t c = 0;
  for (size_t i = 0; i < sections.size(); ++i) {
    for (int64_t n = 0; n < sections[i]; ++n, ++c) {
      const Exact e = exact(pos3[i % 3], inv_freq[static_cast<size_t>(c % half)]);
      cos[static_cast<size_t>(c)] = e.cos;
      sin[static_cast<size_t>(c)] = e.sin;
    }
  }
  EXPECT_EQ(c, dim);
  std::vector<double> out(q.size());
  for (int64_t j = 0; j < dim; ++j) {
    const double rotated = j < half ? -q[static_cast<size_t>(j + half)] : q[static_cast<size_t>(j - half)];
    out[static_cast<size_t>(j)] = q[static_cast<size_t>(j)] * cos[static_cast<size_t>(j)] + rotated * sin[static_cast<size_t>(j)];
  }
  return out;
}

// DESIGN.md §5's map for contiguous sections: stream 0 for j < s0, 1 for j < s0 + s1, else 2.
std::vector<int> contiguous_sections(const std::vector<int64_t>& sections) {
  std::vector<int> map;
  for (size_t k = 0; k < sections.size(); ++k)
    for (int64_t n = 0; n < sections[k]; ++n) map.push_back(static_cast<int>(k));
  return map;
}

ModelCase qwen2_vl_case() {
  ModelCase c{.name = "Qwen2-VL"};
  const std::vector<int64_t> section = {16, 24, 24};
  const std::vector<double> inv_freq = hf_inv_freq(1e6, 128);
  c.schedule = Schedule{.head_dim = 128, .rotary_dim = 128, .pairing = Pairing::half, .inv_freq = inv_freq,
                        .streams = 3, .pair_stream = contiguous_sections(section)};
  c.seq = 7;
  const int64_t tokens = c.batch * c.seq;
  c.positions = mrope_positions(tokens, 3);
  c.formula = [positions = c.positions, inv_freq, section, tokens](const std::vector<double>& q, int64_t t) {
    const double pos3[3] = {double(positions[t]), double(positions[tokens + t]), double(positions[2 * tokens + t])};
    return qwen2_vl(q, pos3, inv_freq, section);
  };
  return c;
}

TEST_P(DescriptorModels, Qwen2VlSectionSplitOfTransformers) { check_model(qwen2_vl_case()); }

// Qwen3-VL's apply_interleaved_mrope: freqs_t = freqs[0]; for dim, offset in ((1, 1), (2, 2)):
// freqs_t[..., offset:mrope_section[dim] * 3:3] = freqs[dim, ..., offset:length:3]; then
// emb = cat(freqs_t, freqs_t), cos/sin, rotate_half.
ModelCase qwen3_vl_case() {
  ModelCase c{.name = "Qwen3-VL"};
  const std::vector<int64_t> section = {24, 20, 20};
  const std::vector<double> inv_freq = hf_inv_freq(5e6, 128);
  // DESIGN.md §5: stream 1 if j % 3 == 1 and j < 3 s_h; 2 if j % 3 == 2 and j < 3 s_w; else 0.
  std::vector<int> map(64, 0);
  for (int j = 0; j < 64; ++j) {
    if (j % 3 == 1 && j < 3 * section[1]) map[static_cast<size_t>(j)] = 1;
    else if (j % 3 == 2 && j < 3 * section[2]) map[static_cast<size_t>(j)] = 2;
  }
  c.schedule = Schedule{.head_dim = 128, .rotary_dim = 128, .pairing = Pairing::half, .inv_freq = inv_freq,
                        .streams = 3, .pair_stream = map};
  c.seq = 7;
  const int64_t tokens = c.batch * c.seq;
  c.positions = mrope_positions(tokens, 3);
  c.formula = [positions = c.positions, inv_freq, section, tokens](const std::vector<double>& q, int64_t t) {
    // freqs[k][i] = position_k * inv_freq[i], kept as (stream, i) so the angle is exact at the end
    std::vector<int> stream_t(64, 0);  // freqs_t = freqs[0]
    for (int dim = 1; dim <= 2; ++dim) {
      const int offset = dim;
      const int64_t length = section[static_cast<size_t>(dim)] * 3;
      for (int64_t idx = offset; idx < length; idx += 3) stream_t[static_cast<size_t>(idx)] = dim;
    }
    std::vector<double> out(128);
    for (int64_t j = 0; j < 128; ++j) {
      const int64_t i = j % 64;  // emb = cat(freqs_t, freqs_t)
      const int k = stream_t[static_cast<size_t>(i)];
      const Exact e = exact(positions[static_cast<size_t>(k * tokens + t)], inv_freq[static_cast<size_t>(i)]);
      const double rotated = j < 64 ? -q[static_cast<size_t>(j + 64)] : q[static_cast<size_t>(j - 64)];
      out[static_cast<size_t>(j)] = q[static_cast<size_t>(j)] * e.cos + rotated * e.sin;
    }
    return out;
  };
  return c;
}

TEST_P(DescriptorModels, Qwen3VlInterleavedOverwrite) { check_model(qwen3_vl_case()); }

// GLM-4V (Glm4vTextRotaryEmbedding, partial_rotary_factor 0.5): cos per stream over dim = D/2
// with duplicated halves, the section split as Qwen2-VL, then cos[..., :dim//2].repeat_interleave(2),
// q_rot = q[..., :dim], q_rot * cos + rotate_half_llm(q_rot) * sin (x[0::2], x[1::2] stacked
// (-x2, x1) and flattened), q_pass appended.
ModelCase glm4v_case() {
  ModelCase c{.name = "GLM-4V"};
  const std::vector<int64_t> section = {8, 12, 12};
  const int64_t head_dim = 128, dim = 64;
  const std::vector<double> inv_freq = hf_inv_freq(10000.0, dim);
  c.schedule = Schedule{.head_dim = head_dim, .rotary_dim = dim, .pairing = Pairing::interleaved,
                        .inv_freq = inv_freq, .streams = 3, .pair_stream = contiguous_sections(section)};
  const int64_t tokens = c.batch * c.seq;
  c.positions = mrope_positions(tokens, 3);
  c.formula = [positions = c.positions, inv_freq, section, tokens, dim](const std::vector<double>& q, int64_t t) {
    std::vector<int64_t> sections = section;
    sections.insert(sections.end(), section.begin(), section.end());
    std::vector<double> merged_cos(static_cast<size_t>(dim)), merged_sin(static_cast<size_t>(dim));
    int64_t ch = 0;
    for (size_t i = 0; i < sections.size(); ++i)
      for (int64_t n = 0; n < sections[i]; ++n, ++ch) {
        const Exact e = exact(positions[static_cast<size_t>(static_cast<int64_t>(i % 3) * tokens + t)],
                              inv_freq[static_cast<size_t>(ch % (dim / 2))]);
        merged_cos[static_cast<size_t>(ch)] = e.cos;
        merged_sin[static_cast<size_t>(ch)] = e.sin;
      }
    std::vector<double> out = q;  // q_pass kept
    for (int64_t j = 0; j < dim; ++j) {
      const double cs = merged_cos[static_cast<size_t>(j / 2)], sn = merged_sin[static_cast<size_t>(j / 2)];  // repeat_interleave(2)
      const double rotated = j % 2 == 0 ? -q[static_cast<size_t>(j + 1)] : q[static_cast<size_t>(j - 1)];
      out[static_cast<size_t>(j)] = q[static_cast<size_t>(j)] * cs + rotated * sn;
    }
    return out;
  };
  return c;
}

TEST_P(DescriptorModels, Glm4vRepeatInterleavePartial) { check_model(glm4v_case()); }

// ERNIE-4.5-VL (Ernie4_5_VLTextRotaryEmbedding.recomposition_to_3d): freq split by
// mrope_section [22, 22, 20], chunk i from stream (i + 1) % 3 (h, w, t); h and w stacked
// [h0 w0 h1 w1 ...], t appended, repeat_interleave(2); rotate_half_text (interleaved).
// So pair 2k is h at frequency k, pair 2k+1 is w at frequency 22 + k: the descriptor permutes
// inv_freq as well as mapping streams.
ModelCase ernie_case() {
  ModelCase c{.name = "ERNIE-4.5-VL"};
  const std::vector<double> f = hf_inv_freq(500000.0, 128);
  std::vector<double> inv_freq(64);
  std::vector<int> map(64);
  for (int j = 0; j < 64; ++j) {
    if (j < 44) {
      map[static_cast<size_t>(j)] = j % 2 == 0 ? 1 : 2;
      inv_freq[static_cast<size_t>(j)] = j % 2 == 0 ? f[static_cast<size_t>(j / 2)] : f[static_cast<size_t>(22 + j / 2)];
    } else {
      map[static_cast<size_t>(j)] = 0;
      inv_freq[static_cast<size_t>(j)] = f[static_cast<size_t>(j)];
    }
  }
  c.schedule = Schedule{.head_dim = 128, .rotary_dim = 128, .pairing = Pairing::interleaved, .inv_freq = inv_freq,
                        .streams = 3, .pair_stream = map};
  const int64_t tokens = c.batch * c.seq;
  c.positions = mrope_positions(tokens, 3);
  c.formula = [positions = c.positions, f, tokens](const std::vector<double>& q, int64_t t) {
    struct Angle { int stream; int64_t freq; };
    const std::vector<int64_t> split = {22, 22, 20};
    std::vector<std::vector<Angle>> chunks(3);  // freq_h, freq_w, freq_t
    int64_t first = 0;
    for (int i = 0; i < 3; ++i) {
      for (int64_t n = 0; n < split[static_cast<size_t>(i)]; ++n) chunks[static_cast<size_t>(i)].push_back({(i + 1) % 3, first + n});
      first += split[static_cast<size_t>(i)];
    }
    std::vector<Angle> hwt;
    for (size_t k = 0; k < chunks[0].size(); ++k) {  // stack([h, w], -1).flatten(-2)
      hwt.push_back(chunks[0][k]);
      hwt.push_back(chunks[1][k]);
    }
    hwt.insert(hwt.end(), chunks[2].begin(), chunks[2].end());
    std::vector<double> out(q.size());
    for (int64_t j = 0; j < 128; ++j) {
      const Angle a = hwt[static_cast<size_t>(j / 2)];  // repeat_interleave(2)
      const Exact e = exact(positions[static_cast<size_t>(a.stream * tokens + t)], f[static_cast<size_t>(a.freq)]);
      const double rotated = j % 2 == 0 ? -q[static_cast<size_t>(j + 1)] : q[static_cast<size_t>(j - 1)];
      out[static_cast<size_t>(j)] = q[static_cast<size_t>(j)] * e.cos + rotated * e.sin;
    }
    return out;
  };
  return c;
}

TEST_P(DescriptorModels, Ernie45VlHeightWidthStackedTimeLast) { check_model(ernie_case()); }

// A 4 x 5 patch grid (row-major) and (far) one token near 2^31, as [h, w] streams.
std::vector<int32_t> grid_positions(int64_t tokens, bool far = true) {
  std::vector<int32_t> p(static_cast<size_t>(2 * tokens));
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t patch = t % 20;
    p[static_cast<size_t>(t)] = static_cast<int32_t>(patch / 5);
    p[static_cast<size_t>(tokens + t)] = static_cast<int32_t>(patch % 5);
  }
  if (far) {
    p[static_cast<size_t>(tokens - 1)] = static_cast<int32_t>(max_position_limit - 1);
    p[static_cast<size_t>(2 * tokens - 1)] = static_cast<int32_t>(max_position_limit - 2);
  }
  return p;
}

// Pixtral (PixtralRotaryEmbedding): freqs = 1/θ^(arange(0, D, 2)/D); freqs_h = outer(h, freqs[::2]),
// freqs_w = outer(w, freqs[1::2]); inv_freq = cat(freqs_h, freqs_w), then cat((inv_freq, inv_freq)),
// cos/sin, rotate_half.
ModelCase pixtral_case() {
  ModelCase c{.name = "Pixtral"};
  const int64_t D = 64;
  const std::vector<double> freqs = hf_inv_freq(10000.0, D);
  std::vector<double> inv_freq;
  std::vector<int> map;
  for (int64_t k = 0; k < D / 4; ++k) { inv_freq.push_back(freqs[static_cast<size_t>(2 * k)]); map.push_back(0); }
  for (int64_t k = 0; k < D / 4; ++k) { inv_freq.push_back(freqs[static_cast<size_t>(2 * k + 1)]); map.push_back(1); }
  c.schedule = Schedule{.head_dim = D, .rotary_dim = D, .pairing = Pairing::half, .inv_freq = inv_freq,
                        .streams = 2, .pair_stream = map};
  c.seq = 11;
  const int64_t tokens = c.batch * c.seq;
  c.positions = grid_positions(tokens);
  c.formula = [positions = c.positions, freqs, tokens, D](const std::vector<double>& q, int64_t t) {
    const double h = positions[static_cast<size_t>(t)], w = positions[static_cast<size_t>(tokens + t)];
    std::vector<Exact> half;  // cat(freqs_h, freqs_w)
    for (size_t i = 0; i < freqs.size(); i += 2) half.push_back(exact(h, freqs[i]));      // freqs[::2]
    for (size_t i = 1; i < freqs.size(); i += 2) half.push_back(exact(w, freqs[i]));      // freqs[1::2]
    std::vector<double> out(q.size());
    for (int64_t j = 0; j < D; ++j) {
      const Exact e = half[static_cast<size_t>(j % (D / 2))];
      const double rotated = j < D / 2 ? -q[static_cast<size_t>(j + D / 2)] : q[static_cast<size_t>(j - D / 2)];
      out[static_cast<size_t>(j)] = q[static_cast<size_t>(j)] * e.cos + rotated * e.sin;
    }
    return out;
  };
  return c;
}

TEST_P(DescriptorModels, PixtralEvenFrequenciesToHeightOddToWidth) { check_model(pixtral_case()); }

// Qwen2-VL's vision tower (VisionRotaryEmbedding(dim = D/2)): inv_freq = 1/θ^(arange(0, D/2, 2)/(D/2));
// rotary_pos_emb = table[pos_ids].flatten(1) = [h * inv_freq, w * inv_freq]; emb = cat(rpe, rpe);
// q * cos + rotate_half(q) * sin (apply_rotary_pos_emb_vision). The index restarts for w.
ModelCase qwen_vit_case() {
  ModelCase c{.name = "Qwen-ViT axial"};
  const int64_t D = 80;
  const std::vector<double> theta = hf_inv_freq(10000.0, D / 2);  // D/4 values
  std::vector<double> inv_freq = theta;
  inv_freq.insert(inv_freq.end(), theta.begin(), theta.end());
  std::vector<int> map(static_cast<size_t>(D / 2), 0);
  for (int64_t j = D / 4; j < D / 2; ++j) map[static_cast<size_t>(j)] = 1;
  c.schedule = Schedule{.head_dim = D, .rotary_dim = D, .pairing = Pairing::half, .inv_freq = inv_freq,
                        .streams = 2, .pair_stream = map};
  c.seq = 11;
  const int64_t tokens = c.batch * c.seq;
  c.positions = grid_positions(tokens);
  c.formula = [positions = c.positions, theta, tokens, D](const std::vector<double>& q, int64_t t) {
    const double pos_ids[2] = {double(positions[static_cast<size_t>(t)]), double(positions[static_cast<size_t>(tokens + t)])};
    std::vector<Exact> rpe;  // flatten(1) of [2, D/4]
    for (int axis = 0; axis < 2; ++axis)
      for (double f : theta) rpe.push_back(exact(pos_ids[axis], f));
    std::vector<double> out(q.size());
    for (int64_t j = 0; j < D; ++j) {
      const Exact e = rpe[static_cast<size_t>(j % (D / 2))];
      const double rotated = j < D / 2 ? -q[static_cast<size_t>(j + D / 2)] : q[static_cast<size_t>(j - D / 2)];
      out[static_cast<size_t>(j)] = q[static_cast<size_t>(j)] * e.cos + rotated * e.sin;
    }
    return out;
  };
  return c;
}

TEST_P(DescriptorModels, QwenVitAxialIndexRestarts) { check_model(qwen_vit_case()); }

// Llama 4's vision tower (Llama4VisionRotaryEmbedding): img_idx = arange(side^2) plus a CLS token
// (-2); x = idx % side, y = idx // side; rope_freq = 1/θ^(arange(0, D/2, 2)[:D/4]/(D/2));
// freqs_x = ((x + 1) * rope_freq).repeat_interleave(2), freqs_y likewise; freqs = cat(x, y)[..., ::2];
// CLS masked to 0; q viewed as complex pairs (2i, 2i+1) times e^{i freqs}.
ModelCase llama4_vision_case() {
  ModelCase c{.name = "Llama-4 vision"};
  const int64_t D = 88, side = 4;
  const std::vector<double> rope_freq = hf_inv_freq(10000.0, D / 2);  // D/4 values
  std::vector<double> inv_freq = rope_freq;
  inv_freq.insert(inv_freq.end(), rope_freq.begin(), rope_freq.end());
  std::vector<int> map(static_cast<size_t>(D / 2), 0);
  for (int64_t j = D / 4; j < D / 2; ++j) map[static_cast<size_t>(j)] = 1;
  c.schedule = Schedule{.head_dim = D, .rotary_dim = D, .pairing = Pairing::interleaved, .inv_freq = inv_freq,
                        .streams = 2, .pair_stream = map};
  c.batch = 1;
  c.seq = side * side + 1;
  std::vector<int64_t> img_idx;
  for (int64_t i = 0; i < side * side; ++i) img_idx.push_back(i);
  img_idx.push_back(-2);  // ID_CLS_TOKEN
  const int64_t tokens = c.seq;
  c.positions.resize(static_cast<size_t>(2 * tokens));
  for (int64_t t = 0; t < tokens; ++t) {  // the API's positions: 1-based (x, y), CLS at 0
    const int64_t idx = img_idx[static_cast<size_t>(t)];
    c.positions[static_cast<size_t>(t)] = idx < 0 ? 0 : static_cast<int32_t>(idx % side + 1);
    c.positions[static_cast<size_t>(tokens + t)] = idx < 0 ? 0 : static_cast<int32_t>(idx / side + 1);
  }
  c.formula = [img_idx, rope_freq, D, side](const std::vector<double>& q, int64_t t) {
    const int64_t idx = img_idx[static_cast<size_t>(t)];
    // the model computes with the CLS index too, then masks: idx % side of -2 is irrelevant
    const double x = static_cast<double>(((idx % side) + side) % side + 1);
    const double y = static_cast<double>(idx / side + 1);
    std::vector<std::pair<double, double>> freqs_x, freqs_y, freqs;  // (position, frequency)
    for (double f : rope_freq) { freqs_x.push_back({x, f}); freqs_x.push_back({x, f}); }
    for (double f : rope_freq) { freqs_y.push_back({y, f}); freqs_y.push_back({y, f}); }
    std::vector<std::pair<double, double>> cat = freqs_x;
    cat.insert(cat.end(), freqs_y.begin(), freqs_y.end());
    for (size_t i = 0; i < cat.size(); i += 2) freqs.push_back(cat[i]);  // [..., ::2]
    std::vector<double> out(q.size());
    for (int64_t i = 0; i < D / 2; ++i) {
      const Exact e = idx < 0 ? Exact{1.0, 0.0} : exact(freqs[static_cast<size_t>(i)].first, freqs[static_cast<size_t>(i)].second);
      const double re = q[static_cast<size_t>(2 * i)], im = q[static_cast<size_t>(2 * i + 1)];
      out[static_cast<size_t>(2 * i)] = re * e.cos - im * e.sin;
      out[static_cast<size_t>(2 * i + 1)] = re * e.sin + im * e.cos;
    }
    return out;
  };
  return c;
}

TEST_P(DescriptorModels, Llama4VisionOneBasedWithClsIdentity) { check_model(llama4_vision_case()); }

// Gemma 4's vision tower (apply_multidimensional_rope): the head split in ndim = 2 parts of
// ch = 2 * (D // (2 * ndim)) channels, part d rotated alone by positions[..., d] with
// timescale = base ** ((2 / ch) * arange(ch / 2)), sinusoid = p / timescale, cat(cos, cos),
// rotate_half inside the part. The descriptor: block_half(2), inv_freq = 1 / timescale in double.
// The oracle divides (as the model does), so f64 allows the reciprocal's rounding.
ModelCase gemma4_vision_case() {
  ModelCase c{.name = "Gemma-4 vision"};
  const int64_t D = 72, ndim = 2, ch = 2 * (D / (2 * ndim));
  std::vector<double> timescale;
  for (int64_t i = 0; i < ch / 2; ++i) timescale.push_back(std::pow(100.0, (2.0 / ch) * i));
  std::vector<double> inv_freq;
  std::vector<int> map;
  for (int64_t d = 0; d < ndim; ++d)
    for (double ts : timescale) { inv_freq.push_back(1.0 / ts); map.push_back(static_cast<int>(d)); }
  c.schedule = Schedule{.head_dim = D, .rotary_dim = D, .pairing = Pairing::half, .inv_freq = inv_freq,
                        .blocks = 2, .streams = 2, .pair_stream = map};
  c.seq = 11;
  const int64_t tokens = c.batch * c.seq;
  // p * (1/ts) against the model's p / ts: the reciprocal's rounding times p (p < 20 on the grid)
  c.positions = grid_positions(tokens, /*far=*/false);
  c.f64_unit = 0x1p-46;
  c.formula = [positions = c.positions, timescale, tokens, D, ndim, ch](const std::vector<double>& x, int64_t t) {
    std::vector<double> out(x.size());
    for (int64_t d = 0; d < ndim; ++d) {
      const double p = positions[static_cast<size_t>(d * tokens + t)];
      for (int64_t j = 0; j < ch; ++j) {
        const Exact e = exact(p, timescale[static_cast<size_t>(j % (ch / 2))], /*divide=*/true);
        const int64_t at = d * ch + j;
        const double rotated = j < ch / 2 ? -x[static_cast<size_t>(at + ch / 2)] : x[static_cast<size_t>(at - ch / 2)];
        out[static_cast<size_t>(at)] = x[static_cast<size_t>(at)] * e.cos + rotated * e.sin;
      }
    }
    for (int64_t j = ndim * ch; j < D; ++j) out[static_cast<size_t>(j)] = x[static_cast<size_t>(j)];
    return out;
  };
  return c;
}

TEST_P(DescriptorModels, Gemma4VisionBlockHalf) { check_model(gemma4_vision_case()); }

// proportional (Gemma 4 full attention): half over the whole head, inv_freq[j] = θ^(-2j/D) for
// j < int(p D / 2), 0 after; transformers multiplies cos(0) = 1 and sin(0) = 0 by the attention
// factor, so the zero tail is the identity times g.
ModelCase proportional_case(double g) {
  ModelCase c{.name = "proportional g=" + std::to_string(g)};
  const int64_t D = 64, nonzero = static_cast<int64_t>(0.25 * D / 2);
  std::vector<double> inv_freq = hf_inv_freq(1e6, D);
  for (int64_t j = nonzero; j < D / 2; ++j) inv_freq[static_cast<size_t>(j)] = 0.0;
  c.schedule = Schedule{.head_dim = D, .rotary_dim = D, .pairing = Pairing::half, .inv_freq = inv_freq,
                        .attention_factor = g};
  const int64_t tokens = c.batch * c.seq;
  for (int64_t t = 0; t < tokens; ++t) c.positions.push_back(t == 3 ? int32_t(max_position_limit - 1) : int32_t(t * 997));
  c.formula = [positions = c.positions, inv_freq, g, D](const std::vector<double>& q, int64_t t) {
    std::vector<double> out(q.size());
    for (int64_t j = 0; j < D; ++j) {
      const double f = inv_freq[static_cast<size_t>(j % (D / 2))];
      const Exact e = f == 0 ? Exact{1.0, 0.0} : exact(positions[static_cast<size_t>(t)], f);
      const double rotated = j < D / 2 ? -q[static_cast<size_t>(j + D / 2)] : q[static_cast<size_t>(j - D / 2)];
      out[static_cast<size_t>(j)] = g * (q[static_cast<size_t>(j)] * e.cos + rotated * e.sin);
    }
    return out;
  };
  return c;
}

TEST_P(DescriptorModels, ProportionalZeroFrequenciesAreIdentityTimesFactor) {
  check_model(proportional_case(1.0));
  check_model(proportional_case(1.25));
  // g = 1: the unturned pairs come back bit for bit at any position, on every path.
  const ModelCase c = proportional_case(1.0);
  const std::vector<float> x = test::random_floats(static_cast<size_t>(c.batch * c.seq * 64), 5);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    std::vector<float> y = x;
    apply(c.schedule, {.q = TensorView::bshd(y.data(), DType::f32, c.batch, c.seq, 1, 64),
                       .positions = Positions::per_token(std::span<const int32_t>(c.positions)), .backend = backend});
    for (int64_t t = 0; t < c.batch * c.seq; ++t)
      for (int64_t j = 8; j < 32; ++j)
        for (int64_t ch : {j, j + 32}) ASSERT_EQ(y[static_cast<size_t>(t * 64 + ch)], x[static_cast<size_t>(t * 64 + ch)]) << t << " " << ch;
  }
}

// Nope-first (DeepSeek-V4) and a slice in the middle: the standard formula on channels
// [off, off + r), everything else passes through.
ModelCase offset_case(Pairing pairing, int64_t offset) {
  ModelCase c{.name = std::string("rotary_offset ") + std::string(to_string(pairing)) + " " + std::to_string(offset)};
  const int64_t D = 96, r = 32;
  const std::vector<double> inv_freq = hf_inv_freq(10000.0, r);
  c.schedule = Schedule{.head_dim = D, .rotary_dim = r, .pairing = pairing, .inv_freq = inv_freq, .rotary_offset = offset};
  const int64_t tokens = c.batch * c.seq;
  for (int64_t t = 0; t < tokens; ++t) c.positions.push_back(int32_t(max_position_limit - 1 - t * 3));
  c.formula = [positions = c.positions, inv_freq, pairing, offset, r](const std::vector<double>& q, int64_t t) {
    std::vector<double> out = q;
    for (int64_t i = 0; i < r / 2; ++i) {
      const int64_t a = offset + (pairing == Pairing::interleaved ? 2 * i : i);
      const int64_t b = offset + (pairing == Pairing::interleaved ? 2 * i + 1 : i + r / 2);
      const Exact e = exact(positions[static_cast<size_t>(t)], inv_freq[static_cast<size_t>(i)]);
      out[static_cast<size_t>(a)] = q[static_cast<size_t>(a)] * e.cos - q[static_cast<size_t>(b)] * e.sin;
      out[static_cast<size_t>(b)] = q[static_cast<size_t>(a)] * e.sin + q[static_cast<size_t>(b)] * e.cos;
    }
    return out;
  };
  return c;
}

TEST_P(DescriptorModels, RotaryOffsetSliceAtTheEndOrInside) {
  for (Pairing pairing : {Pairing::half, Pairing::interleaved}) {
    for (int64_t offset : {int64_t{64}, int64_t{17 * 2}, int64_t{1}}) {
      check_model(offset_case(pairing, offset));
      if (HasFatalFailure()) return;
    }
  }
}

// ---- properties ----

// Channels outside the slice, any bit pattern: untouched in place, copied out of place, left
// alone out of place with copy_tail = false (channels before the slice as well as after it).
TEST_P(DescriptorModels, RotaryOffsetPassThroughBits) {
  Schedule s{.head_dim = 40, .rotary_dim = 16, .pairing = Pairing::half, .inv_freq = hf_inv_freq(10000.0, 16),
             .rotary_offset = 24};
  const int64_t n = 2 * 3 * 40;
  std::vector<uint32_t> bits(static_cast<size_t>(n));
  std::mt19937 rng(4);
  for (auto& b : bits) b = rng();
  std::vector<float> in(bits.size());
  std::memcpy(in.data(), bits.data(), bits.size() * 4);
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t j = 24; j < 40; ++j) in[static_cast<size_t>(t * 40 + j)] = static_cast<float>(j) - 30.5f;
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    std::vector<float> x = in, out(in.size(), 0.0f), kept(in.size(), 0.0f);
    apply(s, {.q = TensorView::bshd(x.data(), DType::f32, 2, 3, 1, 40), .positions = Positions::sequential(7), .backend = backend});
    apply(s, {.q = TensorView::bshd(in.data(), DType::f32, 2, 3, 1, 40),
              .q_out = TensorView::bshd(out.data(), DType::f32, 2, 3, 1, 40), .positions = Positions::sequential(7), .backend = backend});
    apply(s, {.q = TensorView::bshd(in.data(), DType::f32, 2, 3, 1, 40),
              .q_out = TensorView::bshd(kept.data(), DType::f32, 2, 3, 1, 40), .positions = Positions::sequential(7),
              .copy_tail = false, .backend = backend});
    for (int64_t t = 0; t < 6; ++t) {
      for (int64_t j = 0; j < 24; ++j) {
        const size_t e = static_cast<size_t>(t * 40 + j);
        EXPECT_EQ(std::bit_cast<uint32_t>(x[e]), bits[e]) << "in place channel " << j;
        EXPECT_EQ(std::bit_cast<uint32_t>(out[e]), bits[e]) << "out of place channel " << j;
        EXPECT_EQ(kept[e], 0.0f) << "copy_tail=false channel " << j;
      }
      for (int64_t j = 24; j < 40; ++j) {
        const size_t e = static_cast<size_t>(t * 40 + j);
        EXPECT_NE(x[e], in[e]) << "rotated channel " << j << " token " << t;
        EXPECT_EQ(x[e], out[e]);
        EXPECT_EQ(x[e], kept[e]);
      }
    }
  }
}

// rotary_offset = off equals the offset-0 schedule of head_dim r applied to the view that starts
// at channel off (bit for bit: the same pairs, angles and arithmetic).
TEST_P(DescriptorModels, RotaryOffsetEqualsTheSubView) {
  for (Pairing pairing : {Pairing::half, Pairing::interleaved}) {
    const int64_t D = 72, r = 24, off = 48, b = 2, seq = 9, h = 3;
    Schedule with{.head_dim = D, .rotary_dim = r, .pairing = pairing, .inv_freq = hf_inv_freq(5e5, r), .rotary_offset = off};
    Schedule sub{.head_dim = r, .rotary_dim = r, .pairing = pairing, .inv_freq = hf_inv_freq(5e5, r)};
    const std::vector<float> x = test::random_floats(static_cast<size_t>(b * seq * h * D), 8);
    for (Backend backend : {Backend::reference, Backend::cpu}) {
      for (bool on_the_fly : {true, false}) {
        const Table t1 = Table::range(with, 1000, seq), t2 = Table::range(sub, 1000, seq);
        std::vector<float> y1 = x, y2 = x;
        apply(with, {.q = TensorView::bshd(y1.data(), DType::f32, b, seq, h, D), .positions = Positions::sequential(1000),
                     .table = on_the_fly ? nullptr : &t1, .backend = backend});
        apply(sub, {.q = TensorView{.data = y2.data() + off, .dtype = DType::f32, .shape = {b, seq, h, r},
                                    .strides = {seq * h * D, h * D, D, 1}},
                    .positions = Positions::sequential(1000), .table = on_the_fly ? nullptr : &t2, .backend = backend});
        ASSERT_EQ(y1, y2) << to_string(pairing) << (on_the_fly ? " on the fly" : " table");
        ASSERT_NE(y1, x);
      }
    }
  }
}

// block_half(B) equals half pairing applied block by block: block k is a half schedule of width w
// over channels [k w, (k + 1) w) with its own frequencies and stream.
TEST_P(DescriptorModels, BlockHalfIsHalfPairingPerBlock) {
  const int64_t B = 3, w = 20, D = B * w + 6, b = 2, seq = 5, h = 2, tokens = b * seq;
  std::vector<double> inv_freq;
  std::vector<int> map;
  for (int64_t k = 0; k < B; ++k)
    for (int64_t i = 0; i < w / 2; ++i) {
      inv_freq.push_back(std::pow(100.0 + 50.0 * k, -2.0 * i / w));
      map.push_back(static_cast<int>((k + 1) % B));
    }
  const Schedule s{.head_dim = D, .rotary_dim = B * w, .pairing = Pairing::half, .inv_freq = inv_freq, .blocks = B,
                   .streams = static_cast<int>(B), .pair_stream = map};
  std::vector<int32_t> pos(static_cast<size_t>(B * tokens));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>((i * 7919 + 5) % 100000);
  const std::vector<float> x = test::random_floats(static_cast<size_t>(tokens * h * D), 9);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    std::vector<float> whole = x, blocks = x;
    apply(s, {.q = TensorView::bshd(whole.data(), DType::f32, b, seq, h, D),
              .positions = Positions::per_token(std::span<const int32_t>(pos), B), .backend = backend});
    for (int64_t k = 0; k < B; ++k) {
      const Schedule part{.head_dim = w, .rotary_dim = w, .pairing = Pairing::half,
                          .inv_freq = std::vector<double>(inv_freq.begin() + k * w / 2, inv_freq.begin() + (k + 1) * w / 2)};
      const int stream = map[static_cast<size_t>(k * w / 2)];
      apply(part, {.q = TensorView{.data = blocks.data() + k * w, .dtype = DType::f32, .shape = {b, seq, h, w},
                                   .strides = {seq * h * D, h * D, D, 1}},
                   .positions = Positions::per_token(std::span<const int32_t>(pos).subspan(static_cast<size_t>(stream * tokens),
                                                                                          static_cast<size_t>(tokens))),
                   .backend = backend});
    }
    ASSERT_EQ(whole, blocks) << (backend == Backend::cpu ? "cpu" : "reference");
  }
}

// Layout equivalence: block_half on x equals half pairing (pair j on (j, j + r/2), same frequency
// and stream per pair) on x permuted so that block k's halves land at pair j's two channels.
TEST_P(DescriptorModels, BlockHalfEqualsHalfUnderTheChannelPermutation) {
  const int64_t B = 2, r = 48, w = r / B, D = 52, b = 1, seq = 7, h = 3, tokens = b * seq;
  std::vector<double> inv_freq;
  std::vector<int> map;
  for (int64_t j = 0; j < r / 2; ++j) {
    inv_freq.push_back(std::pow(100.0, -2.0 * (j % (w / 2)) / w));
    map.push_back(static_cast<int>(j / (w / 2)));
  }
  const Schedule blocked{.head_dim = D, .rotary_dim = r, .pairing = Pairing::half, .inv_freq = inv_freq, .blocks = B,
                         .streams = 2, .pair_stream = map};
  Schedule half = blocked;
  half.blocks = 1;
  // source channel of the half layout: pair j = k (w/2) + i sits at (j, j + r/2) in the half layout
  // and at (k w + i, k w + i + w/2) in the block layout.
  std::vector<int64_t> to_half(static_cast<size_t>(D));
  for (int64_t j = 0; j < D; ++j) to_half[static_cast<size_t>(j)] = j;
  for (int64_t j = 0; j < r / 2; ++j) {
    const int64_t k = j / (w / 2), i = j % (w / 2);
    to_half[static_cast<size_t>(k * w + i)] = j;
    to_half[static_cast<size_t>(k * w + i + w / 2)] = j + r / 2;
  }
  std::vector<int32_t> pos = {3, 9, 27, 81, 243, 729, 2187, 5, 6, 7, 8, 9, 10, int32_t(max_position_limit - 1)};
  const std::vector<float> x = test::random_floats(static_cast<size_t>(tokens * h * D), 10);
  std::vector<float> xp(x.size());
  for (int64_t t = 0; t < tokens * h; ++t)
    for (int64_t j = 0; j < D; ++j) xp[static_cast<size_t>(t * D + to_half[static_cast<size_t>(j)])] = x[static_cast<size_t>(t * D + j)];
  std::vector<int64_t> rows(pos.begin(), pos.end());
  const Table tb = Table::at(blocked, rows), th = Table::at(half, rows);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    for (bool use_table : {false, true}) {
      std::vector<float> yb = x, yh = xp;
      apply(blocked, {.q = TensorView::bshd(yb.data(), DType::f32, b, seq, h, D),
                      .positions = Positions::per_token(std::span<const int32_t>(pos), 2),
                      .table = use_table ? &tb : nullptr, .backend = backend});
      apply(half, {.q = TensorView::bshd(yh.data(), DType::f32, b, seq, h, D),
                   .positions = Positions::per_token(std::span<const int32_t>(pos), 2),
                   .table = use_table ? &th : nullptr, .backend = backend});
      for (int64_t t = 0; t < tokens * h; ++t)
        for (int64_t j = 0; j < D; ++j)
          ASSERT_EQ(yh[static_cast<size_t>(t * D + to_half[static_cast<size_t>(j)])], yb[static_cast<size_t>(t * D + j)])
              << "row " << t << " channel " << j << (use_table ? " table" : " on the fly");
    }
  }
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double acc = 0;
  for (size_t j = 0; j < a.size(); ++j) acc += a[j] * b[j];
  return acc;
}

// q_m . k_n depends, stream by stream, only on the differences of the positions: shifting q and k
// by the same amount in one stream keeps every score; changing one stream's difference changes it.
TEST(DescriptorProperties, RelativePositionInvariancePerStream) {
  for (const ModelCase& c : {qwen2_vl_case(), glm4v_case(), ernie_case(), gemma4_vision_case()}) {
    const Schedule& s = c.schedule;
    const int S = s.streams;
    const int64_t d = s.head_dim;
    const std::vector<double> q0 = test::random_doubles(static_cast<size_t>(d), 1);
    const std::vector<double> k0 = test::random_doubles(static_cast<size_t>(d), 2);
    const double scale = std::sqrt(dot(q0, q0) * dot(k0, k0));
    auto score = [&](const std::vector<int64_t>& m, const std::vector<int64_t>& n) {
      std::vector<double> q = q0, k = k0;
      apply(s, {.q = TensorView::bshd(q.data(), DType::f64, 1, 1, 1, d), .positions = Positions::per_token(std::span<const int64_t>(m), S)});
      apply(s, {.q = TensorView::bshd(k.data(), DType::f64, 1, 1, 1, d), .positions = Positions::per_token(std::span<const int64_t>(n), S)});
      return dot(q, k);
    };
    std::vector<int64_t> m = {5, 17, 40}, n = {9, 3, 41};
    m.resize(static_cast<size_t>(S));
    n.resize(static_cast<size_t>(S));
    const double base = score(m, n);
    std::mt19937_64 rng(6);
    std::uniform_int_distribution<int64_t> shift(0, max_position_limit - 100);
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<int64_t> m2 = m, n2 = n;
      for (int k = 0; k < S; ++k) {
        const int64_t sh = shift(rng);
        m2[static_cast<size_t>(k)] += sh;
        n2[static_cast<size_t>(k)] += sh;
      }
      EXPECT_NEAR(score(m2, n2), base, 1e-13 * scale * 64) << c.name << " trial " << trial;
    }
    for (int k = 0; k < S; ++k) {  // one stream's difference moves: the score moves
      std::vector<int64_t> n2 = n;
      n2[static_cast<size_t>(k)] += 1000;
      EXPECT_GT(std::fabs(score(m, n2) - base), 1e-6 * scale) << c.name << " stream " << k << " is ignored";
    }
  }
}

// Norms kept, and the inverse undoes the forward, for multi-stream, block_half, offset schedules.
TEST(DescriptorProperties, NormPreservedAndInverseUndoesForward) {
  for (const ModelCase& c : {qwen3_vl_case(), glm4v_case(), gemma4_vision_case(), offset_case(Pairing::half, 64)}) {
    const Schedule& s = c.schedule;
    const int64_t d = s.head_dim, tokens = c.batch * c.seq, h = 3;
    const std::vector<float> original = test::random_floats(static_cast<size_t>(tokens * h * d), 9);
    for (Backend backend : {Backend::reference, Backend::cpu}) {
      std::vector<float> x = original;
      const auto view = TensorView::bshd(x.data(), DType::f32, c.batch, c.seq, h, d);
      const Positions positions = Positions::per_token(std::span<const int32_t>(c.positions), s.streams);
      apply(s, {.q = view, .positions = positions, .backend = backend});
      EXPECT_NE(x, original) << c.name;
      for (int64_t t = 0; t < tokens * h; ++t) {
        double before = 0, after = 0;
        for (int64_t j = 0; j < d; ++j) {
          before += double(original[static_cast<size_t>(t * d + j)]) * original[static_cast<size_t>(t * d + j)];
          after += double(x[static_cast<size_t>(t * d + j)]) * x[static_cast<size_t>(t * d + j)];
        }
        EXPECT_NEAR(std::sqrt(after), std::sqrt(before), 4 * 0x1p-23 * std::sqrt(before)) << c.name << " row " << t;
      }
      apply(s, {.q = view, .positions = positions, .direction = Direction::inverse, .backend = backend});
      for (size_t j = 0; j < x.size(); ++j) {
        ASSERT_NEAR(x[j], original[j], 4 * 0x1p-23 * (std::fabs(original[j]) + 4)) << c.name << " " << j;
      }
    }
  }
}

// ---- positions ----

// One schedule of three streams, a few tokens; the result of apply for given positions.
Schedule three_streams() {
  return Schedule{.head_dim = 24, .rotary_dim = 20, .pairing = Pairing::half, .inv_freq = hf_inv_freq(10000.0, 20),
                  .rotary_offset = 2, .streams = 3, .pair_stream = {0, 1, 2, 0, 1, 2, 2, 1, 0, 1}};
}

template <class T>
std::vector<float> rotate_with(const Schedule& s, const std::vector<T>& pos, int streams, int64_t batch, int64_t seq,
                               Backend backend, const Table* table = nullptr) {
  std::vector<float> x = test::random_floats(static_cast<size_t>(batch * seq * 2 * s.head_dim), 3);
  apply(s, {.q = TensorView::bshd(x.data(), DType::f32, batch, seq, 2, s.head_dim),
            .positions = Positions::per_token(std::span<const T>(pos), streams), .table = table, .backend = backend});
  return x;
}

TEST_P(DescriptorModels, PositionKindsOfWholeNumbersGiveTheSameBits) {
  const Schedule s = three_streams();
  const std::vector<int64_t> p64 = {0, 1, 2, 16777216, 100, 5, 7, 9, 11, 13, 2147483520, 3, 4, 6, 8, 10, 12, 14};
  std::vector<int32_t> p32(p64.begin(), p64.end());
  std::vector<float> pf(p64.begin(), p64.end());
  std::vector<double> pd(p64.begin(), p64.end());
  const Table table = Table::at(s, p64);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    for (const Table* t : {static_cast<const Table*>(nullptr), &table}) {
      const std::vector<float> want = rotate_with(s, p64, 3, 2, 3, backend, t);
      EXPECT_EQ(rotate_with(s, p32, 3, 2, 3, backend, t), want);
      EXPECT_EQ(rotate_with(s, pf, 3, 2, 3, backend, t), want);
      EXPECT_EQ(rotate_with(s, pd, 3, 2, 3, backend, t), want);
    }
  }
}

// A [S, 1, seq] array serves every batch row; a single stream serves every stream of the
// schedule (text tokens of an M-RoPE model: t = h = w); sequential equals its per-token array.
TEST_P(DescriptorModels, BroadcastRowsStreamsAndSequential) {
  const Schedule s = three_streams();
  const int64_t batch = 3, seq = 4;
  const std::vector<int32_t> row = {7, 8, 9, 10, 70, 80, 90, 100, 700, 800, 900, 1000};  // [3, 1, 4]
  std::vector<int32_t> full;
  for (int k = 0; k < 3; ++k)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < seq; ++t) full.push_back(row[static_cast<size_t>(k * seq + t)]);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    EXPECT_EQ(rotate_with(s, row, 3, batch, seq, backend), rotate_with(s, full, 3, batch, seq, backend));
    // one stream [1, batch, seq] for a 3-stream schedule = the same positions in all three
    const std::vector<int32_t> one = {5, 6, 7, 8, 50, 60, 70, 80, 500, 600, 700, max_position_limit - 1};
    std::vector<int32_t> three;
    for (int k = 0; k < 3; ++k) three.insert(three.end(), one.begin(), one.end());
    EXPECT_EQ(rotate_with(s, one, 1, batch, seq, backend), rotate_with(s, three, 3, batch, seq, backend));
    // sequential with an offset: every stream at offset + s
    std::vector<int32_t> seqpos;
    for (int k = 0; k < 3; ++k)
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t t = 0; t < seq; ++t) seqpos.push_back(static_cast<int32_t>(max_position_limit - seq + t));
    std::vector<float> x = test::random_floats(static_cast<size_t>(batch * seq * 2 * s.head_dim), 3);
    apply(s, {.q = TensorView::bshd(x.data(), DType::f32, batch, seq, 2, s.head_dim),
              .positions = Positions::sequential(max_position_limit - seq), .backend = backend});
    EXPECT_EQ(x, rotate_with(s, seqpos, 3, batch, seq, backend));
    // and a 3-stream schedule at t = h = w equals the single-stream one with the same pairs
    Schedule single = s;
    single.streams = 1;
    single.pair_stream.clear();
    EXPECT_EQ(rotate_with(single, one, 1, batch, seq, backend), rotate_with(s, three, 3, batch, seq, backend));
  }
}

// Fractional positions (Qwen3-Omni): pair j turns by the real number p * inv_freq[j], p the
// float's or double's exact value. f64 within a few double roundings of MPFR; f32 within the
// contract; and not the angle of a truncated or rounded position.
TEST_P(DescriptorModels, FractionalPositionsTurnByTheExactRealAngle) {
  const Schedule s = three_streams();
  const std::vector<double> pd = {0.5, 1.25, 2.75, 1000.125, 2147483646.5, 2147483647.75, 0.1, 1e-3, 3.0, 77777.7,
                                  123.456, 2147483520.0, 1.0 / 3, 2.0 / 3, 5.5, 6.5, 7.5, 8.5};
  const std::vector<float> pf = {0.5f, 1.25f, 2.75f, 1000.125f, 2147483520.0f, 16777217.0f, 0.1f, 1e-3f, 3.0f,
                                 77777.7f, 123.456f, 1.5f, 1.0f / 3, 2.0f / 3, 5.5f, 6.5f, 7.5f, 8.5f};
  const int64_t batch = 2, seq = 3, tokens = 6, d = s.head_dim;
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    for (bool as_float : {false, true}) {
      std::vector<double> p(tokens * 3);
      for (size_t i = 0; i < p.size(); ++i) p[i] = as_float ? double(pf[i]) : pd[i];
      const std::vector<double> x = test::random_doubles(static_cast<size_t>(tokens * d), 4);
      std::vector<double> y64 = x;
      std::vector<float> y32(x.begin(), x.end());
      const std::vector<float> x32 = y32;
      const Positions positions = as_float ? Positions::per_token(std::span<const float>(pf), 3)
                                           : Positions::per_token(std::span<const double>(pd), 3);
      apply(s, {.q = TensorView::bshd(y64.data(), DType::f64, batch, seq, 1, d), .positions = positions, .backend = backend});
      apply(s, {.q = TensorView::bshd(y32.data(), DType::f32, batch, seq, 1, d), .positions = positions, .backend = backend});
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t j = 0; j < s.pairs(); ++j) {
          const auto [a, b] = s.channels(j);
          const double pos = p[static_cast<size_t>(s.stream_of(j) * tokens + t)];
          const Exact e = exact(pos, s.inv_freq[static_cast<size_t>(j)]);
          const size_t ia = static_cast<size_t>(t * d + a), ib = static_cast<size_t>(t * d + b);
          const double wa = x[ia] * e.cos - x[ib] * e.sin, wb = x[ia] * e.sin + x[ib] * e.cos;
          const double unit = std::fabs(x[ia]) + std::fabs(x[ib]);
          const std::string where = std::string(as_float ? "float" : "double") + " token " + std::to_string(t) +
                                    " pair " + std::to_string(j) + " position " + std::to_string(pos);
          ASSERT_LE(std::fabs(y64[ia] - wa), 0x1p-50 * unit) << where;
          ASSERT_LE(std::fabs(y64[ib] - wb), 0x1p-50 * unit) << where;
          const double wa32 = x32[ia] * e.cos - x32[ib] * e.sin, wb32 = x32[ia] * e.sin + x32[ib] * e.cos;
          const double unit32 = std::fabs(x32[ia]) + std::fabs(x32[ib]);
          ASSERT_LE(std::fabs(y32[ia] - wa32), 0x1p-23 * unit32) << where;
          ASSERT_LE(std::fabs(y32[ib] - wb32), 0x1p-23 * unit32) << where;
          if (pos != std::floor(pos) && s.inv_freq[static_cast<size_t>(j)] * (pos - std::floor(pos)) > 1e-3) {
            const Exact tr = exact(std::floor(pos), s.inv_freq[static_cast<size_t>(j)]);
            EXPECT_GT(std::fabs(y64[ia] - (x[ia] * tr.cos - x[ib] * tr.sin)) + std::fabs(y64[ib] - (x[ia] * tr.sin + x[ib] * tr.cos)),
                      1e-9 * unit) << where << ": turned by the truncated position";
          }
        }
    }
  }
}

// A whole float position with a Table reads the table's row.
TEST(DescriptorPositions, WholeFloatPositionsWithATable) {
  const Schedule s = three_streams();
  std::vector<double> pd(18);
  for (size_t i = 0; i < pd.size(); ++i) pd[i] = static_cast<double>(i * 1000 + 1);
  std::vector<int64_t> rows(pd.begin(), pd.end());
  const Table table = Table::at(s, rows);
  EXPECT_EQ(rotate_with(s, pd, 3, 2, 3, Backend::cpu, &table), rotate_with(s, rows, 3, 2, 3, Backend::cpu, nullptr));
}

// ---- caller angles ----

// The doc's float32 rotation: a' = fma(a, c, -fl(b s)) if |fl(a c)| >= |fl(b s)|, else
// fma(-b, s, fl(a c)); b' likewise with (b, c, a, -s).
float rotate_minus(float x, float m, float w, float n) {
  const float p = x * m, q = w * n;
  return std::fabs(p) >= std::fabs(q) ? std::fmaf(x, m, -q) : std::fmaf(-w, n, p);
}

// A caller's tensor of any dtype: values, and where each (i0, i1, i2) sits.
struct AngleTensor {
  DType dtype;
  std::vector<unsigned char> bytes;
  std::array<int64_t, 3> shape;
  std::array<int64_t, 3> strides;
  int64_t base;
  double read(int64_t i0, int64_t i1, int64_t i2) const {
    const int64_t i = base + i0 * strides[0] + i1 * strides[1] + i2 * strides[2];
    const unsigned char* p = &bytes[static_cast<size_t>(i * size_of(dtype))];
    return test::load_element(dtype, p);
  }
  const void* data() const { return &bytes[static_cast<size_t>(base * size_of(dtype))]; }
};

// Random values (not a rotation: the kernel must take them as given); `strided` stores dims 0 and
// 1 transposed with the columns backwards and a gap after each. Every element the kernel must not
// read (the duplicate columns of halves/repeated, the gaps) is NaN.
AngleTensor make_angles(DType dtype, std::array<int64_t, 3> shape, bool strided, uint64_t seed,
                        const std::function<bool(int64_t)>& read_column) {
  AngleTensor a{.dtype = dtype, .shape = shape};
  const int64_t n0 = shape[0], n1 = shape[1], n2 = shape[2];
  int64_t size = n0 * n1 * n2;
  if (strided) {  // [n1, n0, 2 * n2] storage, columns backwards, every other column a gap
    a.strides = {2 * n2, n0 * 2 * n2, -2};
    a.base = 2 * n2 - 2;
    size = n0 * n1 * 2 * n2;
  } else {
    a.strides = {n1 * n2, n2, 1};
    a.base = 0;
  }
  a.bytes.resize(static_cast<size_t>(size * size_of(dtype)));
  Store fill(dtype, size);  // NaN everywhere
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.2, 1.2);
  for (int64_t i0 = 0; i0 < n0; ++i0)
    for (int64_t i1 = 0; i1 < n1; ++i1)
      for (int64_t i2 = 0; i2 < n2; ++i2)
        if (read_column(i2)) fill.set(a.base + i0 * a.strides[0] + i1 * a.strides[1] + i2 * a.strides[2], u(rng));
  std::memcpy(a.bytes.data(), fill.bytes.data(), a.bytes.size());
  return a;
}

int64_t column_of(CallerAngles::Columns columns, int64_t j) { return columns == CallerAngles::Columns::repeated ? 2 * j : j; }
bool is_read(CallerAngles::Columns columns, int64_t pairs, int64_t c) {
  switch (columns) {
    case CallerAngles::Columns::pairs: return true;
    case CallerAngles::Columns::halves: return c < pairs;
    case CallerAngles::Columns::repeated: return c % 2 == 0;
  }
  return false;
}

// Every dtype of data and of angles, each columns form, per_token (batch or 1) and per_position,
// contiguous and strided tensors, forward and inverse: f32 data equals the doc's float32
// rotation by the caller's values bit for bit (f16/bf16: that, rounded once); f64 data the double
// rotation by the widened values.
TEST_P(DescriptorModels, CallerAnglesAreUsedAsGiven) {
  using Columns = CallerAngles::Columns;
  using Index = CallerAngles::Index;
  int runs = 0;
  for (const ModelCase& c : {glm4v_case(), offset_case(Pairing::half, 64), gemma4_vision_case()}) {
    const Schedule& s = c.schedule;
    const int64_t P = s.pairs(), d = s.head_dim, batch = c.batch, seq = c.seq, tokens = batch * seq, h = 2;
    const int64_t rows = 40;
    std::vector<int32_t> rowpos(static_cast<size_t>(s.streams * tokens));  // per_position: rows < 40
    for (size_t i = 0; i < rowpos.size(); ++i) rowpos[i] = static_cast<int32_t>((i * 13 + 1) % rows);
    for (Index index : {Index::per_token, Index::per_position}) {
      for (Columns columns : {Columns::pairs, Columns::halves, Columns::repeated}) {
        for (DType angle_dtype : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
          for (bool strided : {false, true}) {
            const int64_t width = columns == Columns::pairs ? P : 2 * P;
            const int64_t first = index == Index::per_position ? 1 : (strided ? 1 : batch);  // strided: broadcast batch
            const int64_t second = index == Index::per_position ? rows : seq;
            const auto read = [&](int64_t col) { return is_read(columns, P, col); };
            const AngleTensor cos = make_angles(angle_dtype, {first, second, width}, strided, 21 + runs, read);
            const AngleTensor sin = make_angles(angle_dtype, {first, second, width}, !strided, 22 + runs, read);
            const CallerAngles angles{.index = index, .columns = columns, .cos = cos.data(), .sin = sin.data(),
                                      .dtype = angle_dtype, .shape = {first, second, width},
                                      .cos_strides = cos.strides, .sin_strides = sin.strides};
            const std::vector<double> x = exact_inputs(static_cast<size_t>(tokens * h * d), 30 + runs);
            for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
              for (Direction direction : {Direction::forward, Direction::inverse}) {
                for (Backend backend : {Backend::reference, Backend::cpu}) {
                  ++runs;
                  Store in(dtype, tokens * h * d), out(dtype, tokens * h * d);
                  for (int64_t i = 0; i < tokens * h * d; ++i) in.set(i, x[static_cast<size_t>(i)]);
                  apply(s, {.q = TensorView::bshd(in.data(), dtype, batch, seq, h, d),
                            .q_out = TensorView::bshd(out.data(), dtype, batch, seq, h, d),
                            .positions = index == Index::per_position
                                             ? Positions::per_token(std::span<const int32_t>(rowpos), s.streams)
                                             : Positions::sequential(0),
                            .direction = direction, .angles = &angles, .threads = 2, .backend = backend});
                  for (int64_t t = 0; t < tokens; ++t)
                    for (int64_t hh = 0; hh < h; ++hh)
                      for (int64_t j = 0; j < P; ++j) {
                        const int64_t i0 = index == Index::per_position || first == 1 ? 0 : t / seq;
                        // per_position: the row of the pair's stream's position (vLLM's M-RoPE cache)
                        const int64_t i1 = index == Index::per_position
                                               ? rowpos[static_cast<size_t>(s.stream_of(j) * tokens + t)]
                                               : t % seq;
                        const double cv = cos.read(i0, i1, column_of(columns, j));
                        const double sv = (direction == Direction::inverse ? -1 : 1) * sin.read(i0, i1, column_of(columns, j));
                        const auto [ca, cb] = s.channels(j);
                        const int64_t ea = (t * h + hh) * d + ca, eb = (t * h + hh) * d + cb;
                        const double a = x[static_cast<size_t>(ea)], b = x[static_cast<size_t>(eb)];
                        double wa, wb;
                        if (dtype == DType::f64) {
                          wa = a * cv - b * sv;
                          wb = a * sv + b * cv;
                        } else {
                          const float fa = rotate_minus(float(a), float(cv), float(b), float(sv));
                          const float fb = rotate_minus(float(b), float(cv), float(a), -float(sv));
                          Store round(dtype, 2);
                          round.set(0, fa);
                          round.set(1, fb);
                          wa = round.get(0);
                          wb = round.get(1);
                        }
                        const double tol = dtype == DType::f64 ? 0x1p-52 * (std::fabs(a * cv) + std::fabs(b * sv) +
                                                                            std::fabs(a * sv) + std::fabs(b * cv)) : 0.0;
                        const std::string where = std::string(index == Index::per_token ? "per_token" : "per_position") +
                            " columns " + std::to_string(int(columns)) + " angles " + std::string(to_string(angle_dtype)) +
                            (strided ? " strided" : " contiguous") + " data " + std::string(to_string(dtype)) +
                            (direction == Direction::inverse ? " inverse" : " forward") +
                            (backend == Backend::cpu ? " cpu" : " reference") + " " + c.name + " token " +
                            std::to_string(t) + " pair " + std::to_string(j);
                        ASSERT_LE(std::fabs(out.get(ea) - wa), tol) << where << " got " << out.get(ea) << " want " << wa;
                        ASSERT_LE(std::fabs(out.get(eb) - wb), tol) << where << " got " << out.get(eb) << " want " << wb;
                      }
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(runs, 1000);
}

// transformers' layout ([batch, seq, rotary_dim], duplicated halves) holding, for each token and
// pair, the Table's value at the position of the pair's stream (the merged M-RoPE cos/sin a model
// computes): the caller path gives the Table path's bits.
TEST_P(DescriptorModels, CallerHalvesHoldingTheTableEqualTheTable) {
  const ModelCase c = qwen2_vl_case();
  const Schedule& s = c.schedule;
  const int64_t P = s.pairs(), tokens = c.batch * c.seq, d = s.head_dim;
  std::vector<int64_t> rows(c.positions.begin(), c.positions.end());
  const Table table = Table::at(s, rows);
  std::vector<float> cos(static_cast<size_t>(tokens * 2 * P)), sin(cos.size());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < P; ++j) {
      const int64_t row = *table.row_of(c.positions[static_cast<size_t>(s.stream_of(j) * tokens + t)]);
      for (int64_t copy : {j, j + P}) {
        cos[static_cast<size_t>(t * 2 * P + copy)] = table.cos_row(row)[j];
        sin[static_cast<size_t>(t * 2 * P + copy)] = table.sin_row(row)[j];
      }
    }
  const CallerAngles angles{.cos = cos.data(), .sin = sin.data(), .shape = {c.batch, c.seq, 2 * P},
                            .cos_strides = {c.seq * 2 * P, 2 * P, 1}, .sin_strides = {c.seq * 2 * P, 2 * P, 1}};
  const std::vector<float> x = test::random_floats(static_cast<size_t>(tokens * 4 * d), 5);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    std::vector<float> a = x, b = x;
    const Positions positions = Positions::per_token(std::span<const int32_t>(c.positions), 3);
    apply(s, {.q = TensorView::bshd(a.data(), DType::f32, c.batch, c.seq, 4, d), .positions = positions,
              .table = &table, .backend = backend});
    apply(s, {.q = TensorView::bshd(b.data(), DType::f32, c.batch, c.seq, 4, d), .positions = positions,
              .angles = &angles, .backend = backend});
    EXPECT_EQ(a, b);
  }
}

// ---- validation: every rule of the new fields, its message, and nothing written ----

struct Buffers {
  std::vector<float> q = test::random_floats(2 * 3 * 2 * 16, 1);
  std::vector<float> out = std::vector<float>(2 * 3 * 2 * 16, 7.0f);
  std::vector<float> q0 = q;
  std::vector<float> out0 = out;
  TensorView qv() { return TensorView::bshd(q.data(), DType::f32, 2, 3, 2, 16); }
  TensorView ov() { return TensorView::bshd(out.data(), DType::f32, 2, 3, 2, 16); }
  void expect_untouched(const std::string& where) const {
    EXPECT_EQ(q, q0) << where;
    EXPECT_EQ(out, out0) << where;
  }
};

TEST(DescriptorErrors, ScheduleRulesThroughApply) {
  const Schedule good{.head_dim = 16, .rotary_dim = 12, .pairing = Pairing::half, .inv_freq = hf_inv_freq(10000.0, 12),
                      .rotary_offset = 4, .streams = 3, .pair_stream = {0, 1, 2, 2, 1, 0}};
  ASSERT_NO_THROW(validate(good));
  struct Case {
    const char* needle;
    std::function<void(Schedule&)> edit;
  };
  const std::vector<Case> cases = {
      {"pair_stream[1]=3 must be in [0, streams=3)", [](Schedule& s) { s.pair_stream[1] = 3; }},
      {"pair_stream[4]=-1 must be in [0, streams=3)", [](Schedule& s) { s.pair_stream[4] = -1; }},
      {"pair_stream has 5 values but rotary_dim/2=6", [](Schedule& s) { s.pair_stream.pop_back(); }},
      {"streams=0 must be in [1, 8]", [](Schedule& s) { s.streams = 0; s.pair_stream.clear(); }},
      {"streams=9 must be in [1, 8]", [](Schedule& s) { s.streams = 9; }},
      {"rotary_offset=5 must be in [0, head_dim - rotary_dim = 4]", [](Schedule& s) { s.rotary_offset = 5; }},
      {"rotary_offset=-2 must be in [0, head_dim - rotary_dim = 4]", [](Schedule& s) { s.rotary_offset = -2; }},
      {"blocks=0 must be >= 1", [](Schedule& s) { s.blocks = 0; }},
      {"blocks=2 needs pairing half", [](Schedule& s) { s.blocks = 2; s.pairing = Pairing::interleaved; }},
      {"blocks=4 must divide rotary_dim/2=6", [](Schedule& s) { s.blocks = 4; }},
      {"inv_freq[2]=-1 must be finite, >= 0", [](Schedule& s) { s.inv_freq[2] = -1.0; }},
      {"inv_freq[3]=nan must be finite", [](Schedule& s) { s.inv_freq[3] = std::nan(""); }},
  };
  for (const Case& c : cases) {
    Schedule s = good;
    c.edit(s);
    EXPECT_ROTARY_ERROR(validate(s), c.needle);
    Buffers b;
    EXPECT_ROTARY_ERROR(apply(s, {.q = b.qv(), .q_out = b.ov()}), c.needle);
    b.expect_untouched(c.needle);
  }
  // 0 is a valid frequency (proportional's tail), max_inv_freq the largest.
  Schedule zero = good;
  zero.inv_freq.assign(6, 0.0);
  zero.inv_freq[0] = max_inv_freq;
  EXPECT_NO_THROW(validate(zero));
}

TEST(DescriptorErrors, PositionsConstruction) {
  const std::vector<int32_t> six(6, 1);
  EXPECT_ROTARY_ERROR(Positions::per_token(std::span<const int32_t>(six), 0), "positions streams=0 must be in [1, 8]");
  EXPECT_ROTARY_ERROR(Positions::per_token(std::span<const int32_t>(six), 9), "positions streams=9 must be in [1, 8]");
  EXPECT_ROTARY_ERROR(Positions::per_token(std::span<const int32_t>(six), 4),
                      "positions has 6 entries, not a multiple of streams=4");
  EXPECT_EQ(Positions::per_token(std::span<const int32_t>(six), 3).count, 2);
}

TEST(DescriptorErrors, ApplyRulesOfPositionsTablesAndCallerAngles) {
  const Schedule s{.head_dim = 16, .rotary_dim = 12, .pairing = Pairing::half, .inv_freq = hf_inv_freq(10000.0, 12),
                   .rotary_offset = 4, .streams = 3, .pair_stream = {0, 1, 2, 2, 1, 0}};
  const Schedule single{.head_dim = 16, .rotary_dim = 12, .pairing = Pairing::half, .inv_freq = hf_inv_freq(10000.0, 12)};
  // batch 2, seq 3: 6 tokens
  std::vector<int32_t> s2(12, 1), s3(18, 1), s3_bcast(9, 2), s3_bad_count(12, 1);
  std::vector<float> f3(18, 1.0f), f3_frac(18, 1.0f), f3_nan(18, 1.0f), f3_neg(18, 1.0f), f3_big(18, 1.0f);
  std::vector<double> d3_big(18, 1.0), d3_neg0(18, 1.0);
  f3_frac[7] = 2.5f;
  f3_nan[4] = std::nanf("");
  f3_neg[13] = -0.5f;
  f3_big[2] = 2147483648.0f;
  d3_big[17] = 2147483647.5;  // below 2^31: accepted
  d3_neg0[0] = -0.0;          // -0 is 0: accepted
  std::vector<int64_t> i3_big(18, 1), i3_off_table(18, 1);
  i3_big[15] = max_position_limit;
  i3_off_table[8] = 50;
  std::vector<int64_t> rows = {0, 1, 2, 3};
  const Table table = Table::at(s, rows);
  std::vector<float> cs(2 * 3 * 12, 0.5f);
  const CallerAngles halves{.cos = cs.data(), .sin = cs.data(), .shape = {2, 3, 12},
                            .cos_strides = {36, 12, 1}, .sin_strides = {36, 12, 1}};
  CallerAngles narrow = halves;
  narrow.shape = {2, 3, 6};  // halves need rotary_dim = 12 columns
  CallerAngles wrong_seq = halves;
  wrong_seq.shape = {2, 4, 12};
  CallerAngles wrong_batch = halves;
  wrong_batch.shape = {3, 3, 12};
  CallerAngles null_sin = halves;
  null_sin.sin = nullptr;
  CallerAngles bad_dtype = halves;
  bad_dtype.dtype = static_cast<DType>(9);
  CallerAngles bad_columns = halves;
  bad_columns.columns = static_cast<CallerAngles::Columns>(7);
  CallerAngles bad_index = halves;
  bad_index.index = static_cast<CallerAngles::Index>(5);
  std::vector<float> cache(10 * 6, 0.5f);
  const CallerAngles per_position{.index = CallerAngles::Index::per_position, .columns = CallerAngles::Columns::pairs,
                                  .cos = cache.data(), .sin = cache.data(), .shape = {1, 10, 6},
                                  .cos_strides = {60, 6, 1}, .sin_strides = {60, 6, 1}};
  CallerAngles per_position_batched = per_position;
  per_position_batched.shape = {2, 10, 6};
  per_position_batched.cos_strides = per_position_batched.sin_strides = {0, 6, 1};
  CallerAngles in_output;  // set per case: angles inside an output
  std::vector<int32_t> rows_ok(18, 9), rows_far(18, 9);
  rows_far[11] = 10;
  std::vector<float> rows_frac(18, 3.0f);
  rows_frac[5] = 3.5f;
  struct Case {
    const char* needle;  // null: accepted
    std::function<ApplyArgs(Buffers&)> make;
    const Schedule* schedule = nullptr;
  };
  using P = Positions;
  const std::vector<Case> cases = {
      {"positions has 2 streams but the schedule reads 3", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const int32_t>(s2), 2)}; }},
      {"positions has 3 streams but the schedule reads 1", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const int32_t>(s3), 3)}; }, &single},
      {nullptr, [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const int32_t>(s3), 3)}; }},
      {nullptr, [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const int32_t>(s3_bcast), 3)}; }},
      {nullptr, [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const int32_t>(s2).first(6), 1)}; }},
      {"positions has 4 entries per stream but batch*seq=6 (or seq=3", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const int32_t>(s3_bad_count), 3)}; }},
      {"positions[1][1]=2.5 is fractional; a table holds whole positions only", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const float>(f3_frac), 3), .table = &table}; }},
      {nullptr, [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const float>(f3), 3), .table = &table}; }},
      {"positions[0][4]=nan must be in [0, 2^31)", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const float>(f3_nan), 3)}; }},
      {"positions[2][1]=-0.5 must be in [0, 2^31)", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const float>(f3_neg), 3)}; }},
      {"positions[0][2]=2147483648 must be in [0, 2^31)", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const float>(f3_big), 3)}; }},
      {nullptr, [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const double>(d3_big), 3)}; }},
      {nullptr, [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const double>(d3_neg0), 3)}; }},
      {"positions[2][3]=2147483648 must be in [0, 2^31)", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const int64_t>(i3_big), 3)}; }},
      {"positions[1][2]=50 is not in the table", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const int64_t>(i3_off_table), 3), .table = &table}; }},
      {"positions[2]=4 is not in the table", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::sequential(2), .table = &table}; }},
      {"angles and table are both set", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .table = &table, .angles = &halves}; }},
      {nullptr, [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .angles = &halves}; }},
      {"angles width=6 must be 12 (rotary_dim=12, columns halves)", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .angles = &narrow}; }},
      {"per_token angles shape [2, 4, 12] must be [batch=2 or 1, seq=3, 12]", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .angles = &wrong_seq}; }},
      {"per_token angles shape [3, 3, 12] must be [batch=2 or 1, seq=3, 12]", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .angles = &wrong_batch}; }},
      {"angles.sin.data is null", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .angles = &null_sin}; }},
      {"angles.cos.dtype=9 is not", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .angles = &bad_dtype}; }},
      {"angles.columns=7 is not pairs, halves or repeated", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .angles = &bad_columns}; }},
      {"angles.index=5 is not per_token or per_position", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .angles = &bad_index}; }},
      {nullptr, [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const int32_t>(rows_ok), 3), .angles = &per_position}; }},
      {"positions[1][5]=10 is beyond the 10 rows of the per_position cos/sin", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const int32_t>(rows_far), 3), .angles = &per_position}; }},
      {"positions[0][5]=3.5 is fractional; a per_position cos/sin tensor holds whole positions only", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const float>(rows_frac), 3), .angles = &per_position}; }},
      {"positions[2]=10 is beyond the 10 rows of the per_position cos/sin", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::sequential(8), .angles = &per_position}; }},
      {"per_position angles shape [2, 10, 6] must be [1, rows >= 1, 6]", [&](Buffers& b) { return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .positions = P::per_token(std::span<const int32_t>(rows_ok), 3), .angles = &per_position_batched}; }},
      {"q_out overlaps angles.cos", [&](Buffers& b) {
         in_output = halves; in_output.cos = b.out.data() + 8; return ApplyArgs{.q = b.qv(), .q_out = b.ov(), .angles = &in_output}; }},
      {"q (in place) overlaps angles.sin", [&](Buffers& b) {
         in_output = halves; in_output.sin = b.q.data(); return ApplyArgs{.q = b.qv(), .angles = &in_output}; }},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    Buffers b;
    const Schedule& schedule = cases[i].schedule ? *cases[i].schedule : s;
    const std::string where = "case " + std::to_string(i) + (cases[i].needle ? std::string(" ") + cases[i].needle : " accepted");
    if (cases[i].needle == nullptr) {
      EXPECT_NO_THROW(apply(schedule, cases[i].make(b))) << where;
    } else {
      EXPECT_ROTARY_ERROR(apply(schedule, cases[i].make(b)), cases[i].needle);
      b.expect_untouched(where);
    }
  }
}

}  // namespace
}  // namespace rotary
