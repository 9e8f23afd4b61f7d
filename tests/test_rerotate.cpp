// rerotate and switch_schedule: against apply at the moved positions (or the other schedule),
// against the exact rotation of the stored keys, many successive shifts, bad input.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "math/half.hpp"
#include "rotary/angle.hpp"
#include "rotary/rerotate.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

// apply's contract: |result - exact| <= 2^-23 g (|a| + |b|) per pair (f32 arithmetic).
constexpr double kPairBound = 0x1p-23;
// bfloat16 keeps 8 significant bits: one rounding moves a value by at most 2^-8 of it.
constexpr double kBf16Rounding = 0x1p-8;
// The double reference (exact_cos_sin: 2^-51 relative) and its own arithmetic.
constexpr double kReferenceSlack = 0x1p-45;
constexpr int64_t kHeads = 2;

// Values as float whatever the storage: f32 as is, bf16 widened (stored in uint16 pairs).
std::vector<float> values(const std::vector<uint16_t>& b16, const std::vector<float>& f32, DType dtype) {
  if (dtype == DType::f32) return f32;
  std::vector<float> out(b16.size());
  for (size_t i = 0; i < b16.size(); ++i) out[i] = detail::bf16_to_f32(b16[i]);
  return out;
}

// A tensor of `dtype` holding `data` (bf16: rounded), rotated or moved in place by `run`.
struct Tensor {
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> b16;
  Tensor(DType d, const std::vector<float>& data) : dtype(d), f32(data) {
    if (d == DType::bf16) {
      for (float v : data) b16.push_back(detail::f32_to_bf16(v));
      f32.clear();
    }
  }
  TensorView view(int64_t tokens, int64_t head_dim) {
    void* p = dtype == DType::f32 ? static_cast<void*>(f32.data()) : static_cast<void*>(b16.data());
    return TensorView::bshd(p, dtype, 1, tokens, kHeads, head_dim);
  }
  std::vector<float> floats() const { return values(b16, f32, dtype); }
};

Positions per_token(const std::vector<int64_t>& p, int streams) {
  return Positions::per_token(std::span<const int64_t>(p), streams);
}

Tensor applied(const Schedule& s, const std::vector<float>& k0, DType dtype, const std::vector<int64_t>& pos) {
  Tensor t(dtype, k0);
  const int64_t tokens = static_cast<int64_t>(pos.size()) / s.streams;
  apply(s, ApplyArgs{.q = t.view(tokens, s.head_dim), .positions = per_token(pos, s.streams)});
  return t;
}

Spec text_spec(ScheduleType type, Pairing pairing) {
  Spec spec{.head_dim = 64, .pairing = pairing, .schedule = type};
  switch (type) {
    case ScheduleType::linear: spec.factor = 4.0; break;
    case ScheduleType::yarn: spec.factor = 16.0; spec.original_max_position = 4096; break;  // g = 1.277
    case ScheduleType::llama3:  // Llama-3.1-8B
      spec.base = 500000.0, spec.factor = 8.0, spec.low_freq_factor = 1.0, spec.high_freq_factor = 4.0;
      spec.original_max_position = 8192;
      break;
    case ScheduleType::longrope:  // Phi-3-like factors, 4k -> 128k
      spec.original_max_position = 4096, spec.max_position = 131072;
      for (int j = 0; j < 32; ++j) {
        spec.short_factor.push_back(1.0 + 0.02 * j);
        spec.long_factor.push_back(1.0 + 1.5 * j);
      }
      break;
    default: break;
  }
  return spec;
}

// Qwen2-VL-like M-RoPE: 3 streams, sections [4, 6, 6] of 16 pairs.
Spec mrope_spec(Pairing pairing) {
  return Spec{.head_dim = 32, .base = 1000000.0, .pairing = pairing,
              .stream_layout = StreamLayout::sections, .sections = {4, 6, 6}};
}

