// apply: against the seeds' three formulations, properties, strides, aliasing, bad input.
#include <bit>
#include <cmath>
#include <complex>
#include <cstring>
#include <numeric>
#include <random>

#include <quadmath.h>

#include "math/half.hpp"
#include "math/rotate.hpp"
#include "rotary/apply.hpp"
#include "rotary/pairing.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

// DESIGN.md §3: |result - exact| <= 2^-23 g (|a| + |b|) per pair for f32.
constexpr double kF32PairBound = 0x1p-23;
// f64 computes in double with exact angles: a few double roundings.
constexpr double kF64PairBound = 0x1p-50;

std::vector<int64_t> test_positions() {
  return {0, 1, 2, 7, 4095, 4096, 8192, 131071, 1 << 20, 1000003, max_position_limit - 1};
}

// ---- the seeds' three formulations, written out in double with MPFR angles ----

// RoFormer: y = g R x with R block-diagonal (2x2 rotation blocks on the pairs), as a dense matrix.
std::vector<double> matrix_form(const std::vector<double>& x, const Schedule& s, int64_t p) {
  const int64_t d = s.head_dim, r = s.rotary_dim, h = r / 2;
  std::vector<double> m(static_cast<size_t>(r * r), 0.0);
  auto at = [&](int64_t row, int64_t col) -> double& { return m[static_cast<size_t>(row * r + col)]; };
  for (int64_t i = 0; i < h; ++i) {
    const test::Exact e = test::mpfr_cos_sin(p, s.inv_freq[static_cast<size_t>(i)]);
    const int64_t a = s.pairing == Pairing::interleaved ? 2 * i : i;
    const int64_t b = s.pairing == Pairing::interleaved ? 2 * i + 1 : i + h;
    at(a, a) = e.cos;
    at(a, b) = -e.sin;
    at(b, a) = e.sin;
    at(b, b) = e.cos;
  }
  std::vector<double> y(x);
  for (int64_t row = 0; row < r; ++row) {
    double acc = 0;
    for (int64_t col = 0; col < r; ++col) acc += at(row, col) * x[static_cast<size_t>(col)];
    y[static_cast<size_t>(row)] = s.attention_factor * acc;
  }
  (void)d;
  return y;
}

// Hugging Face: q * cos + rotate_half(q) * sin, cos/sin repeated over both halves.
std::vector<double> rotate_half_form(const std::vector<double>& x, const Schedule& s, int64_t p) {
  const int64_t r = s.rotary_dim, h = r / 2;
  std::vector<double> cos_full(static_cast<size_t>(r)), sin_full(static_cast<size_t>(r));
  for (int64_t i = 0; i < h; ++i) {
    const test::Exact e = test::mpfr_cos_sin(p, s.inv_freq[static_cast<size_t>(i)], s.attention_factor);
    cos_full[static_cast<size_t>(i)] = cos_full[static_cast<size_t>(i + h)] = e.cos;
    sin_full[static_cast<size_t>(i)] = sin_full[static_cast<size_t>(i + h)] = e.sin;
  }
  std::vector<double> rotated(static_cast<size_t>(r));
  for (int64_t j = 0; j < h; ++j) rotated[static_cast<size_t>(j)] = -x[static_cast<size_t>(j + h)];
  for (int64_t j = h; j < r; ++j) rotated[static_cast<size_t>(j)] = x[static_cast<size_t>(j - h)];
  std::vector<double> y(x);
  for (int64_t j = 0; j < r; ++j) {
    const auto u = static_cast<size_t>(j);
    y[u] = x[u] * cos_full[u] + rotated[u] * sin_full[u];
  }
  return y;
}

// Meta LLaMA / Mistral: view pairs as complex numbers, multiply by g e^{i p θ}.
std::vector<double> complex_form(const std::vector<double>& x, const Schedule& s, int64_t p) {
  std::vector<double> y(x);
  for (int64_t i = 0; i < s.rotary_dim / 2; ++i) {
    const std::complex<double> z(x[static_cast<size_t>(2 * i)], x[static_cast<size_t>(2 * i + 1)]);
    const test::Exact e = test::mpfr_cos_sin(p, s.inv_freq[static_cast<size_t>(i)]);
    const std::complex<double> w = z * std::complex<double>(e.cos, e.sin) * s.attention_factor;
    y[static_cast<size_t>(2 * i)] = w.real();
    y[static_cast<size_t>(2 * i + 1)] = w.imag();
  }
  return y;
}

// Pair-wise check of a rotated head against an expected one, in the unit of the contract.
void expect_within_contract(const std::vector<double>& in, const std::vector<double>& got,
                            const std::vector<double>& want, const Schedule& s, double bound,
                            const std::string& where) {
  const int64_t h = s.rotary_dim / 2;
  for (int64_t i = 0; i < h; ++i) {
    const int64_t a = s.pairing == Pairing::interleaved ? 2 * i : i;
    const int64_t b = s.pairing == Pairing::interleaved ? 2 * i + 1 : i + h;
    const double limit = bound * s.attention_factor *
                         (std::fabs(in[static_cast<size_t>(a)]) + std::fabs(in[static_cast<size_t>(b)]));
    for (int64_t j : {a, b}) {
      ASSERT_LE(std::fabs(got[static_cast<size_t>(j)] - want[static_cast<size_t>(j)]), limit)
          << where << " pair " << i << " channel " << j;
    }
  }
  for (int64_t j = s.rotary_dim; j < s.head_dim; ++j) {
    ASSERT_EQ(got[static_cast<size_t>(j)], want[static_cast<size_t>(j)]) << where << " tail " << j;
  }
}

// Rotates one head at one position with apply, f32 or f64, table or on the fly.
std::vector<double> apply_one(const std::vector<double>& x, const Schedule& s, int64_t p, DType dtype,
                              bool use_table) {
  const int64_t d = s.head_dim;
  std::vector<double> out(static_cast<size_t>(d));
  const Table table = Table::at(s, std::vector<int64_t>{p});
  const Positions positions = Positions::sequential(p);
  if (dtype == DType::f32) {
    std::vector<float> buffer(x.begin(), x.end());
    apply(s, ApplyArgs{.q = TensorView::bshd(buffer.data(), DType::f32, 1, 1, 1, d),
                       .positions = positions,
                       .table = use_table ? &table : nullptr});
    std::copy(buffer.begin(), buffer.end(), out.begin());
  } else {
    std::vector<double> buffer(x);
    apply(s, ApplyArgs{.q = TensorView::bshd(buffer.data(), DType::f64, 1, 1, 1, d),
                       .positions = positions,
                       .table = use_table ? &table : nullptr});
    out = buffer;
  }
  return out;
}

std::vector<Schedule> formulation_schedules(Pairing pairing) {
  std::vector<Schedule> out;
  out.push_back(make_schedule(Spec{.head_dim = 64, .pairing = pairing}));
  out.push_back(make_schedule(Spec{.head_dim = 80, .rotary_dim = 32, .pairing = pairing}));  // partial
  out.push_back(make_schedule(Spec{.head_dim = 128, .base = 1e6, .pairing = pairing,
                                   .schedule = ScheduleType::yarn, .factor = 4.0,
                                   .original_max_position = 32768}));  // attention_factor != 1
  return out;
}

