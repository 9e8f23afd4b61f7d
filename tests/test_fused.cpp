// rope_store, qk_norm_rope and rerotate_cache (rotary/fused.hpp) bit for bit against their
// compositions: rotary::apply / rerotate plus a reference scatter, quantiser (support/quant_oracle.hpp)
// and RMSNorm written out here. Caches are poisoned: untouched and skipped slots must keep the
// poison; nothing is written when an argument is bad. The CUDA body on the host: test_fused_emulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <tuple>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "math/half.hpp"
#include "rotary/apply.hpp"
#include "rotary/fused.hpp"
#include "rotary/rerotate.hpp"
#include "rotary/spec.hpp"
#include "rotary/table.hpp"
#include "support/fused_cases.hpp"
#include "support/quant_oracle.hpp"

namespace rotary {
namespace {

using test::Buffer;
using test::Layout;

// ---- rope_store ----

void expect_rope_store_matches_composition(const test::StoreCase& c) {
  SCOPED_TRACE(c.name());
  test::StoreSetup s(c);
  // The composition: apply on copies, then the reference scatter of the rotated k and of v.
  Buffer q2 = s.q, k2 = s.k;
  ApplyArgs composed = s.rope_args();
  composed.q = s.view(q2, c.heads_q);
  composed.k = s.view(k2, c.heads_k);
  apply(c.schedule, composed);
  Buffer k_cache_ref = s.k_cache_bytes, v_cache_ref = s.v_cache_bytes;
  s.scatter(k2, c.heads_k, c.schedule.head_dim, s.k_cache, k_cache_ref, s.k_quant_ptr());
  s.scatter(s.v, c.heads_k, s.c.v_dim, s.v_cache, v_cache_ref, s.v_quant_ptr());
  // Fused.
  rope_store(c.schedule, s.store_args());
  EXPECT_TRUE(test::same_bytes(s.q, q2, c.dtype)) << "q";
  EXPECT_TRUE(s.k == s.k_input) << "k is read only";
  EXPECT_TRUE(k_cache_ref == s.k_cache_bytes) << "k_cache: " << test::first_difference(k_cache_ref, s.k_cache_bytes);
  EXPECT_TRUE(v_cache_ref == s.v_cache_bytes) << "v_cache: " << test::first_difference(v_cache_ref, s.v_cache_bytes);
}

Schedule schedule_of(int64_t head_dim, int64_t rotary_dim, Pairing pairing, int64_t offset = 0) {
  return make_schedule(Spec{.head_dim = head_dim, .rotary_dim = rotary_dim, .pairing = pairing,
                            .rotary_offset = offset});
}

TEST(FusedRopeStore, EveryLayoutBlockSizeAndHeadDimMatchesApplyThenScatter) {
  int seed = 0;
  for (const Layout layout : {Layout::nhd, Layout::hnd, Layout::contiguous}) {
    for (const int64_t block : {1, 16, 64}) {
      for (const int64_t d : {64, 80, 96, 128, 192, 256, 512}) {
        for (const Pairing pairing : {Pairing::half, Pairing::interleaved}) {
          test::StoreCase c;
          c.schedule = schedule_of(d, d, pairing);
          c.layout = layout;
          c.block_size = layout == Layout::contiguous ? 32 : block;
          c.dtype = DType::bf16;
          c.cache_dtype = DType::bf16;
          c.seed = ++seed;
          c.tokens = 7;
          expect_rope_store_matches_composition(c);
        }
      }
    }
  }
}

TEST(FusedRopeStore, GqaRatiosPartialRotaryOffsetsAndDtypes) {
  int seed = 100;
  for (const int64_t ratio : {1, 2, 4, 8, 16}) {
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      for (const auto& [d, r, off] : {std::tuple{128, 64, 0}, std::tuple{80, 32, 0}, std::tuple{192, 64, 128}}) {
        test::StoreCase c;
        c.schedule = schedule_of(d, r, ratio % 2 ? Pairing::half : Pairing::interleaved, off);
        c.heads_k = 2;
        c.heads_q = 2 * ratio;
        c.dtype = dtype;
        c.cache_dtype = dtype;
        c.seed = ++seed;
        expect_rope_store_matches_composition(c);
      }
    }
  }
}

TEST(FusedRopeStore, QuantisedCachesPerTensorAndPerHeadBothScaleModes) {
  int seed = 200;
  for (const DType cache : {DType::fp8_e4m3, DType::fp8_e5m2, DType::i8, DType::f16, DType::f32}) {
    for (const DType dtype : {DType::bf16, DType::f32}) {
      for (const bool per_head : {false, true}) {
        for (const ScaleMode mode : {ScaleMode::divide, ScaleMode::multiply}) {
          test::StoreCase c;
          c.schedule = schedule_of(64, 64, Pairing::half);
          c.dtype = dtype;
          c.cache_dtype = cache;
          c.scaled = is_quantised_dtype(cache);
          c.per_head_scale = per_head;
          c.mode = mode;
          c.magnitude = cache == DType::i8 ? 200.0f : 600.0f;  // beyond ±max: saturation
          c.seed = ++seed;
          expect_rope_store_matches_composition(c);
        }
      }
    }
  }
}

TEST(FusedRopeStore, Fp8SubnormalsAndMaxValues) {
  for (const DType cache : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    for (const float magnitude : {1e-3f, 448.0f, 57344.0f, 1e5f}) {
      test::StoreCase c;
      c.schedule = schedule_of(64, 64, Pairing::interleaved);
      c.dtype = DType::f32;
      c.cache_dtype = cache;
      c.scaled = true;
      c.magnitude = magnitude;
      c.seed = 300 + static_cast<int>(magnitude);
      expect_rope_store_matches_composition(c);
    }
  }
}

TEST(FusedRopeStore, MropeTablesCallerAnglesHfFloat32AndXpos) {
  int seed = 400;
  // Qwen2-VL sections over 3 streams, per-token positions [3, tokens].
  {
    test::StoreCase c;
    c.schedule = make_schedule(Spec{.head_dim = 128, .stream_layout = StreamLayout::sections, .sections = {16, 24, 24}});
    c.mrope = true;
    c.seed = ++seed;
    expect_rope_store_matches_composition(c);
    c.schedule = make_schedule(Spec{.head_dim = 128, .rotary_dim = 64, .pairing = Pairing::interleaved,
                                    .stream_layout = StreamLayout::sections, .sections = {8, 12, 12}});  // GLM-4.1V
    expect_rope_store_matches_composition(c);
  }
  for (const test::AngleSource source :
       {test::AngleSource::table, test::AngleSource::caller, test::AngleSource::hf_float32, test::AngleSource::exact}) {
    test::StoreCase c;
    c.schedule = make_schedule(Spec{.head_dim = 64, .schedule = ScheduleType::yarn, .factor = 4.0,
                                    .original_max_position = 4096});
    c.source = source;
    c.seed = ++seed;
    expect_rope_store_matches_composition(c);
  }
  test::StoreCase c;
  c.schedule = with_xpos(schedule_of(64, 64, Pairing::interleaved), 512.0);
  c.seed = ++seed;
  expect_rope_store_matches_composition(c);
}

TEST(FusedRopeStore, MlaRowsHoldKvCBesideTheRotatedPart) {
  // DeepSeek-V3: one latent row [kv_c 512 | k_pe 64] per slot, the rotated k_pe interleaved.
  test::StoreCase c;
  c.schedule = schedule_of(64, 64, Pairing::interleaved);
  c.layout = Layout::mla;
  c.heads_q = 16;
  c.heads_k = 1;
  c.pass_dim = 512;
  c.block_size = 64;
  c.seed = 500;
  SCOPED_TRACE(c.name());
  test::StoreSetup s(c);
  Buffer q2 = s.q, k2 = s.k;
  ApplyArgs composed = s.rope_args();
  composed.q = s.view(q2, c.heads_q);
  composed.k = s.view(k2, c.heads_k);
  apply(c.schedule, composed);
  Buffer ref = s.k_cache_bytes;
  s.scatter(k2, 1, 64, s.k_cache, ref, nullptr);
  s.scatter(s.k_pass, 1, 512, s.k_pass_cache, ref, nullptr);
  RopeStoreArgs args = s.store_args();
  rope_store(c.schedule, args);
  EXPECT_TRUE(test::same_bytes(s.q, q2, c.dtype));
  EXPECT_TRUE(ref == s.k_cache_bytes) << test::first_difference(ref, s.k_cache_bytes);
}

TEST(FusedRopeStore, QuantisedQOutAndKOut) {
  test::StoreCase c;
  c.schedule = schedule_of(128, 128, Pairing::half);
  c.seed = 600;
  test::StoreSetup s(c);
  Buffer q2 = s.q, k2 = s.k;
  ApplyArgs composed = s.rope_args();
  composed.q = s.view(q2, c.heads_q);
  composed.k = s.view(k2, c.heads_k);
  apply(c.schedule, composed);
  Buffer q_fp8(s.q.size() / 2, 0x5a), k_out(s.k.size(), 0x5a);
  Buffer q_fp8_ref = q_fp8;
  const float q_scale = 0.25f;
  for (size_t i = 0; i < q_fp8.size(); ++i) {
    test::oracle_store(DType::fp8_e4m3, q_fp8_ref.data(), static_cast<int64_t>(i),
                       detail::bf16_to_f32(reinterpret_cast<const uint16_t*>(q2.data())[i]), q_scale, ScaleMode::multiply);
  }
  RopeStoreArgs args = s.store_args();
  args.q_quantized = TensorView::bshd(q_fp8.data(), DType::fp8_e4m3, 1, c.tokens, c.heads_q, 128);
  args.q_quant = CacheQuant{.scale = &q_scale, .count = 1, .mode = ScaleMode::multiply};
  args.rope.k_out = s.view(k_out, c.heads_k);
  const Buffer q_before = s.q;
  rope_store(c.schedule, args);
  EXPECT_TRUE(q_fp8 == q_fp8_ref) << test::first_difference(q_fp8, q_fp8_ref);
  EXPECT_TRUE(s.q == q_before) << "q_quantized without q_out: q is not written";
  EXPECT_TRUE(k_out == k2);
}

TEST(FusedRopeStore, ThreadCountsAndTheReferenceBackendGiveTheSameBits) {
  test::StoreCase c;
  c.schedule = schedule_of(128, 128, Pairing::half);
  c.tokens = 300;
  c.seed = 700;
  std::vector<Buffer> results;
  for (const int threads : {1, 2, 3, 0}) {
    test::StoreSetup s(c);
    RopeStoreArgs args = s.store_args();
    args.rope.threads = threads;
    rope_store(c.schedule, args);
    results.push_back(s.k_cache_bytes);
    results.back().insert(results.back().end(), s.q.begin(), s.q.end());
  }
  for (const Buffer& r : results) EXPECT_TRUE(r == results[0]);
}

// ---- errors: nothing written ----

TEST(FusedRopeStore, BadArgumentsThrowNamingTheValueAndWriteNothing) {
  test::StoreCase c;
  c.schedule = schedule_of(64, 64, Pairing::half);
  c.tokens = 6;
  c.seed = 800;
  struct Bad {
    std::string message;
    std::function<void(test::StoreSetup&, RopeStoreArgs&)> edit;
  };
  static std::vector<int64_t> duplicate, beyond;
  static const float zero_scale = 0.0f;
  const std::vector<Bad> cases = {
      {"slots[4]=", [](test::StoreSetup& s, RopeStoreArgs& a) {
         duplicate = s.slots; duplicate[4] = duplicate[0]; a.cache.slots = Slots::of(std::span<const int64_t>(duplicate)); }},
      {"is beyond k_cache's capacity", [](test::StoreSetup& s, RopeStoreArgs& a) {
         beyond = s.slots; beyond[2] = s.k_cache.capacity(); a.cache.slots = Slots::of(std::span<const int64_t>(beyond)); }},
      {"slots has 5 entries", [](test::StoreSetup& s, RopeStoreArgs& a) {
         a.cache.slots = Slots::of(std::span<const int64_t>(s.slots.data(), 5)); }},
      {"k_cache.heads=3 differs", [](test::StoreSetup&, RopeStoreArgs& a) { a.cache.k_cache.heads = 3; }},
      {"k_cache.head_dim=32 differs", [](test::StoreSetup&, RopeStoreArgs& a) { a.cache.k_cache.head_dim = 32; }},
      {"k_cache.block_size=0 must be >= 1", [](test::StoreSetup&, RopeStoreArgs& a) { a.cache.k_cache.block_size = 0; }},
      {"k_quant.scale is set but the dtype is bf16", [](test::StoreSetup&, RopeStoreArgs& a) {
         a.cache.k_quant.scale = &zero_scale; }},
      {"positions[3]=", [](test::StoreSetup& s, RopeStoreArgs& a) {
         s.positions[3] = -1; a.rope.positions = Positions::per_token(std::span<const int64_t>(s.positions)); }},
      {"k is not set", [](test::StoreSetup&, RopeStoreArgs& a) { a.rope.k = TensorView{}; }},
      {"k_cache overlaps v_cache", [](test::StoreSetup&, RopeStoreArgs& a) { a.cache.v_cache.data = a.cache.k_cache.data; }},
      {"q.dtype=fp8_e4m3 is a cache dtype", [](test::StoreSetup&, RopeStoreArgs& a) { a.rope.q.dtype = DType::fp8_e4m3; }},
      {"copy_tail=false", [](test::StoreSetup&, RopeStoreArgs& a) { a.rope.copy_tail = false; }},
  };
  for (const Bad& bad : cases) {
    test::StoreSetup s(c);
    RopeStoreArgs args = s.store_args();
    bad.edit(s, args);
    const Buffer q = s.q, kc = s.k_cache_bytes, vc = s.v_cache_bytes;
    try {
      rope_store(c.schedule, args);
      ADD_FAILURE() << "no error for " << bad.message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad.message), std::string::npos) << e.what();
    }
    EXPECT_TRUE(s.q == q && s.k_cache_bytes == kc && s.v_cache_bytes == vc) << bad.message << ": something was written";
  }
}