// Positions across the whole range, each kept where p + delta (every stream's) stays in [0, 2^31).
std::vector<int64_t> test_positions(int streams, std::span<const int64_t> delta) {
  const std::vector<int64_t> base = {0, 1, 7, 4095, 4096, 131071, 1 << 20, 1000003, max_position_limit - 1};
  std::vector<int64_t> out;
  for (int s = 0; s < streams; ++s) {
    const int64_t d = delta[delta.size() == 1 ? 0 : static_cast<size_t>(s)];
    for (size_t i = 0; i < base.size(); ++i) {
      const int64_t p = base[(i + static_cast<size_t>(s)) % base.size()];  // streams differ
      out.push_back(std::clamp(p, std::max<int64_t>(0, -d), max_position_limit - 1 - std::max<int64_t>(0, d)));
    }
  }
  return out;
}

std::vector<int64_t> moved(const std::vector<int64_t>& pos, int streams, std::span<const int64_t> delta) {
  std::vector<int64_t> out = pos;
  const size_t tokens = pos.size() / static_cast<size_t>(streams);
  for (size_t i = 0; i < out.size(); ++i) out[i] += delta[delta.size() == 1 ? 0 : i / tokens];
  return out;
}

struct Worst {
  double exact = 0, applied = 0;  // largest |result - reference| / bound, per reference
  void add(double& worst, double err, double bound, const char* what, size_t index) {
    worst = std::max(worst, err / bound);
    ASSERT_LE(err, bound) << what << " element " << index;
  }
};

// Walks every rotated pair: fn(index_a, index_b, pair j).
template <typename Fn>
void for_each_pair(const Schedule& s, int64_t tokens, Fn fn) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < kHeads; ++h) {
      for (int64_t j = 0; j < s.pairs(); ++j) {
        const auto [ca, cb] = s.channels(j);
        const int64_t row = (t * kHeads + h) * s.head_dim;
        fn(static_cast<size_t>(row + ca), static_cast<size_t>(row + cb), j, t);
      }
    }
  }
}

// rerotate(apply(k, p), Δ) against (1) the exact rotation of the stored keys by Δθ and (2)
// apply(k, p + Δ). Bounds per element, with (a0, b0) the input pair, (a1, b1) the stored keys,
// g the attention factor, N1 = |(a1, b1)|:
//   (1) 2^-23 (|a1| + |b1|)                                 [one rotation of the stored values]
//   (2) 2^-23 ((|a1| + |b1|) + (√2 + 1) g (|a0| + |b0|))    [+ the stored keys' own error, turned
//       (a vector of two components each within apply's bound, so √2 of it), + the reference's]
//   bf16 adds 2^-8 |result| (the store) to (1), and 2^-8 (N1 + |result| + |reference|) to (2).
Worst check_rerotate(const Schedule& s, DType dtype, std::span<const int64_t> delta, uint64_t seed) {
  Worst worst;
  const std::vector<int64_t> pos = test_positions(s.streams, delta);
  const int64_t tokens = static_cast<int64_t>(pos.size()) / s.streams;
  const std::vector<float> k0 = test::random_floats(static_cast<size_t>(tokens * kHeads * s.head_dim), seed, 4.0f);
  const Tensor stored = applied(s, k0, dtype, pos);
  Tensor out = stored;
  rerotate(s, RotatedKeys{.k = out.view(tokens, s.head_dim), .positions = per_token(pos, s.streams)}, delta);
  const std::vector<float> k0r = Tensor(dtype, k0).floats();
  const std::vector<float> k1 = stored.floats(), r = out.floats();
  const std::vector<float> ref = applied(s, k0, dtype, moved(pos, s.streams, delta)).floats();
  const double g = s.attention_factor, bf = dtype == DType::bf16 ? kBf16Rounding : 0.0;
  for_each_pair(s, tokens, [&](size_t ia, size_t ib, int64_t j, int64_t) {
    const int64_t d = delta[delta.size() == 1 ? 0 : static_cast<size_t>(s.stream_of(j))];
    const CosSin e = exact_cos_sin(std::abs(d), s.inv_freq[static_cast<size_t>(j)]);
    const double sn = d < 0 ? -e.sin : e.sin;
    const double a1 = k1[ia], b1 = k1[ib], s1 = std::abs(a1) + std::abs(b1);
    const double exact[2] = {a1 * e.cos - b1 * sn, b1 * e.cos + a1 * sn};
    const double s0 = std::abs(k0r[ia]) + std::abs(k0r[ib]), n1 = std::hypot(a1, b1);
    const size_t at[2] = {ia, ib};
    for (int c = 0; c < 2; ++c) {
      const double got = r[at[c]];
      worst.add(worst.exact, std::abs(got - exact[c]), kPairBound * s1 + bf * std::abs(got) + kReferenceSlack * s1,
                "vs exact rotation of the stored keys", at[c]);
      worst.add(worst.applied, std::abs(got - ref[at[c]]),
                kPairBound * (s1 + (std::sqrt(2.0) + 1) * g * s0) +
                    bf * (n1 + std::abs(got) + std::abs(ref[at[c]])) + kReferenceSlack * s1,
                "vs apply at p + delta", at[c]);
    }
  });
  return worst;
}

