// xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"), written from its formula: with
// ζ_j = (2j + 0.4 r)/(1.4 r) and t = ln ζ_j (p - c)/γ, a query's pair j at position p turns as RoPE
// and scales by e^t, a key's by e^-t, so q_m·k_n = Σ_j g² ζ_j^((m - n)/γ) [pair j's RoPE product]
// whatever the centre c. Tests: apply against that formula evaluated with MPFR; the score's
// dependence on m - n alone and its decay; the CPU kernels against the reference bit for bit on
// every Highway target, thread count, layout and angle source; q_is_key; rerotate and
// switch_schedule of xPos keys; every bad input with its message.
#include <hwy/tests/hwy_gtest.h>
#include <mpfr.h>
#include <quadmath.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "rotary/apply.hpp"
#include "rotary/rerotate.hpp"
#include "rotary/spec_fields.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

// apply's f32 contract with xPos (apply.hpp): cos·g as a Table holds it is rounded once more after
// the multiplication by σ, so a pair's error is within 2^-22 σ g (|a| + |b|): two units of
// 2^-23 σ g (|a| + |b|), the unit the measured worst ratio is printed in.
constexpr double kUnit = 0x1p-23;
constexpr double kF32Bound = 2 * kUnit;
// f64: double arithmetic, but σ = e^t with t = ln ζ (p - c)/γ formed in double: |t| <= 80 is off by
// a few ulps (~2^-46 at 80), and σ relatively by as much; 2^-50 (1 + |t|) covers that and the rest.
constexpr double kF64Unit = 0x1p-50;
// bfloat16 keeps 8 significant bits: the store moves a value by at most 2^-9 of it (2^-8: margin).
constexpr double kBf16Rounding = 0x1p-8;
// σ g |cos| below float's normal range (|t| near 80 and cos near 0) is a subnormal: absolute error
// up to 2^-150 in each rounded product; a bfloat16 subnormal result (below 2^-126 too) is stored
// to a multiple of 2^-133, so within 2^-134.
constexpr double kSubnormalSlack = 0x1p-146;
constexpr double kBf16SubnormalSlack = 0x1p-134;
// ln(7/2) = -ln ζ_0, the largest |ln ζ_j| (ζ_0 = 2/7 for every r); the contract's range is
// |ln ζ_0 (p - c)/γ| <= 80.
constexpr double kMaxLog = 80.0;
const double kLn72 = std::log(3.5);
constexpr int kMpBits = 192;

// ---- MPFR: ln ζ_j, e^±t, cos/sin of the exact angle ------------------------------------------------

struct Mp {
  mpfr_t v;
  Mp() { mpfr_init2(v, kMpBits); }
  ~Mp() { mpfr_clear(v); }
  Mp(const Mp&) = delete;
  Mp& operator=(const Mp&) = delete;
};

// ln ζ_j = ln((2j + 0.4 r)/(1.4 r)) = ln((10 j + 2 r)/(7 r)): the ratio of two integers, then the log.
void log_zeta(Mp& out, int64_t j, int64_t r) {
  mpfr_set_si(out.v, static_cast<long>(10 * j + 2 * r), MPFR_RNDN);
  mpfr_div_si(out.v, out.v, static_cast<long>(7 * r), MPFR_RNDN);
  mpfr_log(out.v, out.v, MPFR_RNDN);
}

double log_zeta(int64_t j, int64_t r) {
  Mp l;
  log_zeta(l, j, r);
  return mpfr_get_d(l.v, MPFR_RNDN);
}

// e^(ln ζ_j * x / γ), x and γ exact doubles.
double zeta_power(int64_t j, int64_t r, double x, double gamma) {
  Mp l, e;
  log_zeta(l, j, r);
  mpfr_mul_d(l.v, l.v, x, MPFR_RNDN);
  mpfr_div_d(l.v, l.v, gamma, MPFR_RNDN);
  mpfr_exp(e.v, l.v, MPFR_RNDN);
  return mpfr_get_d(e.v, MPFR_RNDN);
}

struct CosSinExact {
  double cos, sin;
};
// cos and sin of the real product p * inv_freq (exact at 192 bits), rounded to double.
CosSinExact cos_sin(double p, double inv_freq) {
  Mp angle, c, s;
  mpfr_set_d(angle.v, p, MPFR_RNDN);
  mpfr_mul_d(angle.v, angle.v, inv_freq, MPFR_RNDN);
  mpfr_sin_cos(s.v, c.v, angle.v, MPFR_RNDN);
  return {mpfr_get_d(c.v, MPFR_RNDN), mpfr_get_d(s.v, MPFR_RNDN)};
}

struct Xpos {
  double gamma;
  double center;
};

// The contract's range, from the formula (not the library): the largest |p - c|.
double reach(double gamma) { return kMaxLog * gamma / kLn72; }

// What pair j of a token at position p gets: its angle's cos/sin, t, σ_q = e^t and σ_k = e^-t.
struct PairExact {
  double cos, sin, t, sigma_q, sigma_k;
};
PairExact pair_exact(const Schedule& s, Xpos x, int64_t j, double p) {
  const CosSinExact cs = cos_sin(p, s.inv_freq[static_cast<size_t>(j)]);
  Mp l, t, e;
  log_zeta(l, j, s.rotary_dim);
  mpfr_set_d(t.v, p, MPFR_RNDN);
  mpfr_sub_d(t.v, t.v, x.center, MPFR_RNDN);  // exact at 192 bits
  mpfr_mul(t.v, t.v, l.v, MPFR_RNDN);
  mpfr_div_d(t.v, t.v, x.gamma, MPFR_RNDN);
  PairExact out{cs.cos, cs.sin, mpfr_get_d(t.v, MPFR_RNDN), 0, 0};
  mpfr_exp(e.v, t.v, MPFR_RNDN);
  out.sigma_q = mpfr_get_d(e.v, MPFR_RNDN);
  mpfr_neg(t.v, t.v, MPFR_RNDN);
  mpfr_exp(e.v, t.v, MPFR_RNDN);
  out.sigma_k = mpfr_get_d(e.v, MPFR_RNDN);
  return out;
}

// ---- data of any dtype ---------------------------------------------------------------------------

// Storage of `dtype` set from floats (rounded as the dtype stores them), read back widened.
struct Data {
  DType dtype;
  std::vector<unsigned char> bytes;
  Data(DType d, const std::vector<float>& values)
      : dtype(d), bytes(values.size() * static_cast<size_t>(size_of(d))) {
    for (size_t i = 0; i < values.size(); ++i) test::store_element(dtype, bytes.data() + i * width(), values[i]);
  }
  size_t width() const { return static_cast<size_t>(size_of(dtype)); }
  void* ptr() { return bytes.data(); }
  double at(size_t i) const { return test::load_element(dtype, bytes.data() + i * width()); }
  TensorView view(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim) {
    return TensorView::bshd(ptr(), dtype, batch, seq, heads, head_dim);
  }
};

// Positions of S streams: stream k's entries at [k * tokens, (k + 1) * tokens), as Positions::per_token.
struct PositionList {
  std::vector<double> fractional;
  std::vector<int64_t> whole;
  int streams = 1;
  bool use_fractional = false;
  PositionList(std::vector<double> values, int s, bool fraction) : fractional(std::move(values)), streams(s),
                                                                  use_fractional(fraction) {
    for (const double v : fractional) whole.push_back(static_cast<int64_t>(v));
  }
  int64_t tokens() const { return static_cast<int64_t>(fractional.size()) / streams; }
  double at(int stream, int64_t token) const { return fractional[static_cast<size_t>(stream * tokens() + token)]; }
  Positions positions() const {
    return use_fractional ? Positions::per_token(std::span<const double>(fractional), streams)
                          : Positions::per_token(std::span<const int64_t>(whole), streams);
  }
  Table table(const Schedule& s) const {
    std::set<int64_t> distinct(whole.begin(), whole.end());
    return Table::at(s, std::vector<int64_t>(distinct.begin(), distinct.end()));
  }
};