TEST(ApplyFormulations, MatrixRotateHalfAndComplexAgreeWithApply) {
  int checked = 0;
  for (Pairing pairing : {Pairing::interleaved, Pairing::half}) {
    for (const Schedule& s : formulation_schedules(pairing)) {
      for (int64_t p : test_positions()) {
        std::vector<double> x64 = test::random_doubles(static_cast<size_t>(s.head_dim),
                                                       static_cast<uint64_t>(p) + 3);
        // f32 inputs must be representable: round the random vector to float first.
        std::vector<double> x32(x64.size());
        for (size_t j = 0; j < x64.size(); ++j) x32[j] = static_cast<float>(x64[j]);
        std::vector<std::vector<double> (*)(const std::vector<double>&, const Schedule&, int64_t)> forms =
            {matrix_form};
        if (pairing == Pairing::half) forms.push_back(rotate_half_form);
        else forms.push_back(complex_form);
        for (auto form : forms) {
          const std::string where = std::string(to_string(pairing)) + " head_dim " +
                                    std::to_string(s.head_dim) + " position " + std::to_string(p);
          for (bool table : {true, false}) {
            expect_within_contract(x32, apply_one(x32, s, p, DType::f32, table), form(x32, s, p), s,
                                   kF32PairBound, where + " f32");
            expect_within_contract(x64, apply_one(x64, s, p, DType::f64, false), form(x64, s, p), s,
                                   kF64PairBound, where + " f64");
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

// ---- the contract on adversarial pairs ----

// Pairs where rounding errors line up: one input much smaller than the other, angles just off a
// quarter turn (sin or cos near ±g, the other tiny) and an eighth turn, attention_factor 1 and not.
// The oracle rotates the float inputs by the exact angle in binary128 (libquadmath: the angle
// p * 1.0 is exact, its cos/sin good to ~2^-112). Both the CPU kernels and the reference must stay
// within the contract; the plain fma(a, c, -fl(b s)) formula on the same table values must not,
// which shows the inputs are adversarial enough to tell the two apart.
TEST(ApplyAccuracy, AdversarialPairsStayWithinTheContract) {
  // Angles p rad closest to a multiple of π/2 (continued fraction of π/2, MPFR), their
  // neighbours, and a few small positions (angles near π/4, π/2, 3π/4 ...).
  std::vector<int64_t> positions = {1, 2, 3, 4, 5, 7, 8, 10};
  for (int64_t p : test::near_quarter_turns(1.0, max_position_limit - 1)) {
    positions.push_back(p);
    positions.push_back(p + 1);
  }
  const int64_t per_position = 1 << 15;
  std::mt19937_64 rng(2024);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  double worst_cpu = 0, worst_reference = 0, worst_plain = 0;
  for (double g : {1.0, 1.3706}) {
    Schedule s;
    s.head_dim = 2;
    s.rotary_dim = 2;
    s.inv_freq = {1.0};  // angle = position
    s.attention_factor = g;
    for (bool use_table : {true, false}) {
      const int64_t n = static_cast<int64_t>(positions.size()) * per_position;
      std::vector<float> x(static_cast<size_t>(2 * n));
      for (int64_t k = 0; k < n; ++k) {
        float big = static_cast<float>((1.0 + u01(rng)) * (rng() & 1 ? 1 : -1));
        float small = static_cast<float>(std::ldexp(1.0 + u01(rng), -static_cast<int>(u01(rng) * 40)) *
                                         (rng() & 1 ? 1 : -1));
        if (k % 3 == 2) small = static_cast<float>((1.0 + u01(rng)) * (rng() & 1 ? 1 : -1));
        const bool swap = (k / 3) % 2 == 1;
        x[static_cast<size_t>(2 * k)] = swap ? big : small;
        x[static_cast<size_t>(2 * k + 1)] = swap ? small : big;
      }
      // One token per position, per_position heads of one pair each.
      const int64_t seq = static_cast<int64_t>(positions.size());
      const Table table = Table::at(s, positions);
      std::vector<float> cpu = x, reference = x;
      for (auto [buffer, backend] : {std::pair{&cpu, Backend::cpu}, std::pair{&reference, Backend::reference}}) {
        apply(s, ApplyArgs{.q = TensorView::bshd(buffer->data(), DType::f32, 1, seq, per_position, 2),
                           .positions = Positions::per_token(positions),
                           .table = use_table ? &table : nullptr, .backend = backend});
      }
      for (int64_t t = 0; t < seq; ++t) {
        const __float128 angle = static_cast<__float128>(positions[static_cast<size_t>(t)]);
        const __float128 C = cosq(angle) * g, S = sinq(angle) * g;
        const float c = table.cos_row(t)[0], sn = table.sin_row(t)[0];
        for (int64_t h = 0; h < per_position; ++h) {
          const size_t k = static_cast<size_t>(2 * (t * per_position + h));
          const float a = x[k], b = x[k + 1];
          const __float128 ea = a * C - b * S, eb = a * S + b * C;
          const double unit = 0x1p-23 * g * (std::fabs(a) + std::fabs(b));
          auto err = [&](float got, __float128 want) {
            return static_cast<double>(fabsq(static_cast<__float128>(got) - want)) / unit;
          };
          const double e_cpu = std::max(err(cpu[k], ea), err(cpu[k + 1], eb));
          const double e_ref = std::max(err(reference[k], ea), err(reference[k + 1], eb));
          ASSERT_LE(e_cpu, 1.0) << "cpu g " << g << " position " << positions[static_cast<size_t>(t)] << " a " << a << " b " << b;
          ASSERT_LE(e_ref, 1.0) << "reference g " << g << " position " << positions[static_cast<size_t>(t)] << " a " << a << " b " << b;
          worst_cpu = std::max(worst_cpu, e_cpu);
          worst_reference = std::max(worst_reference, e_ref);
          if (use_table) {  // the naive float32 formula with the same table values
            const float pa = detail::fma_f32(a, c, -(b * sn)), pb = detail::fma_f32(a, sn, b * c);
            worst_plain = std::max({worst_plain, err(pa, ea), err(pb, eb)});
          }
        }
      }
    }
  }
  std::printf("adversarial pairs, worst error in units of 2^-23 g (|a|+|b|): cpu %.4f, reference %.4f, "
              "plain fma %.4f\n", worst_cpu, worst_reference, worst_plain);
  EXPECT_GT(worst_plain, 1.0) << "the inputs no longer separate the formulas";
}

// ---- properties ----

double dot(const double* a, const double* b, int64_t n) {
  double acc = 0;
  for (int64_t j = 0; j < n; ++j) acc += a[j] * b[j];
  return acc;
}

TEST(ApplyProperties, ScoreDependsOnlyOnRelativePosition) {
  for (Pairing pairing : {Pairing::interleaved, Pairing::half}) {
    const Schedule s = make_schedule(Spec{.head_dim = 64, .pairing = pairing});
    const std::vector<double> q0 = test::random_doubles(64, 1);
    const std::vector<double> k0 = test::random_doubles(64, 2);
    const double scale = std::sqrt(dot(q0.data(), q0.data(), 64) * dot(k0.data(), k0.data(), 64));
    std::mt19937_64 rng(5);
    std::uniform_int_distribution<int64_t> any(0, max_position_limit - 5000);
    for (int64_t distance : {0, 1, 3, 17, 1000, 4095}) {
      double reference = 0;
      for (int trial = 0; trial < 12; ++trial) {
        const int64_t m = trial == 0 ? 0 : any(rng);
        const int64_t n = m + distance;
        std::vector<double> q = q0, k = k0;
        std::vector<int64_t> pq{m}, pk{n};
        apply(s, {.q = TensorView::bshd(q.data(), DType::f64, 1, 1, 1, 64),
                  .positions = Positions::per_token(pq)});
        apply(s, {.q = TensorView::bshd(k.data(), DType::f64, 1, 1, 1, 64),
                  .positions = Positions::per_token(pk)});
        const double score = dot(q.data(), k.data(), 64);
        if (trial == 0) reference = score;
        EXPECT_NEAR(score, reference, 1e-13 * scale) << "m " << m << " n " << n;
      }
    }
  }
}

TEST(ApplyProperties, NormPreservedAndInverseUndoesForward) {
  for (Pairing pairing : {Pairing::interleaved, Pairing::half}) {
    const Schedule s = make_schedule(Spec{.head_dim = 96, .rotary_dim = 64, .pairing = pairing});
    const int64_t seq = 33, heads = 3, d = 96;
    const std::vector<float> original = test::random_floats(static_cast<size_t>(seq * heads * d), 9);
    std::vector<float> x = original;
    const auto view = TensorView::bshd(x.data(), DType::f32, 1, seq, heads, d);
    const Positions positions = Positions::sequential(max_position_limit - seq);
    apply(s, {.q = view, .positions = positions});
    for (int64_t t = 0; t < seq * heads; ++t) {
      double before = 0, after = 0;
      for (int64_t j = 0; j < d; ++j) {
        before += double(original[static_cast<size_t>(t * d + j)]) * original[static_cast<size_t>(t * d + j)];
        after += double(x[static_cast<size_t>(t * d + j)]) * x[static_cast<size_t>(t * d + j)];
      }
      EXPECT_NEAR(std::sqrt(after), std::sqrt(before), 4 * 0x1p-23 * std::sqrt(before)) << "row " << t;
    }
    apply(s, {.q = view, .positions = positions, .direction = Direction::inverse});
    for (size_t j = 0; j < x.size(); ++j) {
      // forward then inverse: two roundings of the contract each
      ASSERT_NEAR(x[j], original[j], 4 * 0x1p-23 * (std::fabs(original[j]) + 4)) << j;
    }
  }
}

TEST(ApplyProperties, InverseIsTheTransposeWithAttentionFactor) {
  // <R x, y> = <x, R^T y>: the inverse is the backward pass even when attention_factor != 1.
  const Schedule s = make_schedule(Spec{.head_dim = 32, .schedule = ScheduleType::yarn, .factor = 8.0,
                                        .original_max_position = 2048});
  ASSERT_NE(s.attention_factor, 1.0);
  std::vector<double> x = test::random_doubles(32, 1), y = test::random_doubles(32, 2);
  std::vector<double> rx = x, rty = y;
  apply(s, {.q = TensorView::bshd(rx.data(), DType::f64, 1, 1, 1, 32), .positions = Positions::sequential(77777)});
  apply(s, {.q = TensorView::bshd(rty.data(), DType::f64, 1, 1, 1, 32), .positions = Positions::sequential(77777),
            .direction = Direction::inverse});
  EXPECT_NEAR(dot(rx.data(), y.data(), 32), dot(x.data(), rty.data(), 32), 1e-13);
}

TEST(ApplyProperties, PairingsGiveEqualScoresAfterWeightPermutationGqa) {
  // 32 query heads, 8 key/value heads sharing them in groups of 4 (Llama-3-8B's ratio).
  const int64_t hidden = 24, hq = 32, hk = 8, d = 16, seq = 5;
  const std::vector<double> wq = test::random_doubles(static_cast<size_t>(hq * d * hidden), 21);
  const std::vector<double> wk = test::random_doubles(static_cast<size_t>(hk * d * hidden), 22);
  const std::vector<double> x = test::random_doubles(static_cast<size_t>(seq * hidden), 23);
  auto project = [&](const std::vector<double>& w, int64_t rows) {
    std::vector<double> out(static_cast<size_t>(seq * rows));
    for (int64_t t = 0; t < seq; ++t)
      for (int64_t row = 0; row < rows; ++row)
        out[static_cast<size_t>(t * rows + row)] =
            dot(&w[static_cast<size_t>(row * hidden)], &x[static_cast<size_t>(t * hidden)], hidden);
    return out;
  };
  auto scores = [&](const std::vector<double>& wq_, const std::vector<double>& wk_, Pairing pairing) {
    const Schedule s = make_schedule(Spec{.head_dim = d, .pairing = pairing});
    std::vector<double> q = project(wq_, hq * d), k = project(wk_, hk * d);
    apply(s, {.q = TensorView::bshd(q.data(), DType::f64, 1, seq, hq, d),
              .k = TensorView::bshd(k.data(), DType::f64, 1, seq, hk, d),
              .positions = Positions::sequential(100000)});
    std::vector<double> out;
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < seq; ++i)
        for (int64_t j = 0; j < seq; ++j)
          out.push_back(dot(&q[static_cast<size_t>((i * hq + h) * d)],
                            &k[static_cast<size_t>((j * hk + h / (hq / hk)) * d)], d));
    return out;
  };
  // Meta-style interleaved weights, converted to half pairing by row permutation.
  std::vector<double> wq_half(wq.size()), wk_half(wk.size());
  const int64_t row_bytes = hidden * 8;
  permute_rows(wq.data(), wq_half.data(), {.num_heads = hq, .head_dim = d, .row_bytes = row_bytes,
                                           .from = Pairing::interleaved, .to = Pairing::half});
  permute_rows(wk.data(), wk_half.data(), {.num_heads = hk, .head_dim = d, .row_bytes = row_bytes,
                                           .from = Pairing::interleaved, .to = Pairing::half});
  const std::vector<double> a = scores(wq, wk, Pairing::interleaved);
  const std::vector<double> b = scores(wq_half, wk_half, Pairing::half);
  const std::vector<double> wrong = scores(wq, wk, Pairing::half);  // mixing conventions
  double worst = 0, worst_wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]));
    worst_wrong = std::max(worst_wrong, std::fabs(a[i] - wrong[i]));
  }
  EXPECT_LT(worst, 1e-11);
  EXPECT_GT(worst_wrong, 1.0);  // the silent bug this library exists to prevent
}

TEST(ApplyProperties, PartialRotaryTailIsBitIdentical) {
  const Schedule s = make_schedule(Spec{.head_dim = 80, .rotary_dim = 20});
  std::vector<uint32_t> bits(2 * 3 * 80);
  std::mt19937 rng(4);
  for (auto& b : bits) b = rng();  // any bit pattern, NaN payloads included
  std::vector<float> in(bits.size());
  std::memcpy(in.data(), bits.data(), bits.size() * 4);
  for (size_t t = 0; t < 6; ++t)
    for (size_t j = 0; j < 20; ++j) in[t * 80 + j] = static_cast<float>(j) - 7.5f;  // finite rotated part
  // in place: tail untouched
  std::vector<float> x = in;
  apply(s, {.q = TensorView::bshd(x.data(), DType::f32, 2, 3, 1, 80)});
  // out of place: tail copied bit for bit; with copy_tail = false, left as it was
  std::vector<float> out(in.size(), 0.0f), out_nocopy(in.size(), 0.0f);
  apply(s, {.q = TensorView::bshd(in.data(), DType::f32, 2, 3, 1, 80),
            .q_out = TensorView::bshd(out.data(), DType::f32, 2, 3, 1, 80)});
  apply(s, {.q = TensorView::bshd(in.data(), DType::f32, 2, 3, 1, 80),
            .q_out = TensorView::bshd(out_nocopy.data(), DType::f32, 2, 3, 1, 80), .copy_tail = false});
  for (size_t t = 0; t < 6; ++t) {
    for (size_t j = 20; j < 80; ++j) {
      const size_t e = t * 80 + j;
      EXPECT_EQ(std::bit_cast<uint32_t>(x[e]), bits[e]);
      EXPECT_EQ(std::bit_cast<uint32_t>(out[e]), bits[e]);
      EXPECT_EQ(out_nocopy[e], 0.0f);
    }
    for (size_t j = 0; j < 20; ++j) EXPECT_EQ(x[t * 80 + j], out[t * 80 + j]);
  }
}

TEST(ApplyDtypes, HalfAndBfloatEqualTheF32ResultRoundedOnce) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (Pairing pairing : {Pairing::interleaved, Pairing::half}) {
      const Schedule s = make_schedule(Spec{.head_dim = 64, .rotary_dim = 48, .pairing = pairing,
                                            .schedule = ScheduleType::yarn, .factor = 4,
                                            .original_max_position = 4096});
      const int64_t n = 2 * 7 * 3 * 64;
      std::vector<float> wide = test::random_floats(static_cast<size_t>(n), 31, 3.0f);
      std::vector<uint16_t> narrow(static_cast<size_t>(n));
      for (size_t j = 0; j < narrow.size(); ++j) {
        narrow[j] = dtype == DType::f16 ? detail::f32_to_f16(wide[j]) : detail::f32_to_bf16(wide[j]);
        wide[j] = dtype == DType::f16 ? detail::f16_to_f32(narrow[j]) : detail::bf16_to_f32(narrow[j]);
      }
      const std::vector<int64_t> positions = {5, 70000, max_position_limit - 1, 0, 1, 2, 3,
                                              8, 9, 10, 11, 12, 13, 99};
      for (bool table : {false, true}) {
        const Table t = Table::at(s, positions);
        std::vector<float> f32 = wide;
        std::vector<uint16_t> h = narrow;
        apply(s, {.q = TensorView::bshd(f32.data(), DType::f32, 2, 7, 3, 64),
                  .positions = Positions::per_token(positions), .table = table ? &t : nullptr});
        apply(s, {.q = TensorView::bshd(h.data(), dtype, 2, 7, 3, 64),
                  .positions = Positions::per_token(positions), .table = table ? &t : nullptr});
        for (size_t j = 0; j < h.size(); ++j) {
          const uint16_t expected = dtype == DType::f16 ? detail::f32_to_f16(f32[j]) : detail::f32_to_bf16(f32[j]);
          ASSERT_EQ(h[j], expected) << to_string(dtype) << " element " << j;
        }
      }
    }
  }
}