struct Named {
  const char* name;
  Spec spec;
};

std::vector<Named> text_specs(Pairing pairing) {
  return {{"default", text_spec(ScheduleType::default_, pairing)},
          {"linear", text_spec(ScheduleType::linear, pairing)},
          {"yarn", text_spec(ScheduleType::yarn, pairing)},
          {"llama3", text_spec(ScheduleType::llama3, pairing)},
          {"longrope", text_spec(ScheduleType::longrope, pairing)}};
}

TEST(Rerotate, EqualsApplyAtMovedPositionsForEverySchedule) {
  Worst worst;
  for (const Pairing pairing : {Pairing::half, Pairing::interleaved}) {
    for (const auto& [name, spec] : text_specs(pairing)) {
      const Schedule s = make_schedule(spec, spec.schedule == ScheduleType::longrope ? 131072 : 0);
      if (spec.schedule == ScheduleType::yarn) {
        ASSERT_NE(s.attention_factor, 1.0);
      }
      for (const DType dtype : {DType::f32, DType::bf16}) {
        for (const int64_t d : {int64_t{1}, int64_t{1000}, int64_t{-3}, int64_t{-4096}, int64_t{1} << 30}) {
          SCOPED_TRACE(testing::Message() << name << " " << to_string(pairing) << " " << to_string(dtype)
                                          << " delta=" << d);
          const int64_t delta[1] = {d};
          const Worst w = check_rerotate(s, dtype, delta, 7);
          worst.exact = std::max(worst.exact, w.exact);
          worst.applied = std::max(worst.applied, w.applied);
        }
      }
    }
  }
  std::printf("rerotate: worst error / bound: %.3f against the exact turn of the stored keys, %.3f against "
              "apply at p + delta\n", worst.exact, worst.applied);
}

TEST(Rerotate, MRopeShiftsEachStreamByItsOwnDeltaOfEitherSign) {
  for (const Pairing pairing : {Pairing::half, Pairing::interleaved}) {
    const Schedule s = make_schedule(mrope_spec(pairing));
    ASSERT_EQ(s.streams, 3);
    for (const DType dtype : {DType::f32, DType::bf16}) {
      for (const std::vector<int64_t>& delta : {std::vector<int64_t>{5, -2, 100000}, {-7, 0, 3}, {9}}) {
        SCOPED_TRACE(testing::Message() << to_string(pairing) << " " << to_string(dtype) << " delta[0]="
                                        << delta[0]);
        check_rerotate(s, dtype, delta, 11);
      }
    }
  }
}