// Whole positions within the reach of c (a margin of 1e-9 of it inside, far from the rounding of
// the library's own comparison), inside [0, 2^31): both ends, their neighbours, the centre, a few
// between, and small ones.
std::vector<double> positions_within_reach(Xpos x) {
  const double r = reach(x.gamma) * (1 - 1e-9);
  const double lo = std::max(0.0, std::ceil(x.center - r));
  const double hi = std::min(static_cast<double>(max_position_limit - 1), std::floor(x.center + r));
  std::set<double> out = {lo, lo + 1, hi - 1, hi, std::round(x.center), 0, 1, 7, 4096};
  for (const double f : {0.13, 0.5, 0.77}) out.insert(std::floor(lo + (hi - lo) * f));
  std::vector<double> kept;
  for (const double p : out) {
    if (p >= lo && p <= hi) kept.push_back(p);
  }
  return kept;
}

// One position list per stream: stream k reads the list rotated by k (the streams differ).
std::vector<double> per_stream(const std::vector<double>& list, int streams) {
  std::vector<double> out;
  for (int k = 0; k < streams; ++k) {
    for (size_t i = 0; i < list.size(); ++i) out.push_back(list[(i + static_cast<size_t>(k)) % list.size()]);
  }
  return out;
}

Spec with_xpos(Spec spec, Xpos x) {
  spec.xpos_scale_base = x.gamma;
  if (x.center != 0) spec.xpos_center = x.center;  // 0: left unset, the default
  return spec;
}

struct Named {
  const char* name;
  Spec spec;
};

std::vector<Named> oracle_specs() {
  std::vector<Named> out;
  for (const Pairing pairing : {Pairing::half, Pairing::interleaved}) {
    const bool half = pairing == Pairing::half;
    out.push_back({half ? "r64 half" : "r64 interleaved", Spec{.head_dim = 64, .pairing = pairing}});
    out.push_back({half ? "r32 of 80 half" : "r32 of 80 interleaved",
                   Spec{.head_dim = 80, .rotary_dim = 32, .pairing = pairing}});
    // YaRN: attention_factor 1.139, not 1.
    out.push_back({half ? "r128 yarn half" : "r128 yarn interleaved",
                   Spec{.head_dim = 128, .base = 1e6, .pairing = pairing, .schedule = ScheduleType::yarn,
                        .factor = 4.0, .original_max_position = 32768}});
  }
  // Qwen2-VL-like M-RoPE: each pair's σ reads its own stream's position.
  out.push_back({"mrope [4, 6, 6]", Spec{.head_dim = 32, .base = 1e6, .pairing = Pairing::half,
                                        .stream_layout = StreamLayout::sections, .sections = {4, 6, 6}}});
  // nope-first (DeepSeek-V4-like): the rotated slice last.
  out.push_back({"r32 at offset 64", Spec{.head_dim = 96, .rotary_dim = 32, .pairing = Pairing::interleaved,
                                         .rotary_offset = 64}});
  return out;
}

std::vector<Xpos> oracle_settings() {
  return {{512, 0}, {512, 20000.5}, {64, 0}, {64, -1000.25}, {1e6, 0}, {1e6, 2.1e9}};
}

// ---- the oracle -----------------------------------------------------------------------------------

struct Worst {
  double units = 0;  // largest |result - exact| / (2^-23 σ g (|a| + |b|)), f32 results
};

// One tensor of a call (heads of one token row each) against the formula; `key`: scaled by σ_k.
// Bound per element (pair (a, b) of the input, σ this tensor's, g the attention factor):
//   f32  kF32Bound σ g (|a| + |b|)  + kSubnormalSlack (1 + |a| + |b|)
//   bf16 the same + kBf16Rounding |result| + kBf16SubnormalSlack (the store)
//   f64  kF64Unit (1 + |t|) σ g (|a| + |b|)
void check_tensor(const Schedule& s, const std::vector<PairExact>& ex, const Data& in, const Data& out,
                  int64_t tokens, int64_t heads, bool key, Direction dir, const std::string& where,
                  Worst& worst) {
  const double g = s.attention_factor;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t row = (t * heads + h) * s.head_dim;
      for (int64_t j = 0; j < s.pairs(); ++j) {
        const PairExact& e = ex[static_cast<size_t>(t * s.pairs() + j)];
        const auto [ca, cb] = s.channels(j);
        const auto ia = static_cast<size_t>(row + ca), ib = static_cast<size_t>(row + cb);
        const double a = in.at(ia), b = in.at(ib), sigma = key ? e.sigma_k : e.sigma_q;
        const double sn = dir == Direction::forward ? e.sin : -e.sin;
        const __float128 scale = static_cast<__float128>(sigma) * g;
        const double want[2] = {
            static_cast<double>(scale * (static_cast<__float128>(a) * e.cos - static_cast<__float128>(b) * sn)),
            static_cast<double>(scale * (static_cast<__float128>(a) * sn + static_cast<__float128>(b) * e.cos))};
        const double size = sigma * g * (std::fabs(a) + std::fabs(b));
        const size_t at[2] = {ia, ib};
        for (int c = 0; c < 2; ++c) {
          const double got = out.at(at[c]), err = std::fabs(got - want[c]);
          double bound = 0;
          switch (in.dtype) {
            case DType::f64: bound = kF64Unit * (1 + std::fabs(e.t)) * size + 1e-300; break;
            case DType::bf16: bound = kF32Bound * size + kBf16Rounding * std::fabs(got) + kBf16SubnormalSlack; break;
            default: bound = kF32Bound * size; break;
          }
          if (in.dtype != DType::f64) bound += kSubnormalSlack * (1 + std::fabs(a) + std::fabs(b));
          if (in.dtype == DType::f32 && size > 0) worst.units = std::max(worst.units, err / (kUnit * size));
          ASSERT_LE(err, bound) << where << (key ? " k" : " q") << " token " << t << " head " << h << " pair " << j
                                << " channel " << (c == 0 ? ca : cb) << ": got " << got << ", want " << want[c]
                                << ", t=" << e.t << ", input (" << a << ", " << b << ")";
        }
      }
      for (int64_t d = 0; d < s.head_dim; ++d) {
        if (d >= s.rotary_offset && d < s.rotary_offset + s.rotary_dim) continue;
        const auto i = static_cast<size_t>(row + d);
        ASSERT_EQ(std::memcmp(&out.bytes[i * out.width()], &in.bytes[i * in.width()], in.width()), 0)
            << where << " tail channel " << d;
      }
    }
  }
}

// The exact quantities of every (token, pair) of a call.
std::vector<PairExact> exact_rows(const Schedule& s, Xpos x, const PositionList& pos) {
  std::vector<PairExact> out;
  for (int64_t t = 0; t < pos.tokens(); ++t) {
    for (int64_t j = 0; j < s.pairs(); ++j) out.push_back(pair_exact(s, x, j, pos.at(s.stream_of(j), t)));
  }
  return out;
}

constexpr int64_t kHeadsQ = 2, kHeadsK = 1;

// apply (q: kHeadsQ heads, k: kHeadsK heads, out of place) of `dtype`, checked against the formula.
void run_oracle(const Schedule& s, const PositionList& pos, const std::vector<PairExact>& ex, DType dtype,
                Direction dir, bool use_table, uint64_t seed, const std::string& where, Worst& worst) {
  const int64_t tokens = pos.tokens(), d = s.head_dim;
  const Data q(dtype, test::random_floats(static_cast<size_t>(tokens * kHeadsQ * d), seed, 2.0f));
  const Data k(dtype, test::random_floats(static_cast<size_t>(tokens * kHeadsK * d), seed + 1, 2.0f));
  Data q_out(dtype, std::vector<float>(q.bytes.size() / q.width(), NAN));
  Data k_out(dtype, std::vector<float>(k.bytes.size() / k.width(), NAN));
  Data q_in = q, k_in = k;
  const Table table = use_table ? pos.table(s) : Table::range(s, 0, 0);
  apply(s, ApplyArgs{.q = q_in.view(1, tokens, kHeadsQ, d), .k = k_in.view(1, tokens, kHeadsK, d),
                     .q_out = q_out.view(1, tokens, kHeadsQ, d), .k_out = k_out.view(1, tokens, kHeadsK, d),
                     .positions = pos.positions(), .direction = dir, .table = use_table ? &table : nullptr});
  ASSERT_EQ(q_in.bytes, q.bytes) << where << ": out of place wrote its input";
  check_tensor(s, ex, q, q_out, tokens, kHeadsQ, false, dir, where, worst);
  check_tensor(s, ex, k, k_out, tokens, kHeadsK, true, dir, where, worst);
}

// ---- the schedule's xPos fields ------------------------------------------------------------------