// ---- strides and aliasing ----

TEST(ApplyStrides, BshdAndBhsdViewsOfTheSameValues) {
  const Schedule s = make_schedule(Spec{.head_dim = 32, .pairing = Pairing::interleaved});
  const int64_t b = 2, seq = 9, h = 3, d = 32;
  std::vector<float> bshd = test::random_floats(static_cast<size_t>(b * seq * h * d), 41);
  std::vector<float> bhsd(bshd.size());
  for (int64_t i0 = 0; i0 < b; ++i0)
    for (int64_t i1 = 0; i1 < seq; ++i1)
      for (int64_t i2 = 0; i2 < h; ++i2)
        for (int64_t j = 0; j < d; ++j)
          bhsd[static_cast<size_t>(((i0 * h + i2) * seq + i1) * d + j)] =
              bshd[static_cast<size_t>(((i0 * seq + i1) * h + i2) * d + j)];
  apply(s, {.q = TensorView::bshd(bshd.data(), DType::f32, b, seq, h, d), .positions = Positions::sequential(40)});
  apply(s, {.q = TensorView::bhsd(bhsd.data(), DType::f32, b, h, seq, d), .positions = Positions::sequential(40)});
  for (int64_t i0 = 0; i0 < b; ++i0)
    for (int64_t i1 = 0; i1 < seq; ++i1)
      for (int64_t i2 = 0; i2 < h; ++i2)
        for (int64_t j = 0; j < d; ++j)
          ASSERT_EQ(bhsd[static_cast<size_t>(((i0 * h + i2) * seq + i1) * d + j)],
                    bshd[static_cast<size_t>(((i0 * seq + i1) * h + i2) * d + j)]);
}