TEST(Rerotate, AppliesNoAttentionFactorAgain) {
  // YaRN's g = 1.277: a zero shift gives the stored keys back (llama.cpp's K-shift scales them by g).
  const Schedule s = make_schedule(text_spec(ScheduleType::yarn, Pairing::half));
  const std::vector<int64_t> pos = {3, 90000};
  const std::vector<float> k0 = test::random_floats(static_cast<size_t>(2 * kHeads * 64), 3);
  const Tensor stored = applied(s, k0, DType::f32, pos);
  Tensor out = stored;
  const int64_t zero[1] = {0};
  rerotate(s, RotatedKeys{.k = out.view(2, 64), .positions = per_token(pos, 1)}, zero);
  EXPECT_EQ(out.f32, stored.f32);
}

TEST(Rerotate, KeysRotatedInverseMoveTheOtherWay) {
  const Schedule s = make_schedule(text_spec(ScheduleType::default_, Pairing::interleaved));
  const std::vector<float> k0 = test::random_floats(static_cast<size_t>(kHeads * 64), 5);
  auto inverse_at = [&](int64_t p) {
    std::vector<float> k = k0;
    apply(s, ApplyArgs{.q = TensorView::bshd(k.data(), DType::f32, 1, 1, kHeads, 64),
                       .positions = Positions::sequential(p), .direction = Direction::inverse});
    return k;
  };
  std::vector<float> k = inverse_at(100);
  const int64_t delta[1] = {-60};
  rerotate(s, RotatedKeys{.k = TensorView::bshd(k.data(), DType::f32, 1, 1, kHeads, 64),
                          .positions = Positions::sequential(100), .rotated = Direction::inverse}, delta);
  const std::vector<float> ref = inverse_at(40);
  for (size_t i = 0; i < k.size(); ++i) EXPECT_NEAR(k[i], ref[i], 4e-6) << i;
}

// 1000 shifts by +1 against one apply at p + 1000. Two kinds of error, per pair j of norm N:
//  - the kernel's roundings of the products, at most 2^-23 (|a| + |b|) <= 2^-23 √2 N per shift
//    and data-dependent, so they walk like sqrt(n) times one: 4 sqrt(n) 2^-23 √2 N;
//  - the float32 cos/sin of the step, the same every shift: (c, s) = (fl cos θ_j, fl sin θ_j) is
//    ε_j = |(c, s) - (cos θ_j, sin θ_j)| <= 2^-24 √2 from the exact turn, and that error adds up
//    linearly, n ε_j N (norm: n |hypot(c, s) - 1| N). No float32 step avoids it; it is the
//    rounding of the one stored step, not an extra error of rerotate.
// Bound: (4 sqrt(n) 2^-23 √2 + n ε_j) N plus the reference's 2^-23 √2 N; the norm likewise with
// n |hypot(c, s) - 1| for n ε_j.
TEST(Rerotate, ThousandUnitShiftsStayWithinTheRoundingOfTheStep) {
  for (const ScheduleType type : {ScheduleType::default_, ScheduleType::yarn}) {
    const Schedule s = make_schedule(text_spec(type, Pairing::half));
    const std::vector<int64_t> pos = {0, 4096, 1 << 24, max_position_limit - 1001};
    const int64_t tokens = 4, n = 1000;
    const std::vector<float> k0 = test::random_floats(static_cast<size_t>(tokens * kHeads * 64), 9);
    Tensor k = applied(s, k0, DType::f32, pos);
    std::vector<int64_t> at = pos;
    const int64_t one[1] = {1};
    for (int64_t i = 0; i < n; ++i) {
      rerotate(s, RotatedKeys{.k = k.view(tokens, 64), .positions = per_token(at, 1)}, one);
      for (int64_t& p : at) ++p;
    }
    const Tensor ref = applied(s, k0, DType::f32, at);
    double worst = 0, worst_norm = 0, worst_walk = 0;
    for_each_pair(s, tokens, [&](size_t ia, size_t ib, int64_t j, int64_t) {
      const CosSin e = exact_cos_sin(1, s.inv_freq[static_cast<size_t>(j)]);
      const double c = static_cast<float>(e.cos), sn = static_cast<float>(e.sin);
      const double eps = std::hypot(c - e.cos, sn - e.sin), eta = std::abs(std::hypot(c, sn) - 1.0);
      const double n_ref = std::hypot(double{ref.f32[ia]}, double{ref.f32[ib]});
      const double walk = (4 * std::sqrt(double(n)) + 1) * kPairBound * std::sqrt(2.0) * n_ref + 1e-30;
      const double bound = walk + double(n) * eps * n_ref, norm_bound = walk + double(n) * eta * n_ref;
      const double e_max = std::max(std::abs(k.f32[ia] - ref.f32[ia]), std::abs(k.f32[ib] - ref.f32[ib]));
      const double en = std::abs(std::hypot(double{k.f32[ia]}, double{k.f32[ib]}) - n_ref);
      worst = std::max(worst, e_max / bound);
      worst_norm = std::max(worst_norm, en / norm_bound);
      worst_walk = std::max(worst_walk, e_max / walk);
      ASSERT_LE(e_max, bound) << ia;
      ASSERT_LE(en, norm_bound) << ia;
    });
    std::printf("1000 shifts (%s): worst error / bound %.3f, norm %.3f, error / random-walk part %.3f\n",
                std::string(to_string(type)).c_str(), worst, worst_norm, worst_walk);
  }
}