TEST(XposSchedule, LogZetaReachAndFieldsMatchTheFormula) {
  // ln ζ_j in double: the quotient's rounding and the log's each cost about an ulp (measured: 2 ulps
  // at most). 2^-50 relative: 4 ulps; a wrong pair index or r would be off by far more.
  double worst_ulps = 0;
  for (const int64_t r : {2, 8, 32, 64, 128, 256, 1024}) {
    const std::vector<double> lz = xpos_log_zeta(r);
    ASSERT_EQ(static_cast<int64_t>(lz.size()), r / 2);
    for (int64_t j = 0; j < r / 2; ++j) {
      const double want = log_zeta(j, r), got = lz[static_cast<size_t>(j)];
      const double ulp = std::ldexp(1.0, std::ilogb(want) - 52);
      worst_ulps = std::max(worst_ulps, std::fabs(got - want) / ulp);
      EXPECT_LE(std::fabs(got - want), 0x1p-50 * std::fabs(want)) << "r " << r << " j " << j;
      EXPECT_LT(got, 0.0);
    }
    EXPECT_NEAR(lz[0], -kLn72, 0x1p-51);  // ζ_0 = 2/7 whatever r
  }
  std::printf("xpos_log_zeta: worst error %.2f ulps\n", worst_ulps);
  const Schedule plain = make_schedule(Spec{.head_dim = 64});
  EXPECT_FALSE(plain.xpos());
  EXPECT_EQ(xpos_reach(plain), 0.0);
  for (const Xpos x : oracle_settings()) {
    const Schedule s = make_schedule(with_xpos(Spec{.head_dim = 64}, x));
    EXPECT_TRUE(s.xpos());
    EXPECT_EQ(s.xpos_scale_base, x.gamma);
    EXPECT_EQ(s.xpos_center, x.center);
    EXPECT_EQ(s.xpos_log_zeta, xpos_log_zeta(64));
    EXPECT_EQ(s.inv_freq, plain.inv_freq);  // xPos scales; it does not change the frequencies
    EXPECT_NEAR(xpos_reach(s), reach(x.gamma), 1e-12 * reach(x.gamma));
  }
  // The names every front end reads (spec_fields), and the CLI options they give.
  Spec spec{.head_dim = 64};
  set_field(spec, "xpos_scale_base", 512.0);
  set_field(spec, "xpos_center", int64_t{100});
  EXPECT_EQ(spec.xpos_scale_base, 512.0);
  EXPECT_EQ(spec.xpos_center, 100.0);
  ASSERT_NE(find_spec_field("xpos_scale_base"), nullptr);
  ASSERT_NE(find_spec_field("xpos_center"), nullptr);
  EXPECT_EQ(cli_option(*find_spec_field("xpos_scale_base")), "--xpos-scale-base");
  EXPECT_EQ(cli_option(*find_spec_field("xpos_center")), "--xpos-center");
}

// xPos composes with every schedule (the table in spec.hpp), frequencies and factor unchanged.
TEST(XposSchedule, EveryScheduleTakesXpos) {
  Spec longrope{.head_dim = 64, .schedule = ScheduleType::longrope, .original_max_position = 4096,
                .max_position = 131072};
  longrope.short_factor.assign(32, 1.0);
  longrope.long_factor.assign(32, 4.0);
  const std::vector<Spec> specs = {
      Spec{.head_dim = 64},
      Spec{.head_dim = 64, .schedule = ScheduleType::linear, .factor = 4.0},
      Spec{.head_dim = 64, .schedule = ScheduleType::ntk, .factor = 4.0},
      Spec{.head_dim = 64, .schedule = ScheduleType::dynamic, .factor = 2.0, .original_max_position = 4096},
      Spec{.head_dim = 64, .schedule = ScheduleType::yarn, .factor = 16.0, .original_max_position = 4096},
      Spec{.head_dim = 64, .base = 500000, .schedule = ScheduleType::llama3, .factor = 8.0,
           .original_max_position = 8192, .low_freq_factor = 1.0, .high_freq_factor = 4.0},
      longrope,
      Spec{.head_dim = 64, .schedule = ScheduleType::monotone, .max_length = 4096},
      Spec{.head_dim = 64, .schedule = ScheduleType::proportional, .partial_rotary_factor = 0.25},
  };
  ASSERT_EQ(specs.size(), static_cast<size_t>(ScheduleType::last) + 1);
  for (const Spec& spec : specs) {
    SCOPED_TRACE(std::string(to_string(spec.schedule)));
    const Schedule plain = make_schedule(spec), x = make_schedule(with_xpos(spec, {512, 77}));
    EXPECT_TRUE(x.xpos());
    EXPECT_EQ(x.inv_freq, plain.inv_freq);
    EXPECT_EQ(x.attention_factor, plain.attention_factor);
  }
}

// ---- apply against the formula ---------------------------------------------------------------------

// Every spec × (γ, c) × dtype × direction × angle source; f32 also with fractional positions.
TEST(XposApply, MatchesTheFormulaInHighPrecision) {
  Worst table_worst, fly_worst;
  uint64_t seed = 1;
  int calls = 0;
  for (const auto& [name, spec] : oracle_specs()) {
    for (const Xpos x : oracle_settings()) {
      const Schedule s = make_schedule(with_xpos(spec, x));
      const std::vector<double> list = positions_within_reach(x);
      const PositionList pos(per_stream(list, s.streams), s.streams, false);
      const std::vector<PairExact> ex = exact_rows(s, x, pos);
      for (const DType dtype : {DType::f32, DType::bf16, DType::f64}) {
        for (const Direction dir : {Direction::forward, Direction::inverse}) {
          for (const bool table : {false, true}) {
            if (table && dtype != DType::f32) continue;
            const std::string where = std::string(name) + " gamma=" + std::to_string(x.gamma) +
                                      " c=" + std::to_string(x.center) + " " + std::string(to_string(dtype)) +
                                      (dir == Direction::forward ? " forward" : " inverse") +
                                      (table ? " table" : " on the fly");
            run_oracle(s, pos, ex, dtype, dir, table, seed++, where, table ? table_worst : fly_worst);
            if (HasFatalFailure()) return;
            ++calls;
          }
        }
      }
      // Fractional positions (float64 kind), on the fly: each whole position + 0.375, kept in reach.
      std::vector<double> frac;
      for (const double p : list) frac.push_back(p + 0.375 <= x.center + reach(x.gamma) * (1 - 1e-9) ? p + 0.375 : p);
      const PositionList fpos(per_stream(frac, s.streams), s.streams, true);
      run_oracle(s, fpos, exact_rows(s, x, fpos), DType::f32, Direction::forward, false, seed++,
                 std::string(name) + " fractional positions", fly_worst);
      if (HasFatalFailure()) return;
      ++calls;
    }
  }
  EXPECT_EQ(calls, 8 * 6 * (3 * 2 + 2 + 1));
  std::printf("xPos f32: worst |result - exact| / (2^-23 sigma g (|a| + |b|)): %.3f with a Table, %.3f on the "
              "fly (bound %.0f)\n", table_worst.units, fly_worst.units, kF32Bound / kUnit);
}

// At p = c, σ = 1 for q and k alike (t = 0); at the ends of the reach σ is e^±80 (t just inside
// ±80) and the f32 results are normal floats of that size, neither 0 nor inf.
TEST(XposApply, ScaleAtTheCentreIsOneAndAtTheEndsE80) {
  const Xpos x{64, 5000};
  const Schedule s = make_schedule(with_xpos(Spec{.head_dim = 2, .pairing = Pairing::interleaved}, x));
  const double r = reach(x.gamma) * (1 - 1e-9);
  const std::vector<int64_t> pos = {5000, static_cast<int64_t>(std::ceil(5000 - r)), static_cast<int64_t>(std::floor(5000 + r))};
  std::vector<float> q = {1, 0, 1, 0, 1, 0}, k = q;
  apply(s, ApplyArgs{.q = TensorView::bshd(q.data(), DType::f32, 1, 3, 1, 2),
                     .k = TensorView::bshd(k.data(), DType::f32, 1, 3, 1, 2),
                     .positions = Positions::per_token(std::span<const int64_t>(pos)), .direction = Direction::inverse});
  // Pair 0 at p = c: the plain rotation (cos, -sin) of (1, 0) by 5000 rad, for q and k alike.
  const CosSinExact at_c = cos_sin(5000, s.inv_freq[0]);
  EXPECT_NEAR(q[0], at_c.cos, 1e-7);
  EXPECT_NEAR(q[1], -at_c.sin, 1e-7);
  EXPECT_EQ(q[0], k[0]);
  EXPECT_EQ(q[1], k[1]);
  // Lowest position: t = ln ζ_0 (p - c)/γ just below +80, so |q| = e^t, |k| = e^-t; the highest: -t.
  const double t_low = pair_exact(s, x, 0, static_cast<double>(pos[1])).t;
  const double t_high = pair_exact(s, x, 0, static_cast<double>(pos[2])).t;
  ASSERT_GT(t_low, 79.9);
  ASSERT_LT(t_high, -79.9);
  EXPECT_NEAR(std::log(std::hypot(q[2], q[3])), t_low, 1e-6);
  EXPECT_NEAR(std::log(std::hypot(k[2], k[3])), -t_low, 1e-6);
  EXPECT_NEAR(std::log(std::hypot(q[4], q[5])), t_high, 1e-6);
  EXPECT_NEAR(std::log(std::hypot(k[4], k[5])), -t_high, 1e-6);
}