TEST(FusedRopeStore, SlotsFromPageTable) {
  // Two requests: pages {7, 2} and {5}; block size 4.
  const std::vector<int32_t> kv_indices = {7, 2, 5}, kv_indptr = {0, 2, 3};
  const std::vector<int32_t> batch = {0, 0, 1, -1}, pos = {3, 5, 1, 0};
  EXPECT_EQ(slots_from_page_table(kv_indices, kv_indptr, batch, pos, 4), (std::vector<int64_t>{31, 9, 21, -1}));
  const std::vector<int32_t> far = {0, 8, 1, 0};
  EXPECT_THROW(slots_from_page_table(kv_indices, kv_indptr, batch, far, 4), Error);
}

// ---- qk_norm_rope ----

void expect_qk_norm_rope_matches_composition(const test::NormCase& c) {
  SCOPED_TRACE(c.name());
  test::NormSetup s(c);
  // The composition: the reference norm (test::reference_norm) then apply, or apply then the norm.
  Buffer q2 = s.q, k2 = s.k, v2 = s.v;
  ApplyArgs composed = s.rope_args();
  composed.q = s.view(q2, c.heads_q);
  composed.k = s.view(k2, c.heads_k);
  if (c.order == NormOrder::norm_then_rope) {
    s.reference_norm(q2, c.heads_q, s.q_weight);
    s.reference_norm(k2, c.heads_k, s.k_weight);
    apply(c.schedule, composed);
  } else {
    apply(c.schedule, composed);
    s.reference_norm(q2, c.heads_q, s.q_weight);
    s.reference_norm(k2, c.heads_k, s.k_weight);
  }
  if (c.v_norm) s.reference_v_norm(v2);
  Buffer k_cache_ref = s.k_cache_bytes, v_cache_ref = s.v_cache_bytes;
  if (c.store) {
    s.scatter(k2, c.heads_k, c.schedule.head_dim, s.k_cache, k_cache_ref, nullptr);
    s.scatter(v2, c.heads_k, c.schedule.head_dim, s.v_cache, v_cache_ref, nullptr);
  }
  qk_norm_rope(c.schedule, s.norm_args());
  EXPECT_TRUE(test::same_bytes(s.q, q2, c.dtype)) << "q " << test::first_difference(s.q, q2);
  if (c.store) {
    EXPECT_TRUE(k_cache_ref == s.k_cache_bytes) << test::first_difference(k_cache_ref, s.k_cache_bytes);
    EXPECT_TRUE(v_cache_ref == s.v_cache_bytes) << test::first_difference(v_cache_ref, s.v_cache_bytes);
  } else {
    EXPECT_TRUE(test::same_bytes(s.k, k2, c.dtype)) << "k " << test::first_difference(s.k, k2);
    if (c.v_norm) {
      EXPECT_TRUE(test::same_bytes(s.v, v2, c.dtype)) << "v";
    }
  }
}