// A pass turning a pair by inv_freq 0 with factor 1 (switch_schedule's other pass) gives the pair
// back bit for bit, signed zeros aside (documented: a' = a - b*0 turns -0 into +0 when b < 0).
TEST(Rerotate, ZeroAngleWithFactorOneIsTheIdentityButForNegativeZero) {
  Schedule s = make_schedule(text_spec(ScheduleType::default_, Pairing::half));
  std::fill(s.inv_freq.begin(), s.inv_freq.end(), 0.0);
  s.inv_freq_hf32.clear();
  std::vector<float> k = test::random_floats(static_cast<size_t>(64 * kHeads * 64), 13, 1e30f);
  k[0] = 1e-45f, k[32] = -3e38f, k[1] = -0.0f, k[33] = -2.0f;  // a denormal, a huge, a -0 beside a negative
  const std::vector<float> before = k;
  for (const Direction dir : {Direction::forward, Direction::inverse}) {
    apply(s, ApplyArgs{.q = TensorView::bshd(k.data(), DType::f32, 1, 64, kHeads, 64),
                       .positions = Positions::sequential(123456), .direction = dir});
  }
  for (size_t i = 0; i < k.size(); ++i) {
    if (i == 1) continue;
    ASSERT_EQ(std::bit_cast<uint32_t>(k[i]), std::bit_cast<uint32_t>(before[i])) << i;
  }
  EXPECT_EQ(std::bit_cast<uint32_t>(k[1]), 0u);  // -0 came back +0
}

// ---- switch_schedule -------------------------------------------------------------------------------