// ---- q·k: relative position only, decaying as ζ^((m - n)/γ), whatever the centre ------------------

// q_m·k_n over the rotated slice, with q0 and k0 the same raw vectors at every position, against
//   E(m, n) = Σ_j g² ζ_j^((m - n)/γ) [cos φ (qa ka + qb kb) + sin φ (qb ka - qa kb)],  φ = (n - m) θ_j
// (MPFR per distance and pair). Bound: per pair, each f32 component of q' within e_q = 2^-22 σ_q g
// (|qa| + |qb|) and of k' within e_k alike, so |q'·k' - exact| <= e_q |k'|_1 + e_k (|q'|_1 + 2 e_q),
// plus 2^-50 of the terms for the double sum and the oracle.
struct Scores {
  std::vector<std::vector<double>> value, bound;
};

Scores scores(const Schedule& s, Xpos x, const std::vector<int64_t>& pos, const std::vector<float>& q0,
              const std::vector<float>& k0) {
  const int64_t n = static_cast<int64_t>(pos.size()), d = s.head_dim;
  std::vector<float> q, k;
  for (int64_t t = 0; t < n; ++t) {
    q.insert(q.end(), q0.begin(), q0.end());
    k.insert(k.end(), k0.begin(), k0.end());
  }
  apply(s, ApplyArgs{.q = TensorView::bshd(q.data(), DType::f32, 1, n, 1, d),
                     .k = TensorView::bshd(k.data(), DType::f32, 1, n, 1, d),
                     .positions = Positions::per_token(std::span<const int64_t>(pos))});
  const double g = s.attention_factor;
  std::vector<double> lz;
  for (int64_t j = 0; j < s.pairs(); ++j) lz.push_back(log_zeta(j, s.rotary_dim));
  Scores out{std::vector<std::vector<double>>(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(n))),
             std::vector<std::vector<double>>(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(n)))};
  for (int64_t m = 0; m < n; ++m) {
    for (int64_t t = 0; t < n; ++t) {
      double dot = 0, bound = 0;
      for (int64_t j = 0; j < s.pairs(); ++j) {
        const auto [ca, cb] = s.channels(j);
        const double l = lz[static_cast<size_t>(j)];
        const double sq = std::exp(l * (static_cast<double>(pos[static_cast<size_t>(m)]) - x.center) / x.gamma);
        const double sk = std::exp(-l * (static_cast<double>(pos[static_cast<size_t>(t)]) - x.center) / x.gamma);
        const double eq = kF32Bound * sq * g * (std::fabs(q0[ca]) + std::fabs(q0[cb]));
        const double ek = kF32Bound * sk * g * (std::fabs(k0[ca]) + std::fabs(k0[cb]));
        const double qa = q[m * d + ca], qb = q[m * d + cb], ka = k[t * d + ca], kb = k[t * d + cb];
        dot += qa * ka + qb * kb;
        bound += eq * (std::fabs(ka) + std::fabs(kb)) + ek * (std::fabs(qa) + std::fabs(qb) + 2 * eq) +
                 0x1p-50 * (std::fabs(qa * ka) + std::fabs(qb * kb));
      }
      out.value[m][t] = dot;
      out.bound[m][t] = bound;
    }
  }
  return out;
}

// E(m, n) for distance m - n, from the formula alone (no rotated vector).
double expected_score(const Schedule& s, Xpos x, int64_t distance, const std::vector<float>& q0,
                      const std::vector<float>& k0) {
  __float128 sum = 0;
  const double g = s.attention_factor;
  for (int64_t j = 0; j < s.pairs(); ++j) {
    const auto [ca, cb] = s.channels(j);
    const double z = zeta_power(j, s.rotary_dim, static_cast<double>(distance), x.gamma);
    const CosSinExact cs = cos_sin(static_cast<double>(-distance), s.inv_freq[static_cast<size_t>(j)]);
    const __float128 qa = q0[ca], qb = q0[cb], ka = k0[ca], kb = k0[cb];
    sum += static_cast<__float128>(g) * g * z * (cs.cos * (qa * ka + qb * kb) + cs.sin * (qb * ka - qa * kb));
  }
  return static_cast<double>(sum);
}

TEST(XposScores, DependOnlyOnDistanceAndDecayAsZetaPowerForEveryCentre) {
  const std::vector<int64_t> offsets = {0, 1, 2, 64, 511, 4096, 20000};
  const std::vector<int64_t> shifts = {0, 3, 9000};
  std::vector<int64_t> pos;
  for (const int64_t s0 : shifts) {
    for (const int64_t o : offsets) pos.push_back(s0 + o);
  }
  const size_t n_off = offsets.size();  // positions [shift block][offset]
  int checked = 0;
  double decayed = 1;
  for (const auto& [name, spec] : {Named{"r64 half", Spec{.head_dim = 64}},
                                   Named{"r64 interleaved", Spec{.head_dim = 64, .pairing = Pairing::interleaved}},
                                   Named{"r128 yarn", Spec{.head_dim = 128, .base = 1e6, .schedule = ScheduleType::yarn,
                                                           .factor = 4.0, .original_max_position = 32768}}}) {
    const std::vector<float> q0 = test::random_floats(static_cast<size_t>(spec.head_dim), 11);
    const std::vector<float> k0 = test::random_floats(static_cast<size_t>(spec.head_dim), 12);
    std::map<int64_t, double> expected;
    std::vector<Scores> per_centre;
    for (const double c : {0.0, 7000.0, -3000.5, 29000.0}) {
      const Xpos x{512, c};
      const Schedule s = make_schedule(with_xpos(spec, x));
      const Scores sc = scores(s, x, pos, q0, k0);
      for (size_t m = 0; m < pos.size(); ++m) {
        for (size_t t = 0; t < pos.size(); ++t) {
          const int64_t dist = pos[m] - pos[t];
          if (!expected.contains(dist)) expected[dist] = expected_score(s, x, dist, q0, k0);
          const double want = expected[dist], bound = sc.bound[m][t] + 0x1p-50 * std::fabs(want);
          ASSERT_LE(std::fabs(sc.value[m][t] - want), bound)
              << name << " c=" << c << " q at " << pos[m] << ", k at " << pos[t] << ": " << sc.value[m][t]
              << " vs the formula's " << want;
          // Both moved by the next shift (same block, next block): equal within both roundings.
          if (m / n_off == t / n_off && m + n_off < pos.size()) {
            const size_t m2 = m + n_off, t2 = t + n_off;
            ASSERT_LE(std::fabs(sc.value[m][t] - sc.value[m2][t2]), sc.bound[m][t] + sc.bound[m2][t2])
                << name << " c=" << c << " (" << pos[m] << ", " << pos[t] << ") vs (" << pos[m2] << ", " << pos[t2] << ")";
          }
          // The centre cancels: every c gives the first centre's scores.
          if (!per_centre.empty()) {
            const Scores& first = per_centre.front();
            ASSERT_LE(std::fabs(sc.value[m][t] - first.value[m][t]), sc.bound[m][t] + first.bound[m][t])
                << name << " c=" << c << " vs c=0 at (" << pos[m] << ", " << pos[t] << ")";
          }
          ++checked;
        }
      }
      per_centre.push_back(sc);
    }
    // The decay is there: pair 0 alone (q0 = k0 = (1, 0) in its channels) at distance 20000 gives
    // g² ζ_0^(20000/512) cos(-20000 θ_0) = g² (2/7)^39.06 cos(20000), about e^-49.
    const Schedule s = make_schedule(with_xpos(spec, {512, 0}));
    std::vector<float> unit(static_cast<size_t>(spec.head_dim), 0.0f);
    unit[static_cast<size_t>(s.channels(0).first)] = 1.0f;
    const Scores sc = scores(s, {512, 0}, {20000, 0}, unit, unit);
    const double want = s.attention_factor * s.attention_factor * std::pow(2.0 / 7.0, 20000.0 / 512) *
                        std::cos(20000.0 * s.inv_freq[0]);
    EXPECT_NEAR(sc.value[0][1], want, 1e-6 * std::fabs(want));
    EXPECT_NEAR(sc.value[1][0], s.attention_factor * s.attention_factor * std::pow(2.0 / 7.0, -20000.0 / 512) *
                                    std::cos(20000.0 * s.inv_freq[0]), 1e-6 * std::pow(3.5, 20000.0 / 512));
    decayed = std::min(decayed, std::fabs(sc.value[0][1]));
  }
  EXPECT_LT(decayed, 1e-20);
  EXPECT_GT(checked, 3000);
}