TEST(ApplyStrides, FusedQkvSliceMatchesSeparateTensors) {
  // [batch, seq, (hq + 2 hk), d]: q, k, v side by side per token; rotate q and k in place.
  const Schedule s = make_schedule(Spec{.head_dim = 16});
  const int64_t b = 2, seq = 5, hq = 4, hk = 2, d = 16, width = (hq + 2 * hk) * d;
  std::vector<float> fused = test::random_floats(static_cast<size_t>(b * seq * width), 51);
  const std::vector<float> before = fused;
  std::vector<float> q(static_cast<size_t>(b * seq * hq * d)), k(static_cast<size_t>(b * seq * hk * d));
  for (int64_t t = 0; t < b * seq; ++t) {
    std::memcpy(&q[static_cast<size_t>(t * hq * d)], &fused[static_cast<size_t>(t * width)], hq * d * 4);
    std::memcpy(&k[static_cast<size_t>(t * hk * d)], &fused[static_cast<size_t>(t * width + hq * d)], hk * d * 4);
  }
  TensorView qv{.data = fused.data(), .dtype = DType::f32, .shape = {b, seq, hq, d},
                .strides = {seq * width, width, d, 1}};
  TensorView kv = qv;
  kv.data = fused.data() + hq * d;
  kv.shape[2] = hk;
  apply(s, {.q = qv, .k = kv, .positions = Positions::sequential(3)});
  apply(s, {.q = TensorView::bshd(q.data(), DType::f32, b, seq, hq, d),
            .k = TensorView::bshd(k.data(), DType::f32, b, seq, hk, d), .positions = Positions::sequential(3)});
  for (int64_t t = 0; t < b * seq; ++t) {
    for (int64_t j = 0; j < hq * d; ++j)
      ASSERT_EQ(fused[static_cast<size_t>(t * width + j)], q[static_cast<size_t>(t * hq * d + j)]);
    for (int64_t j = 0; j < hk * d; ++j)
      ASSERT_EQ(fused[static_cast<size_t>(t * width + hq * d + j)], k[static_cast<size_t>(t * hk * d + j)]);
    for (int64_t j = (hq + hk) * d; j < width; ++j)  // v untouched
      ASSERT_EQ(fused[static_cast<size_t>(t * width + j)], before[static_cast<size_t>(t * width + j)]);
  }
}

TEST(ApplyStrides, InPlaceEqualsOutOfPlaceAndEveryOutputIsWritten) {
  const Schedule s = make_schedule(Spec{.head_dim = 24, .rotary_dim = 16});
  const int64_t b = 2, seq = 7, h = 3, d = 24, n = b * seq * h * d;
  const std::vector<float> in = test::random_floats(static_cast<size_t>(n), 61);
  std::vector<float> x = in;
  apply(s, {.q = TensorView::bshd(x.data(), DType::f32, b, seq, h, d)});
  // Out of place into a poisoned buffer with guard zones; reversed (negative) strides as well.
  const float poison = std::bit_cast<float>(0x7fc12345u);
  const int64_t guard = 37;
  std::vector<float> out(static_cast<size_t>(n + 2 * guard), poison);
  TensorView ov = TensorView::bshd(out.data() + guard, DType::f32, b, seq, h, d);
  apply(s, {.q = TensorView::bshd(const_cast<float*>(in.data()), DType::f32, b, seq, h, d), .q_out = ov});
  for (int64_t j = 0; j < n; ++j) ASSERT_EQ(out[static_cast<size_t>(guard + j)], x[static_cast<size_t>(j)]) << j;
  for (int64_t j = 0; j < guard; ++j) {
    ASSERT_EQ(std::bit_cast<uint32_t>(out[static_cast<size_t>(j)]), 0x7fc12345u);
    ASSERT_EQ(std::bit_cast<uint32_t>(out[static_cast<size_t>(guard + n + j)]), 0x7fc12345u);
  }
  // Reversed seq axis: a negative stride reads token s from the mirrored place.
  std::vector<float> rev(static_cast<size_t>(n));
  TensorView rv{.data = rev.data() + (seq - 1) * h * d, .dtype = DType::f32, .shape = {b, seq, h, d},
                .strides = {seq * h * d, -h * d, d, 1}};
  apply(s, {.q = TensorView::bshd(const_cast<float*>(in.data()), DType::f32, b, seq, h, d), .q_out = rv});
  for (int64_t i0 = 0; i0 < b; ++i0)
    for (int64_t i1 = 0; i1 < seq; ++i1)
      for (int64_t j = 0; j < h * d; ++j)
        ASSERT_EQ(rev[static_cast<size_t>(i0 * seq * h * d + (seq - 1 - i1) * h * d + j)],
                  x[static_cast<size_t>((i0 * seq + i1) * h * d + j)]);
}

TEST(ApplyStrides, ZeroTokensIsANoOp) {
  const Schedule s = make_schedule(Spec{.head_dim = 8});
  std::vector<float> x(8, 1.0f);
  apply(s, {.q = TensorView::bshd(x.data(), DType::f32, 1, 0, 1, 8)});
  apply(s, {.q = TensorView::bshd(x.data(), DType::f32, 0, 5, 1, 8)});
  apply(s, {.q = TensorView::bshd(x.data(), DType::f32, 1, 1, 0, 8), .positions = Positions::sequential(1)});
  EXPECT_EQ(x, std::vector<float>(8, 1.0f));
}