// switch(apply(k, p, A), A -> B) against apply(k, p, B): bound per element, r = gB / gA,
//   2^-23 (m r (|a1| + |b1|) + (√2 r gA + gB)(|a0| + |b0|)) + p |θB - θA| 2^-53 N1 r
// m = 1 when r == 1 (one rounding per pair), 2 otherwise (pass 2 pairs: scaled, then turned).
double check_switch(const Schedule& a, const Schedule& b, const std::vector<int64_t>& pos) {
  const int64_t tokens = static_cast<int64_t>(pos.size());
  const std::vector<float> k0 = test::random_floats(static_cast<size_t>(tokens * kHeads * a.head_dim), 21, 3.0f);
  const Tensor stored = applied(a, k0, DType::f32, pos);
  std::vector<float> out(stored.f32.size(), 0.0f);
  switch_schedule(a, b, RotatedKeys{.k = TensorView::bshd(const_cast<float*>(stored.f32.data()), DType::f32, 1,
                                                          tokens, kHeads, a.head_dim),
                                    .k_out = TensorView::bshd(out.data(), DType::f32, 1, tokens, kHeads, a.head_dim),
                                    .positions = per_token(pos, 1)});
  const Tensor ref = applied(b, k0, DType::f32, pos);
  const double r = b.attention_factor / a.attention_factor, m = r == 1.0 ? 1.0 : 2.0 + 1e-6;
  double worst = 0;
  for_each_pair(a, tokens, [&](size_t ia, size_t ib, int64_t j, int64_t t) {
    const double a1 = stored.f32[ia], b1 = stored.f32[ib];
    const double s1 = std::abs(a1) + std::abs(b1), s0 = std::abs(k0[ia]) + std::abs(k0[ib]);
    const double dtheta = std::abs(b.inv_freq[static_cast<size_t>(j)] - a.inv_freq[static_cast<size_t>(j)]);
    const double bound = kPairBound * (m * r * s1 + (std::sqrt(2.0) * r * a.attention_factor + b.attention_factor) * s0) +
                         static_cast<double>(pos[static_cast<size_t>(t)]) * dtheta * 0x1p-53 * std::hypot(a1, b1) * r +
                         kReferenceSlack * s1;
    for (const size_t i : {ia, ib}) {
      const double e = std::abs(double{out[i]} - ref.f32[i]);
      worst = std::max(worst, e / bound);
      EXPECT_LE(e, bound) << "element " << i;
    }
  });
  return worst;
}

TEST(Switch, LongRopeShortToLongEqualsAFreshApplication) {
  for (const Pairing pairing : {Pairing::half, Pairing::interleaved}) {
    const Spec spec = text_spec(ScheduleType::longrope, pairing);
    const Schedule shorter = make_schedule(spec, 4096), longer = make_schedule(spec, 8192);
    ASSERT_NE(shorter.inv_freq, longer.inv_freq);
    ASSERT_EQ(shorter.attention_factor, longer.attention_factor);
    const double w = check_switch(shorter, longer, {0, 1, 4095, 4096, 8191, 131071, max_position_limit - 1});
    std::printf("switch longrope short->long (%s): worst error / bound %.3f\n",
                std::string(to_string(pairing)).c_str(), w);
  }
}

TEST(Switch, DynamicNtkBaseChangesEqualAFreshApplication) {
  Spec spec = text_spec(ScheduleType::default_, Pairing::half);
  spec.schedule = ScheduleType::dynamic, spec.factor = 2.0, spec.original_max_position = 4096;
  const Schedule at4k = make_schedule(spec, 4096), at8k = make_schedule(spec, 8192), at64k = make_schedule(spec, 65536);
  check_switch(at4k, at8k, {0, 5, 4095, 8191});
  check_switch(at8k, at64k, {0, 8191, 65535, 1 << 24});
  check_switch(at64k, at4k, {0, 100, 65535});  // back: every pair turns the other way
}

TEST(Switch, DifferentAttentionFactorsScaleByTheirRatio) {
  Spec a = text_spec(ScheduleType::yarn, Pairing::interleaved), b = a;
  b.factor = 4.0;  // g 1.277 -> 1.139, and each θ up or unchanged
  a.original_max_position = b.original_max_position = 4096;
  const Schedule sa = make_schedule(a), sb = make_schedule(b);
  ASSERT_NE(sa.attention_factor, sb.attention_factor);
  std::printf("switch yarn 16->4: worst error / bound %.3f\n", check_switch(sa, sb, {0, 3, 4096, 65535, 1 << 22}));
  std::printf("switch yarn 4->16: worst error / bound %.3f\n", check_switch(sb, sa, {0, 3, 4096, 65535, 1 << 22}));
  Spec c = text_spec(ScheduleType::default_, Pairing::interleaved);
  c.attention_factor = 0.5;  // θ equal, g different: a pure scaling
  check_switch(make_schedule(text_spec(ScheduleType::default_, Pairing::interleaved)), make_schedule(c), {0, 77});
}