// ---- CPU kernels against the reference: every target, layout, angle source, dtype ---------------

class XposKernels : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(XposKernels);

// Strides of [batch, seq, heads, head_dim] in a buffer, and the elements it needs.
struct Strided {
  const char* name;
  std::array<int64_t, 4> strides;
  int64_t extent;
};
Strided strided(int kind, int64_t b, int64_t s, int64_t h, int64_t d) {
  switch (kind) {
    case 0: return {"bshd", {s * h * d, h * d, d, 1}, b * s * h * d};
    case 1: return {"bhsd", {h * s * d, d, s * d, 1}, b * s * h * d};
    default: return {"head_dim stride 2", {s * h * 2 * d, h * 2 * d, 2 * d, 2}, b * s * h * 2 * d};
  }
}

// One call through Backend::cpu and Backend::reference: the same bytes everywhere, outputs and
// untouched elements alike.
void expect_cpu_is_reference(const Schedule& s, const PositionList& pos, DType dtype, Direction dir, bool table,
                             bool in_place, int layout, bool q_is_key, uint64_t seed, const std::string& where,
                             bool undo = false) {
  const int64_t batch = 1, tokens = pos.tokens(), hq = 3, hk = 2, d = s.head_dim;
  const Strided lq = strided(layout, batch, tokens, hq, d), lk = strided(layout, batch, tokens, hk, d);
  const Data q0(dtype, test::random_floats(static_cast<size_t>(lq.extent), seed, 3.0f));
  const Data k0(dtype, test::random_floats(static_cast<size_t>(lk.extent), seed + 1, 3.0f));
  const Data poison(dtype, std::vector<float>(static_cast<size_t>(lq.extent), 12345.0f));
  const Data poison_k(dtype, std::vector<float>(static_cast<size_t>(lk.extent), 12345.0f));
  const Table t = table ? pos.table(s) : Table::range(s, 0, 0);
  auto run = [&](Backend backend) {
    std::vector<Data> buffers = {q0, k0, poison, poison_k};
    auto view = [&](Data& data, const Strided& l, int64_t heads) {
      return TensorView{.data = data.ptr(), .dtype = dtype, .shape = {batch, tokens, heads, d}, .strides = l.strides};
    };
    ApplyArgs args{.q = view(buffers[0], lq, hq), .positions = pos.positions(), .direction = dir,
                   .table = table ? &t : nullptr, .q_is_key = q_is_key, .undo = undo, .backend = backend};
    if (!q_is_key) args.k = view(buffers[1], lk, hk);
    if (!in_place) {
      args.q_out = view(buffers[2], lq, hq);
      if (!q_is_key) args.k_out = view(buffers[3], lk, hk);
    }
    apply(s, args);
    return buffers;
  };
  const std::vector<Data> cpu = run(Backend::cpu), ref = run(Backend::reference);
  const char* names[] = {"q", "k", "q_out", "k_out"};
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(cpu[i].bytes, ref[i].bytes) << where << " " << names[i] << " " << lq.name << " target "
                                          << hwy::TargetName(hwy::SupportedTargets() & -hwy::SupportedTargets());
  }
  // The call did something: the rotated output differs from its input.
  ASSERT_NE(in_place ? cpu[0].bytes : cpu[2].bytes, q0.bytes) << where;
}

TEST_P(XposKernels, CpuEqualsReferenceBitForBit) {
  uint64_t seed = 100;
  int cases = 0;
  const std::vector<Named> specs = {
      {"r64 half yarn", Spec{.head_dim = 64, .schedule = ScheduleType::yarn, .factor = 4.0,
                             .original_max_position = 4096}},
      {"r32 of 80 interleaved", Spec{.head_dim = 80, .rotary_dim = 32, .pairing = Pairing::interleaved}},
      {"r34 half", Spec{.head_dim = 34}},  // 17 pairs: vector bodies and scalar tails
      {"mrope [4, 6, 6]", Spec{.head_dim = 32, .base = 1e6, .stream_layout = StreamLayout::sections,
                               .sections = {4, 6, 6}}}};
  for (const auto& [name, spec] : specs) {
    for (const Xpos x : {Xpos{512, 0}, Xpos{64, 3000.25}, Xpos{1e6, 2.1e9}}) {
      const Schedule s = make_schedule(with_xpos(spec, x));
      const std::vector<double> list = positions_within_reach(x);
      const PositionList pos(per_stream(list, s.streams), s.streams, false);
      std::vector<double> frac;
      for (const double p : list) frac.push_back(p == list.back() ? p : p + 0.625);
      const PositionList fpos(per_stream(frac, s.streams), s.streams, true);
      // f16 holds at most 65504: only γ = 1e6 keeps σ (near 1 there) inside its range.
      for (const DType dtype : {DType::f32, DType::bf16, DType::f64, DType::f16}) {
        if (dtype == DType::f16 && x.gamma != 1e6) continue;
        for (int variant = 0; variant < 8; ++variant) {
          const bool table = (variant & 1) != 0, in_place = (variant & 2) != 0, inverse = (variant & 4) != 0;
          const int layout = static_cast<int>(seed % 3);
          const std::string where = std::string(name) + " gamma=" + std::to_string(x.gamma) + " " +
                                    std::string(to_string(dtype)) + (table ? " table" : " on the fly") +
                                    (in_place ? " in place" : " out of place") + (inverse ? " inverse" : " forward");
          expect_cpu_is_reference(s, pos, dtype, inverse ? Direction::inverse : Direction::forward, table, in_place,
                                  layout, false, seed++, where);
          if (HasFatalFailure()) return;
          ++cases;
        }
        expect_cpu_is_reference(s, fpos, dtype, Direction::forward, false, false, 0, false, seed++,
                                std::string(name) + " fractional positions");
        expect_cpu_is_reference(s, pos, dtype, Direction::forward, true, true, 1, true, seed++,
                                std::string(name) + " q_is_key");
        // undo (the true inverse: 1/g, σ^-1): a table only where g = 1 (apply refuses it otherwise).
        for (const Direction dir : {Direction::forward, Direction::inverse}) {
          const bool in_place = seed % 2 == 0;
          expect_cpu_is_reference(s, pos, dtype, dir, s.attention_factor == 1.0, in_place, 2, false, seed++,
                                  std::string(name) + " undo", /*undo=*/true);
          expect_cpu_is_reference(s, fpos, dtype, dir, false, false, 0, true, seed++,
                                  std::string(name) + " undo keys alone, fractional positions", /*undo=*/true);
        }
        if (HasFatalFailure()) return;
        cases += 6;
      }
    }
  }
  EXPECT_GT(cases, 300);
}

// ---- threads; a Table against exact angles on the fly -------------------------------------------