TEST(FusedQkNormRope, Qwen3Gemma3Olmo2Llama4AndGemma4AgainstTheComposition) {
  int seed = 900;
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (const int64_t d : {64, 128, 256, 512}) {
      // Qwen3: per head, w, llama rounding.
      test::NormCase qwen3{.schedule = schedule_of(d, d, Pairing::half), .dtype = dtype, .seed = ++seed};
      expect_qk_norm_rope_matches_composition(qwen3);
      // Gemma 3: 1 + w, all float32.
      test::NormCase gemma3 = qwen3;
      gemma3.rounding = NormRounding::gemma;
      gemma3.weight_offset = 1.0f;
      expect_qk_norm_rope_matches_composition(gemma3);
      // Gemma 4: + weightless v norm, cache write.
      test::NormCase gemma4 = gemma3;
      gemma4.v_norm = true;
      gemma4.store = true;
      expect_qk_norm_rope_matches_composition(gemma4);
    }
    // OLMo 2: norm over all heads.
    test::NormCase olmo2{.schedule = schedule_of(128, 128, Pairing::half), .dtype = dtype, .seed = ++seed};
    olmo2.scope = NormScope::all_heads;
    olmo2.rounding = NormRounding::gemma;
    expect_qk_norm_rope_matches_composition(olmo2);
    // Llama 4: rope then a weightless L2 norm, interleaved.
    test::NormCase llama4{.schedule = schedule_of(128, 128, Pairing::interleaved), .dtype = dtype, .seed = ++seed};
    llama4.order = NormOrder::rope_then_norm;
    llama4.weights = false;
    llama4.rounding = NormRounding::gemma;
    expect_qk_norm_rope_matches_composition(llama4);
    // Partial rotary, M-RoPE (Qwen3-VL-like) and a cache write.
    test::NormCase partial{.schedule = schedule_of(128, 64, Pairing::half), .dtype = dtype, .seed = ++seed};
    partial.store = true;
    expect_qk_norm_rope_matches_composition(partial);
    test::NormCase mrope{.schedule = make_schedule(Spec{.head_dim = 128, .stream_layout = StreamLayout::sections,
                                                        .sections = {16, 24, 24}}),
                         .dtype = dtype, .seed = ++seed};
    mrope.mrope = true;
    expect_qk_norm_rope_matches_composition(mrope);
    test::NormCase rope_all = olmo2;
    rope_all.order = NormOrder::rope_then_norm;
    expect_qk_norm_rope_matches_composition(rope_all);
  }
}