TEST(Switch, EqualSchedulesInPlaceWriteNothing) {
  const Schedule s = make_schedule(text_spec(ScheduleType::default_, Pairing::half));
  std::vector<float> k(static_cast<size_t>(kHeads * 64), -0.0f);
  switch_schedule(s, s, RotatedKeys{.k = TensorView::bshd(k.data(), DType::f32, 1, 1, kHeads, 64)});
  for (const float v : k) EXPECT_TRUE(std::signbit(v));
}

// ---- bad input: every message, the caller's keys untouched ---------------------------------------

TEST(RerotateErrors, EveryBadInputNamesItsValueAndWritesNothing) {
  const Schedule s = make_schedule(text_spec(ScheduleType::default_, Pairing::half));
  const Schedule m = make_schedule(mrope_spec(Pairing::half));
  std::vector<float> k = test::random_floats(static_cast<size_t>(4 * kHeads * 64), 1), mk(static_cast<size_t>(4 * kHeads * 32), 1.0f);
  const std::vector<float> before = k;
  const TensorView view = TensorView::bshd(k.data(), DType::f32, 1, 4, kHeads, 64);
  const std::vector<int64_t> pos = {9, 5, 9, 12};
  auto shift = [&](std::vector<int64_t> delta, RotatedKeys keys) { rerotate(s, keys, delta); };
  EXPECT_ROTARY_ERROR(shift({-9}, {.k = view, .positions = per_token(pos, 1)}), "positions[1]=5 + delta=-9 leaves [0, 2^31)");
  EXPECT_ROTARY_ERROR(shift({-1}, {.k = view, .positions = Positions::sequential(0)}),
                      "position 0 of token 0 (offset=0) + delta=-1 leaves [0, 2^31)");
  EXPECT_ROTARY_ERROR(shift({3}, {.k = view, .positions = Positions::sequential(max_position_limit - 6)}),
                      "position 2147483645 of token 3 (offset=2147483642) + delta=3 leaves [0, 2^31)");
  EXPECT_ROTARY_ERROR(shift({max_position_limit}, {.k = view}), "delta=2147483648 must be in (-2^31, 2^31)");
  EXPECT_ROTARY_ERROR(shift({INT64_MIN}, {.k = view}), "delta=-9223372036854775808 must be in (-2^31, 2^31)");
  EXPECT_ROTARY_ERROR(shift({1, 2}, {.k = view}), "delta has 2 values; give 1 (every stream) or one per stream (streams=1)");
  EXPECT_ROTARY_ERROR(shift({}, {.k = view}), "delta has 0 values");
  EXPECT_ROTARY_ERROR(shift({1}, {}), "k is not set");
  EXPECT_ROTARY_ERROR(shift({1}, {.k = TensorView::bshd(k.data(), DType::f32, 1, 4, 1, 128)}),
                      "k.head_dim=128 differs from the schedule's head_dim=64");
  EXPECT_ROTARY_ERROR(shift({1}, {.k = view, .k_out = TensorView::bshd(k.data() + 1, DType::f32, 1, 4, kHeads, 64)}),
                      "k_out overlaps input k");
  EXPECT_ROTARY_ERROR(shift({1}, {.k = view, .positions = per_token(std::vector<int64_t>{0, 1, 2}, 1)}),
                      "positions");
  EXPECT_ROTARY_ERROR(shift({1}, {.k = view, .threads = -1}), "threads=-1");
  // M-RoPE: per-stream deltas, each stream's positions checked with its own delta.
  const std::vector<int64_t> mpos = {0, 1, 2, 3, 10, 11, 12, 13, 7, 6, 5, 4};
  const TensorView mview = TensorView::bshd(mk.data(), DType::f32, 1, 4, kHeads, 32);
  EXPECT_ROTARY_ERROR(rerotate(m, {.k = mview, .positions = per_token(mpos, 3)}, std::vector<int64_t>{1, 2}),
                      "delta has 2 values; give 1 (every stream) or one per stream (streams=3)");
  EXPECT_ROTARY_ERROR(rerotate(m, {.k = mview, .positions = per_token(mpos, 3)}, std::vector<int64_t>{0, 0, -5}),
                      "positions[2][3]=4 + delta[2]=-5 leaves [0, 2^31)");
  EXPECT_ROTARY_ERROR(rerotate(m, {.k = mview, .positions = per_token(mpos, 3)}, std::vector<int64_t>{0, 1, -1 - max_position_limit}),
                      "delta[2]=-2147483649 must be in (-2^31, 2^31)");
  EXPECT_EQ(k, before);
  EXPECT_EQ(mk, std::vector<float>(mk.size(), 1.0f));
}