TEST(XposThreads, AnyThreadCountAndEitherAngleSourceGiveTheSameBits) {
  // 512 tokens x 8 heads x 128 channels of f32: 2 MiB, well above the one-thread threshold.
  const Xpos x{512, 16000};
  const Schedule s = make_schedule(with_xpos(Spec{.head_dim = 128, .base = 500000}, x));
  const int64_t tokens = 512, heads = 8, d = 128;
  std::vector<int64_t> pos(static_cast<size_t>(tokens));
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int64_t> any(0, 16000 + static_cast<int64_t>(reach(x.gamma) * 0.999));
  for (int64_t& p : pos) p = any(rng);
  const Table table = Table::at(s, pos);
  const std::vector<float> q0 = test::random_floats(static_cast<size_t>(tokens * heads * d), 5);
  auto run = [&](int threads, bool use_table, Backend backend) {
    std::vector<float> q = q0, k = q0;
    apply(s, ApplyArgs{.q = TensorView::bshd(q.data(), DType::f32, 1, tokens, heads, d),
                       .k = TensorView::bshd(k.data(), DType::f32, 1, tokens, heads, d),
                       .positions = Positions::per_token(std::span<const int64_t>(pos)),
                       .table = use_table ? &table : nullptr, .threads = threads, .backend = backend});
    q.insert(q.end(), k.begin(), k.end());
    return q;
  };
  const std::vector<float> one = run(1, true, Backend::cpu);
  EXPECT_EQ(run(2, true, Backend::cpu), one);
  EXPECT_EQ(run(0, true, Backend::cpu), one);
  EXPECT_EQ(run(7, true, Backend::cpu), one);
  EXPECT_EQ(run(1, true, Backend::reference), one);
  // apply.hpp: a Table holds the float rows computed on the fly, so the two agree (bar rare values
  // within ~2 double ulps of a rounding boundary, which these positions do not hit).
  EXPECT_EQ(run(2, false, Backend::cpu), one);
  EXPECT_EQ(run(1, false, Backend::reference), one);
}

// ---- q_is_key ---------------------------------------------------------------------------------------

// Keys rotated alone (q_is_key: q scaled by σ_k) are the bits of the same keys rotated as k next to
// a query; without the flag they are scaled as a query, which differs; without xPos it changes nothing.
TEST(XposQIsKey, ScalesQAsAKey) {
  const Xpos x{512, 1000};
  for (const Pairing pairing : {Pairing::half, Pairing::interleaved}) {
    const Schedule s = make_schedule(with_xpos(Spec{.head_dim = 64, .pairing = pairing}, x));
    const Schedule plain = make_schedule(Spec{.head_dim = 64, .pairing = pairing});
    const std::vector<int64_t> pos = {0, 1000, 20000, 33000};
    const Table table = Table::at(s, pos);
    for (const DType dtype : {DType::f32, DType::bf16}) {
      for (const Direction dir : {Direction::forward, Direction::inverse}) {
        for (const bool use_table : {false, true}) {
          const Data keys(dtype, test::random_floats(4 * 2 * 64, 8));
          const Data other(dtype, test::random_floats(4 * 3 * 64, 9));
          auto alone = [&](const Schedule& sch, bool as_key) {
            Data k = keys;
            apply(sch, ApplyArgs{.q = k.view(1, 4, 2, 64), .positions = Positions::per_token(std::span<const int64_t>(pos)),
                                 .direction = dir, .table = use_table && sch.xpos() ? &table : nullptr,
                                 .q_is_key = as_key});
            return k.bytes;
          };
          Data q = other, k = keys;
          apply(s, ApplyArgs{.q = q.view(1, 4, 3, 64), .k = k.view(1, 4, 2, 64),
                             .positions = Positions::per_token(std::span<const int64_t>(pos)), .direction = dir,
                             .table = use_table ? &table : nullptr});
          EXPECT_EQ(alone(s, true), k.bytes) << to_string(pairing) << " " << to_string(dtype);
          EXPECT_NE(alone(s, false), k.bytes);
          EXPECT_EQ(alone(plain, true), alone(plain, false));
        }
      }
    }
  }
}

// ---- rerotate and switch_schedule of xPos keys ----------------------------------------------------

// Keys `k0` (2 heads) applied as keys (q_is_key) at `pos` (the schedule's streams one after the
// other, as Positions::per_token), f32.
std::vector<float> keys_at(const Schedule& s, const std::vector<float>& k0, const std::vector<int64_t>& pos,
                           Direction dir = Direction::forward) {
  std::vector<float> k = k0;
  const auto tokens = static_cast<int64_t>(pos.size()) / s.streams;
  apply(s, ApplyArgs{.q = TensorView::bshd(k.data(), DType::f32, 1, tokens, 2, s.head_dim),
                     .positions = Positions::per_token(std::span<const int64_t>(pos), s.streams), .direction = dir,
                     .q_is_key = true});
  return k;
}

// rerotate(keys at p, Δ) against (1) the exact turn by Δθ_j and scaling by ρ_j = ζ_j^(-Δ/γ) of the
// stored keys and (2) the keys applied at p + Δ (Δ: pair j's stream's). Per element, with (a0, b0)
// the input pair, (a1, b1) the stored one, S0, S1 their |a| + |b|, σ' = σ_k(p + Δ):
//   (1) u ρ S1                          [rerotate.hpp: ρ folded into the step's cos and sin, rounded
//                                        once with them, then apply's turn: u = 2^-23, apply's own
//                                        bound with ρ for g; a jump split over two passes: 2^-22]
//   (2) u ρ S1 + 2^-22 (√2 + 1) σ' g S0  [+ the stored keys' error (apply's xPos bound) turned and
//                                        scaled, + the reference's own]
double check_rerotate(const Schedule& s, Xpos x, const std::vector<int64_t>& pos, const std::vector<int64_t>& delta,
                      Direction dir, uint64_t seed, double u = kUnit) {
  const int64_t n = static_cast<int64_t>(pos.size()) / s.streams, d = s.head_dim;
  auto delta_of = [&](int stream) { return delta[delta.size() == 1 ? 0 : static_cast<size_t>(stream)]; };
  const std::vector<float> k0 = test::random_floats(static_cast<size_t>(n * 2 * d), seed, 2.0f);
  const std::vector<float> stored = keys_at(s, k0, pos, dir);
  std::vector<float> moved = stored;
  rerotate(s, RotatedKeys{.k = TensorView::bshd(moved.data(), DType::f32, 1, n, 2, d),
                          .positions = Positions::per_token(std::span<const int64_t>(pos), s.streams), .rotated = dir},
           delta);
  std::vector<int64_t> at = pos;
  for (size_t i = 0; i < at.size(); ++i) at[i] += delta_of(static_cast<int>(i / static_cast<size_t>(n)));
  const std::vector<float> ref = keys_at(s, k0, at, dir);
  double worst = 0;
  const double g = s.attention_factor;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t j = 0; j < s.pairs(); ++j) {
        const auto [ca, cb] = s.channels(j);
        const auto ia = static_cast<size_t>((t * 2 + h) * d + ca), ib = static_cast<size_t>((t * 2 + h) * d + cb);
        const int stream = s.stream_of(j);
        const int64_t dj = delta_of(stream), p = pos[static_cast<size_t>(stream * n + t)];
        const double rho = zeta_power(j, s.rotary_dim, static_cast<double>(-dj), x.gamma);
        const CosSinExact turn = cos_sin(static_cast<double>(dj), s.inv_freq[static_cast<size_t>(j)]);
        const double sn = dir == Direction::forward ? turn.sin : -turn.sin;
        const double a1 = stored[ia], b1 = stored[ib];
        const double exact[2] = {rho * (a1 * turn.cos - b1 * sn), rho * (a1 * sn + b1 * turn.cos)};
        const double sigma = pair_exact(s, x, j, static_cast<double>(p + dj)).sigma_k;
        const double s1 = std::fabs(a1) + std::fabs(b1), s0 = std::fabs(k0[ia]) + std::fabs(k0[ib]);
        const size_t idx[2] = {ia, ib};
        for (int c = 0; c < 2; ++c) {
          const double got = moved[idx[c]];
          const double b_exact = u * rho * s1 + kSubnormalSlack * (1 + s1);
          const double b_applied = u * rho * s1 + kF32Bound * (std::sqrt(2.0) + 1) * sigma * g * s0 + kSubnormalSlack * (1 + s0);
          EXPECT_LE(std::fabs(got - exact[c]), b_exact)
              << "vs the exact turn and scale of the stored keys: position " << p << " delta " << dj << " pair " << j
              << " got " << got << " want " << exact[c];
          EXPECT_LE(std::fabs(got - ref[idx[c]]), b_applied)
              << "vs apply at p + delta: position " << p << " delta " << dj << " pair " << j << " got " << got
              << " want " << ref[idx[c]];
          if (rho * s1 > 0) worst = std::max(worst, std::fabs(got - exact[c]) / (kUnit * rho * s1));
          if (::testing::Test::HasFailure()) return worst;
        }
      }
    }
  }
  return worst;
}