TEST(FusedQkNormRope, TheNormIsWithinAFewUlpsOfAPlainFloat32RmsNorm) {
  // transformers: x * rsqrt(mean(x^2) + eps) in float32; ours sums in double and rounds r once.
  test::NormCase c{.schedule = schedule_of(128, 128, Pairing::half), .dtype = DType::f32, .seed = 950};
  c.identity_rope = true;
  test::NormSetup s(c);
  Buffer q0 = s.q;
  qk_norm_rope(c.schedule, s.norm_args());
  const auto* x = reinterpret_cast<const float*>(q0.data());
  const auto* y = reinterpret_cast<const float*>(s.q.data());
  const auto* w = reinterpret_cast<const float*>(s.q_weight.data());
  for (int64_t row = 0; row < c.tokens * c.heads_q; ++row) {
    float sum = 0;
    for (int64_t i = 0; i < 128; ++i) sum += x[row * 128 + i] * x[row * 128 + i];
    const float r = 1.0f / std::sqrt(sum / 128 + c.eps);
    for (int64_t i = 0; i < 128; ++i) {
      const float want = w[i] * (x[row * 128 + i] * r);
      EXPECT_NEAR(y[row * 128 + i], want, 8 * std::fabs(want) * 0x1p-24 + 1e-30) << row << " " << i;
    }
  }
}