TEST(ApplyPositions, PerTokenMatchesPerSequenceOffsets) {
  const Schedule s = make_schedule(Spec{.head_dim = 32, .schedule = ScheduleType::linear, .factor = 2});
  const int64_t b = 3, seq = 4, h = 2, d = 32;
  const std::vector<float> in = test::random_floats(static_cast<size_t>(b * seq * h * d), 71);
  const int64_t offsets[3] = {0, 1000, max_position_limit - seq};
  std::vector<int32_t> p32;
  std::vector<int64_t> p64;
  for (int64_t i0 = 0; i0 < b; ++i0)
    for (int64_t i1 = 0; i1 < seq; ++i1) {
      p32.push_back(static_cast<int32_t>(offsets[i0] + i1));
      p64.push_back(offsets[i0] + i1);
    }
  std::vector<float> a = in, c = in, expected = in;
  apply(s, {.q = TensorView::bshd(a.data(), DType::f32, b, seq, h, d), .positions = Positions::per_token(p32)});
  apply(s, {.q = TensorView::bshd(c.data(), DType::f32, b, seq, h, d), .positions = Positions::per_token(p64)});
  for (int64_t i0 = 0; i0 < b; ++i0) {
    apply(s, {.q = TensorView::bshd(expected.data() + i0 * seq * h * d, DType::f32, 1, seq, h, d),
              .positions = Positions::sequential(offsets[i0])});
  }
  EXPECT_EQ(a, expected);
  EXPECT_EQ(c, expected);
  // With a table holding exactly these positions, the table path gives the same within 1 ulp-pair.
  const Table t = Table::at(s, p64);
  std::vector<float> via_table = in;
  apply(s, {.q = TensorView::bshd(via_table.data(), DType::f32, b, seq, h, d),
            .positions = Positions::per_token(p64), .table = &t});
  for (size_t j = 0; j < in.size(); ++j) EXPECT_NEAR(via_table[j], expected[j], 2 * 0x1p-23 * 8);
}

// ---- bad input: message, and the caller's buffers untouched ----

struct Buffers {
  std::vector<float> q = test::random_floats(2 * 3 * 4 * 16, 81);
  std::vector<float> k = test::random_floats(2 * 3 * 2 * 16, 82);
  std::vector<float> out = std::vector<float>(2 * 3 * 4 * 16, -9.0f);
  std::vector<float> q0 = q, k0 = k, out0 = out;
  TensorView qv() { return TensorView::bshd(q.data(), DType::f32, 2, 3, 4, 16); }
  TensorView kv() { return TensorView::bshd(k.data(), DType::f32, 2, 3, 2, 16); }
  TensorView ov() { return TensorView::bshd(out.data(), DType::f32, 2, 3, 4, 16); }
  void expect_untouched() const {
    EXPECT_EQ(q, q0);
    EXPECT_EQ(k, k0);
    EXPECT_EQ(out, out0);
  }
};

TEST(ApplyErrors, EveryRuleNamesTheValueAndWritesNothing) {
  const Schedule s = make_schedule(Spec{.head_dim = 16});
  const Schedule wide = make_schedule(Spec{.head_dim = 32});
  const Schedule other = make_schedule(Spec{.head_dim = 16, .base = 500000});
  const Table table = Table::range(s, 0, 10);
  const Table other_table = Table::range(other, 0, 10);
  struct Case {
    const char* needle;
    std::function<ApplyArgs(Buffers&)> make;
    const Schedule* schedule = nullptr;
  };
  std::vector<int64_t> four_positions = {1, 2, 3, 4};
  std::vector<int64_t> bad_positions = {0, 1, 2, -5, 4, 5};
  std::vector<int64_t> huge_positions = {0, 1, 2, max_position_limit, 4, 5};
  std::vector<int32_t> far_positions = {0, 1, 2, 3, 4, 50};
  Schedule odd = s;
  odd.rotary_dim = 15;
  std::vector<int64_t> m_positions(18, 1);
  std::vector<int64_t> giant_positions = {0, (int64_t{1} << 62) + 1, 2, 3, 4, 5};
  const Schedule three_streams =
      make_schedule(Spec{.head_dim = 16, .stream_layout = StreamLayout::sections, .sections = {2, 3, 3}});
  const Schedule yarn = make_schedule(Spec{.head_dim = 16, .schedule = ScheduleType::yarn, .factor = 4.0,
                                           .original_max_position = 64});
  const Table yarn_table = Table::range(yarn, 0, 8);
  std::vector<float> caller_cos(3 * 8, 1.0f), caller_sin(3 * 8, 0.0f);
  const CallerAngles caller{.index = CallerAngles::Index::per_token, .columns = CallerAngles::Columns::pairs,
                            .cos = caller_cos.data(), .sin = caller_sin.data(), .shape = {1, 3, 8},
                            .cos_strides = {24, 8, 1}, .sin_strides = {24, 8, 1}};
  const std::vector<Case> cases = {
      {"q is not set", [](Buffers&) { return ApplyArgs{}; }},
      {"q.head_dim=16 differs from the schedule's head_dim=32",
       [](Buffers& b) { return ApplyArgs{.q = b.qv()}; }, &wide},
      {"k.dtype=bf16 differs from q.dtype=f32", [](Buffers& b) {
         TensorView k = b.kv(); k.dtype = DType::bf16; return ApplyArgs{.q = b.qv(), .k = k}; }},
      {"disagrees with q shape", [](Buffers& b) {
         TensorView k = b.kv(); k.shape[1] = 2; return ApplyArgs{.q = b.qv(), .k = k}; }},
      {"k_out is set but k is not", [](Buffers& b) { return ApplyArgs{.q = b.qv(), .k_out = b.kv()}; }},
      {"q_out shape [2, 3, 2, 16] differs from q shape [2, 3, 4, 16]", [](Buffers& b) {
         TensorView o = b.ov(); o.shape[2] = 2; return ApplyArgs{.q = b.qv(), .q_out = o}; }},
      {"q_out.dtype=f64 differs from q.dtype=f32", [](Buffers& b) {
         TensorView o = b.ov(); o.dtype = DType::f64; return ApplyArgs{.q = b.qv(), .q_out = o}; }},
      {"threads=-1 must be in [0, 1024]", [](Buffers& b) { return ApplyArgs{.q = b.qv(), .threads = -1}; }},
      {"threads=100000 must be in [0, 1024]", [](Buffers& b) { return ApplyArgs{.q = b.qv(), .threads = 100000}; }},
      {"direction=5 is not forward or inverse", [](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .direction = static_cast<Direction>(5)}; }},
      {"backend=9 is not automatic, reference or cpu", [](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .backend = static_cast<Backend>(9)}; }},
      {"q.data is null but q shape [2, 3, 4, 16] is not empty", [](Buffers& b) {
         TensorView q = b.qv(); q.data = nullptr; return ApplyArgs{.q = q}; }},
      {"k.data is null but k shape [2, 3, 2, 16] is not empty", [](Buffers& b) {
         TensorView k = b.kv(); k.data = nullptr; return ApplyArgs{.q = b.qv(), .k = k}; }},
      // Once "unset" (so: in place); an output with a shape but no data is an error now.
      {"q_out.data is null but q_out shape [2, 3, 4, 16] is not empty", [](Buffers& b) {
         TensorView o = b.ov(); o.data = nullptr; return ApplyArgs{.q = b.qv(), .q_out = o}; }},
      {"q_out.dtype=7 is not f32, f64, f16 or bf16", [](Buffers& b) {
         TensorView o = b.ov(); o.dtype = static_cast<DType>(7); return ApplyArgs{.q = b.qv(), .q_out = o}; }},
      {"positions has 4 entries but batch*seq=6", [&](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .positions = Positions::per_token(four_positions)}; }},
      {"positions[3]=-5 must be in [0, 2^31)", [&](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .positions = Positions::per_token(bad_positions)}; }},
      {"positions[3]=2147483648 must be in [0, 2^31)", [&](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .positions = Positions::per_token(huge_positions)}; }},
      {"offset=2147483647 with seq=3 must keep positions in [0, 2^31)", [](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .positions = Positions::sequential(max_position_limit - 1)}; }},
      {"offset=-1 with seq=3", [](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .positions = Positions::sequential(-1)}; }},
      {"positions[5]=50 is not in the table", [&](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .positions = Positions::per_token(far_positions), .table = &table}; }},
      {"positions[2]=10 is not in the table", [&](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .positions = Positions::sequential(8), .table = &table}; }},
      {"table was built from a different schedule", [&](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .table = &other_table}; }},
      {"q_out overlaps input q", [](Buffers& b) {
         TensorView o = b.qv(); o.data = b.q.data() + 8; return ApplyArgs{.q = b.qv(), .q_out = o}; }},
      {"q (in place) overlaps input k", [](Buffers& b) {
         TensorView k = b.qv(); k.shape[2] = 2; return ApplyArgs{.q = b.qv(), .k = k}; }},
      {"k_out overlaps input q", [](Buffers& b) {
         TensorView o = b.ov(); o.shape[2] = 2; o.data = b.q.data();
         return ApplyArgs{.q = b.qv(), .k = b.kv(), .q_out = b.ov(), .k_out = o}; }},
      {"q_out overlaps k_out", [](Buffers& b) {
         TensorView o = b.ov(); o.shape[2] = 2;
         return ApplyArgs{.q = b.qv(), .k = b.kv(), .q_out = b.ov(), .k_out = o}; }},
      {"q_out strides [96, 16, 0, 1] make elements overlap", [](Buffers& b) {
         TensorView o = b.ov(); o.strides = {96, 16, 0, 1}; return ApplyArgs{.q = b.qv(), .q_out = o}; }},
      {"q.seq=-3 must be >= 0", [](Buffers& b) {
         TensorView q = b.qv(); q.shape[1] = -3; return ApplyArgs{.q = q}; }},
      {"q strides [4611686018427387904, 64, 16, 1] with shape [2, 3, 4, 16] span 2^60 bytes or more", [](Buffers& b) {
         TensorView q = b.qv(); q.strides[0] = int64_t{1} << 62; return ApplyArgs{.q = q}; }},
      // Outputs are held to the same bound (their strides were never checked before).
      {"q_out strides [-9223372036854775808, 64, 16, 1] with shape [2, 3, 4, 16] span", [](Buffers& b) {
         TensorView o = b.ov(); o.strides[0] = INT64_MIN; return ApplyArgs{.q = b.qv(), .q_out = o}; }},
      {"q.dtype=9 is not f32, f64, f16 or bf16", [](Buffers& b) {
         TensorView q = b.qv(); q.dtype = static_cast<DType>(9); return ApplyArgs{.q = q}; }},
      {"rotary_dim=15 must be even", [](Buffers& b) { return ApplyArgs{.q = b.qv()}; }, &odd},
      // Shapes, not counts: [seq, batch] = [3, 2] holds batch*seq entries but is transposed.
      {"positions shape [3, 2] must be [batch=2, seq=3] or [1, seq=3] (one row for every batch row): it looks "
       "transposed", [&](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .positions = Positions::per_token(bad_positions).with_shape(3, 2)}; }},
      {"positions shape [6, 1] must be [batch=2, seq=3]", [&](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .positions = Positions::per_token(bad_positions).with_shape(6, 1)}; }},
      {"positions shape [1, 6] must be [batch=2, seq=3]", [&](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .positions = Positions::per_token(bad_positions).with_shape(1, 6)}; }},
      {"positions shape [3, 3, 2] must be [3, batch=2, seq=3] or [3, 1, seq=3]", [&](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .positions = Positions::per_token(m_positions, 3).with_shape(3, 2)}; },
       &three_streams},
      // Integer positions in full, not as doubles (4.611686018427388e+18).
      {"positions[1]=4611686018427387905 must be in [0, 2^31)", [&](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .positions = Positions::per_token(giant_positions)}; }},
      {"undo cannot take the caller's cos/sin", [&](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .angles = &caller, .undo = true}; }},
      {"undo with attention_factor=", [&](Buffers& b) {
         return ApplyArgs{.q = b.qv(), .table = &yarn_table, .undo = true}; }, &yarn},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    Buffers b;
    const Schedule& schedule = cases[c].schedule ? *cases[c].schedule : s;
    EXPECT_ROTARY_ERROR(apply(schedule, cases[c].make(b)), cases[c].needle);
    b.expect_untouched();
  }
}