TEST(XposRerotate, EqualsApplyAtMovedPositions) {
  double worst = 0;
  for (const auto& [name, spec] : {Named{"r64 half", Spec{.head_dim = 64}},
                                   Named{"r64 interleaved yarn", Spec{.head_dim = 64, .pairing = Pairing::interleaved,
                                                                      .schedule = ScheduleType::yarn, .factor = 16.0,
                                                                      .original_max_position = 4096}}}) {
    for (const Xpos x : {Xpos{512, 0}, Xpos{512, 12000.5}}) {
      const Schedule s = make_schedule(with_xpos(spec, x));
      const std::vector<int64_t> pos = {3000, 3001, 8000, 20000};
      for (const int64_t delta : {int64_t{1}, int64_t{-3000}, int64_t{12000}, int64_t{-2999}}) {
        for (const Direction dir : {Direction::forward, Direction::inverse}) {
          SCOPED_TRACE(testing::Message() << name << " c=" << x.center << " delta=" << delta
                                          << (dir == Direction::forward ? " forward" : " inverse"));
          worst = std::max(worst, check_rerotate(s, x, pos, {delta}, dir, 17));
          if (HasFailure()) return;
        }
      }
    }
  }
  // M-RoPE: each stream moves by its own delta, and each pair's scale by its stream's ζ^(-Δ/γ).
  const Xpos x{64, 1000};
  const Schedule m = make_schedule(with_xpos(Spec{.head_dim = 32, .base = 1e6, .stream_layout = StreamLayout::sections,
                                                  .sections = {4, 6, 6}}, x));
  const std::vector<int64_t> pos = {1010, 1500, 2000, 3000, 900, 20, 2500, 1200, 1000, 1001, 1002, 1003};
  for (const std::vector<int64_t>& delta : {std::vector<int64_t>{5, -10, 2000}, {-1000, 0, 7}, {77}}) {
    SCOPED_TRACE(testing::Message() << "mrope delta[0]=" << delta[0]);
    worst = std::max(worst, check_rerotate(m, x, pos, delta, Direction::forward, 19));
    if (HasFailure()) return;
  }
  std::printf("xPos rerotate: worst |result - exact| / (2^-23 rho (|a1| + |b1|)): %.3f (bound 1)\n", worst);
}

// A jump across nearly the whole reach, from c - 0.95 R to c + 0.95 R and back: both ends are valid
// positions, but the step's scale ρ_0 = ζ_0^(-Δ/γ) = e^(±1.9 * 80) = e^±152 is beyond float range
// on its own (rerotate.hpp: split over passes).
TEST(XposRerotate, AJumpAcrossTheWholeReachStaysExact) {
  const Xpos x{512, 40000};
  const Schedule s = make_schedule(with_xpos(Spec{.head_dim = 64}, x));
  const int64_t from = static_cast<int64_t>(40000 - 0.95 * reach(x.gamma));
  const int64_t delta = static_cast<int64_t>(1.9 * reach(x.gamma));
  const double up = check_rerotate(s, x, {from, from + 1}, {delta}, Direction::forward, 23, kF32Bound);
  const double down = check_rerotate(s, x, {from + delta, from + delta + 1}, {-delta}, Direction::inverse, 29, kF32Bound);
  std::printf("xPos rerotate across the reach: worst error / 2^-23 rho (|a1| + |b1|): %.3f up, %.3f down\n", up, down);
}

// switch_schedule between two schedules with the same xPos (LongRoPE short -> long): the keys'
// σ_k stays; they equal keys applied under the long schedule.
TEST(XposSwitch, LongRopeShortToLongKeepsTheScale) {
  Spec spec{.head_dim = 64, .schedule = ScheduleType::longrope, .original_max_position = 4096,
            .max_position = 131072};
  for (int j = 0; j < 32; ++j) {
    spec.short_factor.push_back(1.0 + 0.02 * j);
    spec.long_factor.push_back(1.0 + 1.5 * j);
  }
  const Xpos x{512, 2000};
  const Schedule shorter = make_schedule(with_xpos(spec, x), 4096), longer = make_schedule(with_xpos(spec, x), 8192);
  ASSERT_NE(shorter.inv_freq, longer.inv_freq);
  const std::vector<int64_t> pos = {0, 1, 2000, 4095, 8191, 30000};
  const std::vector<float> k0 = test::random_floats(pos.size() * 2 * 64, 31, 2.0f);
  std::vector<float> k = keys_at(shorter, k0, pos);
  const std::vector<float> stored = k;
  switch_schedule(shorter, longer, RotatedKeys{.k = TensorView::bshd(k.data(), DType::f32, 1, 6, 2, 64),
                                               .positions = Positions::per_token(std::span<const int64_t>(pos))});
  const std::vector<float> ref = keys_at(longer, k0, pos);
  for (size_t t = 0; t < pos.size(); ++t) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t j = 0; j < 32; ++j) {
        const auto [ca, cb] = longer.channels(j);
        const size_t ia = (t * 2 + static_cast<size_t>(h)) * 64 + static_cast<size_t>(ca);
        const size_t ib = (t * 2 + static_cast<size_t>(h)) * 64 + static_cast<size_t>(cb);
        const double sigma = pair_exact(longer, x, j, static_cast<double>(pos[t])).sigma_k * longer.attention_factor;
        const double s1 = std::fabs(stored[ia]) + std::fabs(stored[ib]), s0 = std::fabs(k0[ia]) + std::fabs(k0[ib]);
        const double dtheta = std::fabs(longer.inv_freq[static_cast<size_t>(j)] - shorter.inv_freq[static_cast<size_t>(j)]);
        const double bound = kF32Bound * (s1 + (std::sqrt(2.0) + 1) * sigma * s0) +
                             static_cast<double>(pos[t]) * dtheta * 0x1p-53 * s1 + kSubnormalSlack * (1 + s0);
        for (const size_t i : {ia, ib}) {
          ASSERT_LE(std::fabs(k[i] - ref[i]), bound) << "position " << pos[t] << " pair " << j << " element " << i;
        }
      }
    }
  }
}

// ---- bad input ----------------------------------------------------------------------------------------

TEST(XposErrors, SpecAndScheduleRulesNameTheValue) {
  const Spec base{.head_dim = 64};
  auto spec = [&](std::optional<double> gamma, std::optional<double> center) {
    Spec s = base;
    s.xpos_scale_base = gamma;
    s.xpos_center = center;
    return s;
  };
  EXPECT_ROTARY_ERROR(validate(spec(std::nullopt, 100.0)), "xpos_center is set but xpos_scale_base is not");
  EXPECT_ROTARY_ERROR(validate(spec(0.0, std::nullopt)), "xpos_scale_base=0 must be > 0");
  EXPECT_ROTARY_ERROR(validate(spec(-512.0, std::nullopt)), "xpos_scale_base=-512 must be > 0");
  EXPECT_ROTARY_ERROR(validate(spec(NAN, std::nullopt)), "xpos_scale_base=nan must be finite");
  EXPECT_ROTARY_ERROR(validate(spec(INFINITY, std::nullopt)), "xpos_scale_base=inf must be finite");
  EXPECT_ROTARY_ERROR(validate(spec(512.0, NAN)), "xpos_center=nan must be finite");
  EXPECT_ROTARY_ERROR(validate(spec(512.0, -INFINITY)), "xpos_center=-inf must be finite");
  EXPECT_ROTARY_ERROR(make_schedule(spec(512.0, INFINITY)), "xpos_center=inf must be finite");
  EXPECT_NO_THROW(validate(spec(512.0, -7.5)));
  // A Schedule built by hand.
  const Schedule good = make_schedule(spec(512.0, 0.0));
  auto with = [&](auto edit) { Schedule t = good; edit(t); return t; };
  EXPECT_ROTARY_ERROR(validate(with([](Schedule& t) { t.xpos_scale_base = -1; })), "xpos_scale_base=-1");
  EXPECT_ROTARY_ERROR(validate(with([](Schedule& t) { t.xpos_scale_base = NAN; })), "xpos_scale_base=nan");
  EXPECT_ROTARY_ERROR(validate(with([](Schedule& t) { t.xpos_center = INFINITY; })), "xpos_center=inf must be finite");
  EXPECT_ROTARY_ERROR(validate(with([](Schedule& t) { t.xpos_log_zeta.pop_back(); })), "xpos_log_zeta has 31 values");
  EXPECT_ROTARY_ERROR(validate(with([](Schedule& t) { t.xpos_log_zeta[3] = 0.0; })), "xpos_log_zeta[3]=0");
  EXPECT_ROTARY_ERROR(validate(with([](Schedule& t) { t.xpos_log_zeta[5] = NAN; })), "xpos_log_zeta[5]=nan");
  // σ up to e^80 times cos·g must stay a normal float: the factor is held to [2^-10, 2^12].
  EXPECT_ROTARY_ERROR(validate(with([](Schedule& t) { t.attention_factor = 1e4; })), "attention_factor=10000");
  Spec big = spec(512.0, std::nullopt);
  big.attention_factor = 1e-4;
  EXPECT_ROTARY_ERROR(make_schedule(big), "attention_factor=0.0001");
}