TEST(FusedQkNormRope, BadArgumentsThrowAndWriteNothing) {
  test::NormCase c{.schedule = schedule_of(64, 64, Pairing::half), .dtype = DType::bf16, .seed = 990};
  test::NormSetup s(c);
  const Buffer q = s.q, k = s.k;
  QkNormRopeArgs a = s.norm_args();
  a.q_weight.count = 63;
  EXPECT_THROW(qk_norm_rope(c.schedule, a), Error);
  a = s.norm_args();
  a.eps = -1;
  EXPECT_THROW(qk_norm_rope(c.schedule, a), Error);
  a = s.norm_args();
  a.q_weight.dtype = DType::f16;
  try {
    qk_norm_rope(c.schedule, a);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q_weight.dtype=f16 must be f32 or the data's dtype bf16"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(s.q == q && s.k == k);
}

// ---- rerotate_cache ----

TEST(FusedRerotateCache, DeltaMatchesRerotateOfTheGatheredKeys) {
  int seed = 1000;
  for (const DType cache : {DType::bf16, DType::f32, DType::f16, DType::fp8_e4m3, DType::fp8_e5m2, DType::i8}) {
    for (const Layout layout : {Layout::nhd, Layout::hnd}) {
      for (const auto& [d, r] : {std::pair{128, 128}, std::pair{96, 64}}) {
        test::RerotateCase c;
        c.schedule = make_schedule(Spec{.head_dim = d, .rotary_dim = r, .schedule = ScheduleType::yarn, .factor = 4.0,
                                        .original_max_position = 4096});
        c.cache_dtype = cache;
        c.layout = layout;
        c.seed = ++seed;
        SCOPED_TRACE(c.name());
        test::RerotateSetup s(c);
        const Buffer ref = s.composition();
        rerotate_cache(c.schedule, s.args());
        EXPECT_TRUE(ref == s.cache_bytes) << test::first_difference(ref, s.cache_bytes);
      }
    }
  }
}

TEST(FusedRerotateCache, RawKeysRotatedOnceEqualApply) {
  test::RerotateCase c;
  c.schedule = make_schedule(Spec{.head_dim = 64, .schedule = ScheduleType::yarn, .factor = 4.0,
                                  .original_max_position = 4096});  // attention_factor != 1: applied once
  c.cache_dtype = DType::bf16;
  c.raw = true;
  c.seed = 1100;
  test::RerotateSetup s(c);
  const Buffer ref = s.composition();
  rerotate_cache(c.schedule, s.args());
  EXPECT_TRUE(ref == s.cache_bytes) << test::first_difference(ref, s.cache_bytes);
}

TEST(FusedRerotateCache, Fp8RequantisationErrorIsAtMostOneCodeStep) {
  // Moving e4m3 keys by +Δ then -Δ: each value comes back within one code step (two roundings of
  // half a step, the rotation's own error far below).
  test::RerotateCase c;
  c.schedule = schedule_of(64, 64, Pairing::half);
  c.cache_dtype = DType::fp8_e4m3;
  c.seed = 1200;
  test::RerotateSetup s(c);
  const Buffer before = s.cache_bytes;
  RerotateCacheArgs a = s.args();
  rerotate_cache(c.schedule, a);
  for (int64_t& d : s.delta) d = -d;
  rerotate_cache(c.schedule, a);
  // Pair j of a head row is (j, j + 32) (half pairing, NHD rows of 64). Each quantisation errs by
  // at most half a code step of a value <= the pair's norm n; the rotation back keeps the error
  // vector's length: |error| <= (sqrt(2)/2 + 1/2) step(n) per value, step(n) = 2^(floor(log2 n) - 3).
  int64_t changed = 0;
  for (size_t row = 0; row < before.size(); row += 64) {
    for (size_t j = 0; j < 32; ++j) {
      const double first = test::oracle_fp8_value(before[row + j], true), second = test::oracle_fp8_value(before[row + j + 32], true);
      const double n = std::hypot(first, second);
      const double step = std::ldexp(1.0, std::max(std::ilogb(n + 1e-30), -6) - 3);
      for (const size_t i : {row + j, row + j + 32}) {
        const double x = test::oracle_fp8_value(before[i], true), y = test::oracle_fp8_value(s.cache_bytes[i], true);
        EXPECT_LE(std::fabs(x - y), 1.21 * step) << i;
        changed += x != y;
      }
    }
  }
  EXPECT_GT(changed, 0) << "requantisation adds error: some codes move";
}

TEST(FusedRerotateCache, BadArgumentsThrowAndWriteNothing) {
  test::RerotateCase c;
  c.schedule = schedule_of(64, 64, Pairing::half);
  c.seed = 1300;
  test::RerotateSetup s(c);
  const Buffer before = s.cache_bytes;
  RerotateCacheArgs a = s.args();
  s.delta[3] = int64_t{1} << 31;
  EXPECT_THROW(rerotate_cache(c.schedule, a), Error);
  s.delta[3] = 1;
  a.delta_streams = 2;
  EXPECT_THROW(rerotate_cache(c.schedule, a), Error);
  a = s.args();
  EXPECT_THROW(rerotate_cache(with_xpos(c.schedule, 512.0), a), Error);
  EXPECT_TRUE(before == s.cache_bytes);
}

}  // namespace
}  // namespace rotary