// ---- positions by shape: the documented shapes pass, counts alone no longer decide ----

TEST(ApplyPositions, ShapedPositionsTakeBatchSeqOrOneRowAndAnEmptyBatch) {
  const Schedule s = make_schedule(Spec{.head_dim = 8});
  const int64_t batch = 2, seq = 3, d = 8;
  const std::vector<float> in = test::random_floats(static_cast<size_t>(batch * seq * d), 5);
  const std::vector<int64_t> rows = {10, 11, 12, 20, 21, 22};  // [batch, seq]
  const std::vector<int64_t> one_row = {10, 11, 12};           // [1, seq]
  auto run = [&](const Positions& p) {
    std::vector<float> x = in;
    apply(s, {.q = TensorView::bshd(x.data(), DType::f32, batch, seq, 1, d), .positions = p});
    return x;
  };
  EXPECT_EQ(run(Positions::per_token(rows).with_shape(batch, seq)), run(Positions::per_token(rows)));
  EXPECT_EQ(run(Positions::per_token(one_row).with_shape(1, seq)), run(Positions::per_token(one_row)));
  // The same entries read as [seq, batch] are another assignment of positions: refused.
  EXPECT_ROTARY_ERROR(run(Positions::per_token(rows).with_shape(seq, batch)), "looks transposed");
  // with_shape itself checks the entry count.
  EXPECT_ROTARY_ERROR(Positions::per_token(rows).with_shape(4, 2), "positions shape [4, 2] does not hold 6 entries");
  EXPECT_ROTARY_ERROR(Positions::sequential(3).with_shape(1, 3), "not sequential ones");
  // An empty batch with [seq] positions (flat or shaped) is the no-op every empty tensor is.
  std::vector<float> none;
  for (const Positions& p : {Positions::per_token(one_row), Positions::per_token(one_row).with_shape(1, seq)}) {
    apply(s, {.q = TensorView::bshd(none.data(), DType::f32, 0, seq, 1, d), .positions = p});
  }
}

// ---- undo: the true inverse (1/g, xPos σ^-1), against MPFR; the transpose is not it ----

TEST(ApplyUndo, IsTheExactInverseRotationDividedByTheFactor) {
  // YaRN s=8 (g = 1 + 0.1 ln 8), partial rotary, both pairings; positions across the whole range.
  for (const Pairing pairing : {Pairing::half, Pairing::interleaved}) {
    const Schedule s = make_schedule(Spec{.head_dim = 40, .rotary_dim = 32, .pairing = pairing,
                                          .schedule = ScheduleType::yarn, .factor = 8.0,
                                          .original_max_position = 4096});
    ASSERT_GT(s.attention_factor, 1.2);
    const double g_undo = 1.0 / s.attention_factor;
    for (const int64_t p : test_positions()) {
      for (const DType dtype : {DType::f32, DType::f64}) {
        const std::vector<double> x = test::random_doubles(40, static_cast<uint64_t>(p) + 3);
        std::vector<float> xf(x.begin(), x.end());
        std::vector<double> xd = x;
        void* data = dtype == DType::f32 ? static_cast<void*>(xf.data()) : static_cast<void*>(xd.data());
        apply(s, {.q = TensorView::bshd(data, dtype, 1, 1, 1, 40), .positions = Positions::sequential(p),
                  .undo = true});
        const double bound = dtype == DType::f32 ? kF32PairBound : kF64PairBound;
        for (int64_t j = 0; j < 16; ++j) {
          const auto [ia, ib] = s.channels(j);
          const double a = dtype == DType::f32 ? double(float(x[ia])) : x[ia];
          const double b = dtype == DType::f32 ? double(float(x[ib])) : x[ib];
          const test::Exact e = test::mpfr_cos_sin(p, s.inv_freq[static_cast<size_t>(j)], g_undo);
          const double ya = dtype == DType::f32 ? xf[ia] : xd[ia];
          const double yb = dtype == DType::f32 ? xf[ib] : xd[ib];
          const double limit = bound * g_undo * (std::fabs(a) + std::fabs(b)) * 1.01;
          ASSERT_NEAR(ya, a * e.cos + b * e.sin, limit) << "pair " << j << " position " << p;
          ASSERT_NEAR(yb, -a * e.sin + b * e.cos, limit) << "pair " << j << " position " << p;
        }
      }
    }
  }
}