TEST(SwitchErrors, IncompatibleSchedulesNameTheField) {
  const Schedule s = make_schedule(text_spec(ScheduleType::default_, Pairing::half));
  std::vector<float> k = test::random_floats(static_cast<size_t>(2 * kHeads * 64), 1);
  const std::vector<float> before = k;
  const RotatedKeys keys{.k = TensorView::bshd(k.data(), DType::f32, 1, 2, kHeads, 64)};
  auto with = [&](auto edit) { Schedule t = s; edit(t); return t; };
  EXPECT_ROTARY_ERROR(switch_schedule(s, with([](Schedule& t) { t.head_dim = 128; }), keys),
                      "schedules differ in head_dim: from 64, to 128");
  EXPECT_ROTARY_ERROR(switch_schedule(s, with([](Schedule& t) { t.rotary_dim = 32; t.inv_freq.resize(16); t.inv_freq_hf32.clear(); }), keys),
                      "schedules differ in rotary_dim: from 64, to 32");
  EXPECT_ROTARY_ERROR(switch_schedule(s, with([](Schedule& t) { t.pairing = Pairing::interleaved; }), keys),
                      "schedules differ in pairing: from half, to interleaved");
  EXPECT_ROTARY_ERROR(switch_schedule(s, with([](Schedule& t) { t.blocks = 2; }), keys),
                      "schedules differ in blocks: from 1, to 2");
  EXPECT_ROTARY_ERROR(switch_schedule(with([](Schedule& t) { t.head_dim = 80; }),
                                      with([](Schedule& t) { t.head_dim = 80; t.rotary_offset = 16; }), keys),
                      "schedules differ in rotary_offset: from 0, to 16");
  EXPECT_ROTARY_ERROR(switch_schedule(s, with([](Schedule& t) { t.streams = 2; }), keys),
                      "schedules differ in streams: from 1, to 2");
  const Schedule two = with([](Schedule& t) { t.streams = 2; t.pair_stream.assign(32, 0); });
  EXPECT_ROTARY_ERROR(switch_schedule(two, with([](Schedule& t) { t.streams = 2; t.pair_stream.assign(32, 0); t.pair_stream[5] = 1; }), keys),
                      "schedules differ in pair_stream: pair 5 reads stream 0 in from, 1 in to");
  EXPECT_ROTARY_ERROR(switch_schedule(s, with([](Schedule& t) { t.inv_freq[3] = -1; }), keys), "to schedule: inv_freq");
  EXPECT_ROTARY_ERROR(switch_schedule(with([](Schedule& t) { t.rotary_dim = 3; }), s, keys), "from schedule: rotary_dim=3");
  EXPECT_ROTARY_ERROR(switch_schedule(with([](Schedule& t) { t.attention_factor = 1e30; }),
                                      with([](Schedule& t) { t.attention_factor = 1e-20; }), keys),
                      "attention_factor ratio to/from = 1e-20/1e+30 = 9.999999999999999e-51 must be a normal float32");
  EXPECT_ROTARY_ERROR(switch_schedule(s, s, RotatedKeys{}), "k is not set");
  EXPECT_ROTARY_ERROR(switch_schedule(s, with([](Schedule& t) { t.inv_freq[0] = 0.5; }),
                                      RotatedKeys{.k = keys.k, .positions = Positions::sequential(max_position_limit - 1)}),
                      "offset=2147483647 with seq=2 must keep positions in [0, 2^31)");
  EXPECT_EQ(k, before);
}

}  // namespace
}  // namespace rotary
