// rotary::Rope: its tables give the bits apply computes on the fly (exact and hf_float32), for
// every kind of position, inside and beyond the cache; growth under many threads; its errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "rotary/apply.hpp"
#include "rotary/error.hpp"
#include "rotary/rope.hpp"

namespace rotary {
namespace {

Spec spec_of(int64_t head_dim, double base) {
  Spec s;
  s.head_dim = head_dim;
  s.base = base;
  return s;
}

std::vector<float> random_values(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Rope::apply against rotary::apply with no table (angles on the fly), the same ApplyArgs.
void expect_rope_matches_on_the_fly(const Rope& rope, Positions positions, int64_t batch, int64_t seq,
                                    AngleMode numerics, const std::string& what) {
  const int64_t heads = 3, d = rope.schedule().head_dim;
  const auto original = random_values(static_cast<size_t>(batch * seq * heads * d), 7);
  std::vector<float> by_rope = original, fly = original;
  ApplyArgs args{.q = TensorView::bshd(by_rope.data(), DType::f32, batch, seq, heads, d), .positions = positions};
  args.numerics = numerics;
  rope.apply(args);
  args.q = TensorView::bshd(fly.data(), DType::f32, batch, seq, heads, d);
  apply(rope.schedule(), args);
  EXPECT_TRUE(same_bits(by_rope, fly)) << what;
  EXPECT_FALSE(same_bits(by_rope, original)) << what << ": nothing rotated";
}

TEST(Rope, TablesGiveTheBitsOfAnglesOnTheFlyForEveryPositionKind) {
  const Rope rope(spec_of(128, 1e6));  // base 1e6 at 128: hf_float32 differs from exact
  for (const AngleMode mode : {AngleMode::exact, AngleMode::hf_float32}) {
    const std::string m(to_string(mode));
    expect_rope_matches_on_the_fly(rope, Positions::sequential(5), 2, 9, mode, m + " sequential");
    const std::vector<int64_t> p64{0, 17, 4095, 4096, 9000, 3, 3, 70000};
    expect_rope_matches_on_the_fly(rope, Positions::per_token(std::span<const int64_t>(p64)), 2, 4, mode,
                                   m + " int64 per token");
    const std::vector<int32_t> p32{1, 2, 100000, 7};
    expect_rope_matches_on_the_fly(rope, Positions::per_token(std::span<const int32_t>(p32)), 1, 4, mode,
                                   m + " int32 per token");
    // Beyond the cache (max_cached_rows = 2^17 here): computed on the fly, no table of 2^31 rows.
    const std::vector<int64_t> far{int64_t{1} << 30, (int64_t{1} << 31) - 1};
    expect_rope_matches_on_the_fly(rope, Positions::per_token(std::span<const int64_t>(far)), 1, 2, mode,
                                   m + " beyond the cache");
  }
  const std::vector<double> frac{0.5, 12.25, 3.0};
  expect_rope_matches_on_the_fly(rope, Positions::per_token(std::span<const double>(frac)), 1, 3, AngleMode::exact,
                                 "fractional (exact)");
  EXPECT_EQ(rope.max_cached_rows(), Rope::cache_bytes / (8 * 64));
}

TEST(Rope, CacheGrowsByDoublingAndStopsAtItsLimit) {
  const Rope rope(spec_of(64, 10000));
  EXPECT_EQ(rope.cached(1, AngleMode::exact), nullptr);
  const auto first = rope.table(10, AngleMode::exact);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->rows(), 4096);
  EXPECT_EQ(rope.cached(4096, AngleMode::exact), first);
  EXPECT_EQ(rope.cached(4097, AngleMode::exact), nullptr);
  EXPECT_EQ(rope.cached(10, AngleMode::hf_float32), nullptr);  // one table per mode
  const auto grown = rope.table(4097, AngleMode::exact);
  EXPECT_EQ(grown->rows(), 8192);
  EXPECT_EQ(first->rows(), 4096);  // a caller holding the old table keeps it whole
  EXPECT_EQ(rope.table(rope.max_cached_rows() + 1, AngleMode::exact), nullptr);
  EXPECT_EQ(rope.table(0, AngleMode::exact), nullptr);
  // Rows of the cache are Table::range's rows.
  const Table direct = Table::range(rope.schedule(), 0, 8192, AngleMode::exact);
  ASSERT_EQ(direct.cos().size(), grown->cos().size());
  EXPECT_EQ(std::memcmp(direct.cos().data(), grown->cos().data(), direct.cos().size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(direct.sin().data(), grown->sin().data(), direct.sin().size() * sizeof(float)), 0);
}

TEST(Rope, RefusesATableAndValidatesBeforeWriting) {
  const Rope rope(spec_of(64, 10000));
  std::vector<float> q(64, 1.0f);
  const Table table = Table::range(rope.schedule(), 0, 4, AngleMode::exact);
  ApplyArgs args{.q = TensorView::bshd(q.data(), DType::f32, 1, 1, 1, 64)};
  args.table = &table;
  EXPECT_THROW(rope.apply(args), Error);
  args.table = nullptr;
  const std::vector<int64_t> bad{-3};
  args.positions = Positions::per_token(std::span<const int64_t>(bad));
  try {
    rope.apply(args);
    ADD_FAILURE() << "a negative position was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("-3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(q, std::vector<float>(64, 1.0f));
  const std::vector<double> frac{0.5};
  args.positions = Positions::per_token(std::span<const double>(frac));
  args.numerics = AngleMode::hf_float32;
  EXPECT_THROW(rope.apply(args), Error);
  EXPECT_EQ(q, std::vector<float>(64, 1.0f));
}

TEST(Rope, UndoWithAnAttentionFactorDividesItOutWithoutATable) {
  Spec s = spec_of(64, 10000);
  s.schedule = ScheduleType::yarn;
  s.factor = 4.0;
  s.original_max_position = 1024;
  const Rope rope(s);
  ASSERT_NE(rope.schedule().attention_factor, 1.0);
  const auto original = random_values(2 * 4 * 64, 3);
  std::vector<float> q = original;
  const std::vector<int64_t> p{1, 2, 3, 2000};
  ApplyArgs args{.q = TensorView::bshd(q.data(), DType::f32, 1, 4, 2, 64),
                 .positions = Positions::per_token(std::span<const int64_t>(p))};
  rope.apply(args);
  args.undo = true;
  rope.apply(args);
  for (size_t i = 0; i < q.size(); ++i) EXPECT_NEAR(q[i], original[i], 1e-5) << i;
}

// Threads share one Rope whose table grows under them: every result is the on-the-fly bits.
TEST(Rope, ConcurrentCallsWhileTheTableGrows) {
  const Rope rope(spec_of(64, 500000));
  constexpr int kThreads = 8, kCalls = 40;
  std::vector<std::thread> threads;
  std::vector<int> mismatches(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(t));
      for (int c = 0; c < kCalls; ++c) {
        const int64_t reach = int64_t{1} << (8 + (c % 10));  // up to 2^17: the cache's limit for 64
        std::vector<int64_t> p(6);
        for (auto& x : p) x = std::uniform_int_distribution<int64_t>(0, reach - 1)(rng);
        const auto mode = (c + t) % 2 ? AngleMode::exact : AngleMode::hf_float32;
        const auto original = random_values(6 * 2 * 64, static_cast<uint32_t>(c * 31 + t));
        std::vector<float> a = original, b = original;
        ApplyArgs args{.q = TensorView::bshd(a.data(), DType::f32, 1, 6, 2, 64),
                       .positions = Positions::per_token(std::span<const int64_t>(p)), .numerics = mode,
                       .threads = 1};
        rope.apply(args);
        args.q = TensorView::bshd(b.data(), DType::f32, 1, 6, 2, 64);
        apply(rope.schedule(), args);
        if (!same_bits(a, b)) ++mismatches[static_cast<size_t>(t)];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[static_cast<size_t>(t)], 0) << "thread " << t;
  EXPECT_NE(rope.cached(1 << 16, AngleMode::exact), nullptr);
}

}  // namespace
}  // namespace rotary