TEST(ApplyUndo, TakesBackForwardWhereTheInverseScalesByTheFactorSquared) {
  const Schedule s = make_schedule(Spec{.head_dim = 64, .schedule = ScheduleType::yarn, .factor = 16.0,
                                        .original_max_position = 4096});
  const double g = s.attention_factor;
  const int64_t seq = 17, heads = 3, d = 64;
  const std::vector<float> original = test::random_floats(static_cast<size_t>(seq * heads * d), 19);
  for (const Direction dir : {Direction::forward, Direction::inverse}) {
    std::vector<float> x = original, y = original;
    const Positions positions = Positions::sequential(123456);
    apply(s, {.q = TensorView::bshd(x.data(), DType::f32, 1, seq, heads, d), .positions = positions,
              .direction = dir});
    y = x;
    apply(s, {.q = TensorView::bshd(x.data(), DType::f32, 1, seq, heads, d), .positions = positions,
              .direction = dir, .undo = true});
    // The transpose of `dir`: what `inverse` documents it is, the backward pass.
    apply(s, {.q = TensorView::bshd(y.data(), DType::f32, 1, seq, heads, d), .positions = positions,
              .direction = dir == Direction::forward ? Direction::inverse : Direction::forward});
    double worst_undo = 0, worst_ratio = 0;
    for (size_t j = 0; j < x.size(); ++j) {
      worst_undo = std::max(worst_undo, std::fabs(double(x[j]) - original[j]) / (std::fabs(original[j]) + 1));
      if (std::fabs(original[j]) > 0.1) worst_ratio = std::max(worst_ratio, std::fabs(y[j] / original[j] - g * g));
    }
    EXPECT_LT(worst_undo, 8 * 0x1p-23) << "undo of " << (dir == Direction::forward ? "forward" : "inverse");
    // Pair by pair the transpose returns g^2 times the input (to rounding): not an undo.
    EXPECT_LT(worst_ratio, 1e-4);
  }
}

TEST(ApplyUndo, WithoutFactorOrXposIsTheInverseBitForBit) {
  const Schedule s = make_schedule(Spec{.head_dim = 48, .rotary_dim = 40, .base = 500000});
  const int64_t seq = 9, d = 48;
  const Table table = Table::range(s, 1000, seq);
  const std::vector<float> original = test::random_floats(static_cast<size_t>(seq * 2 * d), 23);
  for (const Table* t : {static_cast<const Table*>(nullptr), &table}) {
    for (const Direction dir : {Direction::forward, Direction::inverse}) {
      std::vector<float> a = original, b = original;
      apply(s, {.q = TensorView::bshd(a.data(), DType::f32, 1, seq, 2, d), .positions = Positions::sequential(1000),
                .direction = dir, .table = t, .undo = true});
      apply(s, {.q = TensorView::bshd(b.data(), DType::f32, 1, seq, 2, d), .positions = Positions::sequential(1000),
                .direction = dir == Direction::forward ? Direction::inverse : Direction::forward, .table = t});
      EXPECT_EQ(a, b);
    }
  }
}

TEST(ApplyErrors, DisjointInterleavedSlicesAreAccepted) {
  // q and k heads interleaved in one buffer (fused QKV) do not overlap and must be accepted,
  // while a k slice that shifts into q's heads must not.
  const Schedule s = make_schedule(Spec{.head_dim = 8});
  std::vector<float> buffer(2 * 6 * 8, 1.0f);
  TensorView q{.data = buffer.data(), .dtype = DType::f32, .shape = {1, 2, 2, 8}, .strides = {96, 48, 8, 1}};
  TensorView k = q;
  k.data = buffer.data() + 16;
  EXPECT_NO_THROW(apply(s, {.q = q, .k = k}));
  k.data = buffer.data() + 8;
  EXPECT_ROTARY_ERROR(apply(s, {.q = q, .k = k}), "q (in place) overlaps input k");
}

// ---- threads, empty tensors, extreme views ----

TEST(ApplyThreads, MaxThreadsRunsAndGivesTheBitsOfOneThread) {
  static_assert(max_threads == 1024);
  // 64 tokens x 8 heads x 128 f32 = 256 KiB: past the one-thread threshold, so a team is formed
  // (of at most one thread per processor, whatever was asked).
  const Schedule s = make_schedule(Spec{.head_dim = 128});
  const std::vector<float> x = test::random_floats(64 * 8 * 128, 91);
  auto run = [&](int threads) {
    std::vector<float> v = x;
    apply(s, {.q = TensorView::bshd(v.data(), DType::f32, 1, 64, 8, 128),
              .positions = Positions::sequential(1000), .threads = threads});
    return v;
  };
  const std::vector<float> one = run(1);
  EXPECT_NE(one, x);
  EXPECT_EQ(run(max_threads), one);
  EXPECT_EQ(run(0), one);
}

TEST(ApplyEmpty, EmptyTensorsWithNullDataAreANoOp) {
  const Schedule s = make_schedule(Spec{.head_dim = 64});
  // As torch passes empty tensors: data null, a real shape with a zero extent.
  const TensorView q{.data = nullptr, .shape = {2, 0, 8, 64}, .strides = {0, 512, 64, 1}};
  const TensorView k{.data = nullptr, .shape = {2, 0, 2, 64}, .strides = {0, 128, 64, 1}};
  const TensorView q_out{.data = nullptr, .shape = {2, 0, 8, 64}, .strides = {7, -7, 7, 7}};
  const TensorView k_out{.data = nullptr, .shape = {2, 0, 2, 64}, .strides = {}};
  const std::vector<int64_t> none;
  EXPECT_NO_THROW(apply(s, {.q = q}));
  EXPECT_NO_THROW(apply(s, {.q = q, .k = k}));
  EXPECT_NO_THROW(apply(s, {.q = q, .k = k, .q_out = q_out, .k_out = k_out}));
  EXPECT_NO_THROW(apply(s, {.q = q, .k = k, .positions = Positions::per_token(none), .backend = Backend::reference}));
  // Huge extents beside a zero one: nothing is looped over, no product formed.
  EXPECT_NO_THROW(apply(s, {.q = {.data = nullptr, .shape = {INT64_MAX, 1, 0, 64},
                                  .strides = {INT64_MIN, INT64_MAX, 0, 1}}}));
  // q without heads, k with: k is rotated as it would be alone.
  std::vector<float> k_data = test::random_floats(3 * 2 * 64, 92), expected = k_data;
  apply(s, {.q = {.data = nullptr, .shape = {1, 3, 0, 64}},
            .k = TensorView::bshd(k_data.data(), DType::f32, 1, 3, 2, 64), .positions = Positions::sequential(5)});
  apply(s, {.q = TensorView::bshd(expected.data(), DType::f32, 1, 3, 2, 64), .positions = Positions::sequential(5)});
  EXPECT_EQ(k_data, expected);
  // Absent is TensorView{} only; a null q with tokens is an error naming q.
  EXPECT_ROTARY_ERROR(apply(s, {.q = {.data = nullptr, .shape = {2, 3, 8, 64}}}),
                      "q.data is null but q shape [2, 3, 8, 64] is not empty");
  EXPECT_ROTARY_ERROR(apply(s, {.q = TensorView{}}), "q is not set");
  EXPECT_ROTARY_ERROR(apply(s, {.q = q, .k_out = k_out}), "k_out is set but k is not");
}