// Buffers whose contents a refused call must leave alone.
struct Untouched {
  std::vector<float> q = test::random_floats(4 * 2 * 64, 41), k = test::random_floats(4 * 1 * 64, 42);
  const std::vector<float> q0 = q, k0 = k;
  TensorView qv(int64_t tokens = 4) { return TensorView::bshd(q.data(), DType::f32, 1, tokens, 2, 64); }
  TensorView kv(int64_t tokens = 4) { return TensorView::bshd(k.data(), DType::f32, 1, tokens, 1, 64); }
  void expect_untouched() const {
    EXPECT_EQ(q, q0);
    EXPECT_EQ(k, k0);
  }
};

TEST(XposErrors, PositionsBeyondTheReachNameThePositionAndACentre) {
  // γ = 512: reach 80 * 512 / ln 3.5 = 32695.73 either side of c.
  const Schedule s = make_schedule(with_xpos(Spec{.head_dim = 64}, {512, 0}));
  ASSERT_NEAR(xpos_reach(s), 32695.73, 0.01);
  auto call = [&](Untouched& b, const std::vector<int64_t>& pos) {
    apply(s, ApplyArgs{.q = b.qv(static_cast<int64_t>(pos.size())), .k = b.kv(static_cast<int64_t>(pos.size())),
                       .positions = Positions::per_token(std::span<const int64_t>(pos))});
  };
  {
    Untouched b;
    EXPECT_ROTARY_ERROR(call(b, {0, 10, 20, 40000}), "positions[3]=40000");
    EXPECT_ROTARY_ERROR(call(b, {0, 10, 20, 40000}), "xpos_center=20000 serves this call's positions [0, 40000]");
    b.expect_untouched();
    // ... and it does.
    const Schedule centred = make_schedule(with_xpos(Spec{.head_dim = 64}, {512, 20000}));
    const std::vector<int64_t> pos = {0, 10, 20, 40000};
    EXPECT_NO_THROW(apply(centred, ApplyArgs{.q = b.qv(), .positions = Positions::per_token(std::span<const int64_t>(pos))}));
  }
  {
    Untouched b;  // the last position within the reach is fine, the next one is refused
    EXPECT_NO_THROW(call(b, {0, 1, 2, 32695}));
  }
  {
    Untouched b;
    EXPECT_ROTARY_ERROR(call(b, {0, 1, 2, 32696}), "positions[3]=32696");
    EXPECT_ROTARY_ERROR(call(b, {0, 1, 2, 32696}), "xpos_center=16348");
    b.expect_untouched();
  }
  {
    Untouched b;  // spanning more than twice the reach: no centre serves; rerotate is the way
    EXPECT_ROTARY_ERROR(call(b, {0, 70000, 5, 6}), "positions[1]=70000");
    EXPECT_ROTARY_ERROR(call(b, {0, 70000, 5, 6}), "no one xpos_center serves this call's positions [0, 70000]");
    EXPECT_ROTARY_ERROR(call(b, {0, 70000, 5, 6}), "rerotate");
    b.expect_untouched();
  }
  {
    Untouched b;  // sequential positions: the offset's token beyond the reach
    EXPECT_ROTARY_ERROR(apply(s, ApplyArgs{.q = b.qv(), .positions = Positions::sequential(32694)}), "32697");
    EXPECT_ROTARY_ERROR(apply(s, ApplyArgs{.q = b.qv(), .positions = Positions::sequential(32694)}),
                        "xpos_center=32695.5");
    b.expect_untouched();
  }
  {
    // A centre far from 0: positions below it are refused as well; fractional positions too.
    const Schedule far = make_schedule(with_xpos(Spec{.head_dim = 64}, {64, 100000}));
    Untouched b;
    const std::vector<double> pos = {100000, 95000.5, 100001, 100002};
    EXPECT_ROTARY_ERROR(apply(far, ApplyArgs{.q = b.qv(), .positions = Positions::per_token(std::span<const double>(pos))}),
                        "positions[1]=95000.5");
    b.expect_untouched();
  }
  {
    // M-RoPE: the entry of the stream that leaves the reach is named.
    const Schedule m = make_schedule(with_xpos(Spec{.head_dim = 64, .base = 1e6, .stream_layout = StreamLayout::sections,
                                                    .sections = {8, 12, 12}}, {64, 0}));
    Untouched b;
    const std::vector<int64_t> pos = {0, 1, 2, 3, 10, 11, 12, 13, 7, 6, 9000, 4};
    EXPECT_ROTARY_ERROR(apply(m, ApplyArgs{.q = b.qv(), .positions = Positions::per_token(std::span<const int64_t>(pos), 3)}),
                        "positions[2][2]=9000");
    b.expect_untouched();
  }
}

TEST(XposErrors, CallerAnglesQIsKeyWithKAndDifferingSwitchesAreRefused) {
  const Schedule s = make_schedule(with_xpos(Spec{.head_dim = 64}, {512, 0}));
  const Schedule plain = make_schedule(Spec{.head_dim = 64});
  Untouched b;
  std::vector<float> cos(4 * 64, 1.0f), sin(4 * 64, 0.0f);
  const CallerAngles angles{.cos = cos.data(), .sin = sin.data(), .shape = {1, 4, 64},
                            .cos_strides = {256, 64, 1}, .sin_strides = {256, 64, 1}};
  // The same angles serve the plain schedule (the call is well formed but for xPos).
  std::vector<float> q = b.q;
  EXPECT_NO_THROW(apply(plain, ApplyArgs{.q = TensorView::bshd(q.data(), DType::f32, 1, 4, 2, 64), .angles = &angles}));
  EXPECT_ROTARY_ERROR(apply(s, ApplyArgs{.q = b.qv(), .angles = &angles}), "xPos");
  EXPECT_ROTARY_ERROR(apply(s, ApplyArgs{.q = b.qv(), .k = b.kv(), .q_is_key = true}), "q_is_key");
  b.expect_untouched();
  // switch_schedule between schedules whose xPos settings differ: γ, c, or xPos on one side only.
  const RotatedKeys keys{.k = b.kv()};
  EXPECT_ROTARY_ERROR(switch_schedule(s, plain, keys), "schedules differ in xpos_scale_base: from 512, to 0");
  EXPECT_ROTARY_ERROR(switch_schedule(plain, s, keys), "schedules differ in xpos_scale_base: from 0, to 512");
  EXPECT_ROTARY_ERROR(switch_schedule(s, make_schedule(with_xpos(Spec{.head_dim = 64}, {256, 0})), keys),
                      "schedules differ in xpos_scale_base: from 512, to 256");
  EXPECT_ROTARY_ERROR(switch_schedule(s, make_schedule(with_xpos(Spec{.head_dim = 64}, {512, 10})), keys),
                      "schedules differ in xpos_center: from 0, to 10");
  // rerotate to positions beyond the reach: refused before any write, naming the position.
  const std::vector<int64_t> pos = {0, 30000, 5, 6};
  EXPECT_ROTARY_ERROR(rerotate(s, RotatedKeys{.k = b.kv(), .positions = Positions::per_token(std::span<const int64_t>(pos))},
                               std::vector<int64_t>{5000}),
                      "30000 + delta=5000 = 35000 is beyond xPos's reach");
  b.expect_untouched();
}

}  // namespace
}  // namespace rotary