// Views no memory could back, each answered without overflow (this file also runs under UBSan):
// validate only, nothing is read or written.
TEST(ApplyExtremeViews, EachValidatesToAClearErrorOrPasses) {
  const Schedule s = make_schedule(Spec{.head_dim = 16});
  std::vector<float> buffer(64, 1.0f);
  float* p = buffer.data();
  const auto at = [](const void* base, int64_t bytes) {
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(bytes));
  };
  void* top = reinterpret_cast<void*>(~uintptr_t{0} - 63);
  void* low = reinterpret_cast<void*>(uintptr_t{64});
  constexpr int64_t kMax = INT64_MAX, kMin = INT64_MIN;
  constexpr int64_t k2p56 = int64_t{1} << 56;
  constexpr int64_t kF64Limit = (int64_t{1} << 57) - 16;  // f64 [2,1,1,16]: (1 + s + 15) * 8 = 2^60 bytes
  using A = std::array<int64_t, 4>;
  const auto f32 = [](void* data, A shape, A strides) {
    return TensorView{.data = data, .dtype = DType::f32, .shape = shape, .strides = strides};
  };
  const auto f64 = [](void* data, A shape, A strides) {
    return TensorView{.data = data, .dtype = DType::f64, .shape = shape, .strides = strides};
  };
  const std::vector<int64_t> none;
  struct Case {
    const char* name;
    ApplyArgs args;
    const char* needle;  // null: accepted
  };
  const std::vector<Case> cases = {
      {"empty, huge batch, extreme strides", {.q = f32(nullptr, {kMax, 0, 1, 16}, {kMin, kMax, kMin, kMin})}, nullptr},
      {"empty, batch*seq beyond int64, sequential",
       {.q = f32(nullptr, {kMax, kMax, 0, 16}, {})}, "offset=0 with seq=9223372036854775807 must keep"},
      {"empty, batch*seq beyond int64, per token",
       {.q = f32(nullptr, {kMax, 2, 0, 16}, {}), .positions = Positions::per_token(none)},
       "positions has 0 entries but batch*seq=9223372036854775807*2 exceeds 2^63"},
      {"unit dims with INT64_MIN strides", {.q = f32(p, {1, 1, 1, 16}, {kMin, kMin, kMin, 1})}, nullptr},
      {"INT64_MIN stride", {.q = f32(p, {2, 1, 1, 16}, {kMin, 16, 16, 1})},
       "q strides [-9223372036854775808, 16, 16, 1] with shape [2, 1, 1, 16] span 2^60 bytes or more"},
      {"INT64_MAX channel stride", {.q = f32(p, {1, 1, 1, 16}, {16, 16, 16, kMax})}, "span 2^60 bytes or more"},
      {"INT64_MIN channel stride", {.q = f32(p, {1, 1, 1, 16}, {16, 16, 16, kMin})}, "span 2^60 bytes or more"},
      {"extent times stride beyond 2^64", {.q = f32(p, {kMax, 1, 1, 16}, {kMax, 16, 16, 1})}, "span 2^60 bytes"},
      {"sum of reaches beyond 2^64", {.q = f32(p, {3, 3, 3, 16}, {kMax / 2, kMin / 2, kMax / 2, 1})}, "span 2^60 bytes"},
      {"f64 one element under 2^60 bytes", {.q = f64(p, {2, 1, 1, 16}, {kF64Limit - 1, 16, 16, 1})}, nullptr},
      {"f64 at 2^60 bytes", {.q = f64(p, {2, 1, 1, 16}, {kF64Limit, 16, 16, 1})}, "span 2^60 bytes or more"},
      {"f64 2^60 elements (2^63 bytes)", {.q = f64(p, {2, 1, 1, 16}, {int64_t{1} << 60, 16, 16, 1})}, "span 2^60"},
      {"k beyond the bound", {.q = f32(p, {2, 1, 1, 16}, {16, 16, 16, 1}), .k = f32(p + 32, {2, 1, 1, 16}, {kMin + 1, 16, 16, 1})},
       "k strides [-9223372036854775807, 16, 16, 1]"},
      {"huge in-place output with zero strides", {.q = f32(p, {kMax, kMax, 1, 16}, {0, 0, 16, 1})},
       "q (in place) strides [0, 0, 16, 1] make elements overlap"},
      {"a broadcast input into a huge output",
       {.q = f32(p, {kMax, 1, 1, 16}, {0, 16, 16, 1}), .q_out = f32(p + 16, {kMax, 1, 1, 16}, {16, 16, 16, 1})},
       "q_out strides [16, 16, 16, 1] with shape [9223372036854775807, 1, 1, 16] span"},
      {"q and k 2^58 bytes apart, disjoint",
       {.q = f32(p, {2, 1, 1, 16}, {k2p56, 16, 16, 1}), .k = f32(p + 16, {2, 1, 1, 16}, {k2p56, 16, 16, 1})}, nullptr},
      {"q and k 2^58 bytes apart, meeting",
       {.q = f32(p, {2, 1, 1, 16}, {k2p56, 16, 16, 1}), .k = f32(at(p, 4 * k2p56), {2, 1, 1, 16}, {k2p56, 16, 16, 1})},
       "q (in place) overlaps input k"},
      {"negative strides from the top of the address space",
       {.q = f32(top, {1, 2, 1, 16}, {0, -(int64_t{1} << 57), 16, 1}), .k = f32(p, {1, 2, 1, 16}, {0, 16, 16, 1})}, nullptr},
      {"a view that would wrap past the top",
       {.q = f32(top, {1, 2, 1, 16}, {0, int64_t{1} << 50, 16, 1}), .k = f32(p, {1, 2, 1, 16}, {0, 16, 16, 1})}, nullptr},
      {"a view that would reach below address 0",
       {.q = f32(low, {1, 2, 1, 16}, {0, -(int64_t{1} << 50), 16, 1}), .k = f32(top, {1, 2, 1, 16}, {0, 16, 16, 1})}, nullptr},
      {"the same, out of place into the top",
       {.q = f32(low, {1, 2, 1, 16}, {0, -(int64_t{1} << 50), 16, 1}), .q_out = f32(top, {1, 2, 1, 16}, {0, -16, 16, 1})}, nullptr},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    if (c.needle == nullptr) {
      EXPECT_NO_THROW(validate(s, c.args));
    } else {
      EXPECT_ROTARY_ERROR(validate(s, c.args), c.needle);
    }
  }
  // The accepted views backed by memory also run, and unit dimensions' strides change nothing.
  const std::vector<float> x0 = test::random_floats(16, 93);
  std::vector<float> x = x0, y = x0;
  apply(s, {.q = f32(x.data(), {1, 1, 1, 16}, {kMin, kMin, kMin, 1}), .positions = Positions::sequential(3)});
  apply(s, {.q = TensorView::bshd(y.data(), DType::f32, 1, 1, 1, 16), .positions = Positions::sequential(3)});
  EXPECT_NE(x, x0);
  EXPECT_EQ(x, y);
  EXPECT_NO_THROW(apply(s, cases[0].args));
}

// ApplyArgs::caller_angles was ApplyArgs::angles: the old name is the same member (a deprecated
// alias for one release), so callers that set it keep the caller's angles and the same bits.
TEST(ApplyNames, AnglesIsTheDeprecatedNameOfCallerAngles) {
  const Schedule s = make_schedule(Spec{.head_dim = 8});
  std::vector<float> cos_values(4 * 8), sin_values(4 * 8);
  for (size_t i = 0; i < cos_values.size(); ++i) {
    cos_values[i] = std::cos(0.1f * static_cast<float>(i));
    sin_values[i] = std::sin(0.1f * static_cast<float>(i));
  }
  const CallerAngles caller{.index = CallerAngles::Index::per_token, .cos = cos_values.data(),
                            .sin = sin_values.data(), .shape = {1, 4, 8}, .cos_strides = {32, 8, 1},
                            .sin_strides = {32, 8, 1}};
  std::vector<float> q_new(4 * 2 * 8), q_old;
  for (size_t i = 0; i < q_new.size(); ++i) q_new[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  q_old = q_new;
  const std::vector<float> input = q_new;
  const ApplyArgs by_new{.q = TensorView::bshd(q_new.data(), DType::f32, 1, 4, 2, 8), .caller_angles = &caller};
  const ApplyArgs by_old{.q = TensorView::bshd(q_old.data(), DType::f32, 1, 4, 2, 8), .angles = &caller};
  EXPECT_EQ(by_old.caller_angles, nullptr);  // two members: the library folds the old one in
  apply(s, by_new);
  apply(s, by_old);
  EXPECT_EQ(q_new, q_old);
  EXPECT_NE(q_new, input);  // the caller's angles turned it
  // Both names, the same cos/sin: served; different ones: refused, naming caller_angles, q untouched.
  const CallerAngles other = caller;
  const ApplyArgs same{.q = TensorView::bshd(q_old.data(), DType::f32, 1, 4, 2, 8), .caller_angles = &caller,
                       .angles = &caller};
  EXPECT_NO_THROW(validate(s, same));
  const std::vector<float> before = q_new;
  const ApplyArgs both{.q = TensorView::bshd(q_new.data(), DType::f32, 1, 4, 2, 8), .caller_angles = &caller,
                       .angles = &other};
  try {
    apply(s, both);
    ADD_FAILURE() << "two different cos/sin were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "caller_angles");
    EXPECT_NE(std::string(e.what()).find("caller_angles and angles (its old name) are both set"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(q_new, before);
}

}  // namespace
}  // namespace rotary
