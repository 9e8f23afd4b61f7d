// rope_store, qk_norm_rope and rerotate_cache (rotary/fused.hpp) bit for bit against their
// compositions: rotary::apply / rerotate plus a reference scatter, quantiser (support/quant_oracle.hpp)
// and RMSNorm written out here. Caches are poisoned: untouched and skipped slots must keep the
// poison; nothing is written when an argument is bad. The CUDA body on the host: test_fused_emulation.
#include <gtest/gtest.h>
#include <hwy/tests/hwy_gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <tuple>
#include <type_traits>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cpu/cpu.hpp"
#include "fused/fused_args.hpp"
#include "math/half.hpp"
#include "math/quant.hpp"
#include "rotary/apply.hpp"
#include "rotary/fused.hpp"
#include "rotary/rerotate.hpp"
#include "rotary/spec.hpp"
#include "rotary/table.hpp"
#include "support/fused_cases.hpp"
#include "support/oracle.hpp"
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

using test::schedule_of;

TEST(FusedRopeStore, EveryLayoutBlockSizeAndHeadDimMatchesApplyThenScatter) {
  for (const test::StoreCase& c : test::layout_grid()) expect_rope_store_matches_composition(c);
}

TEST(FusedRopeStore, GqaRatiosPartialRotaryOffsetsAndDtypes) {
  for (const test::StoreCase& c : test::gqa_grid({DType::f32, DType::f16, DType::bf16})) {
    expect_rope_store_matches_composition(c);
  }
}

TEST(FusedRopeStore, QuantisedCachesPerTensorAndPerHeadBothScaleModes) {
  for (const test::StoreCase& c : test::quantised_grid()) expect_rope_store_matches_composition(c);
}

TEST(FusedRopeStore, Fp8SubnormalsAndMaxValues) {
  for (const test::StoreCase& c : test::fp8_extremes_grid()) expect_rope_store_matches_composition(c);
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
  const test::StoreCase c = test::deepseek_mla_case(500);
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
  // f64 data has no quantised q (it once wrote doubles into the 1-byte codes, past their end).
  test::StoreCase f64 = c;
  f64.dtype = f64.cache_dtype = DType::f64;
  test::StoreSetup s(f64);
  RopeStoreArgs args = s.store_args();
  Buffer codes(static_cast<size_t>(f64.tokens * f64.heads_q * 64), 0x5a);
  args.q_quantized = TensorView::bshd(codes.data(), DType::fp8_e4m3, 1, f64.tokens, f64.heads_q, 64);
  const Buffer q = s.q, kc = s.k_cache_bytes;
  try {
    rope_store(f64.schedule, args);
    ADD_FAILURE() << "no error for f64 data with q_quantized";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q_quantized.dtype=fp8_e4m3 takes f32, f16 or bf16 data, not f64"),
              std::string::npos) << e.what();
  }
  EXPECT_TRUE(s.q == q && s.k_cache_bytes == kc && codes == Buffer(codes.size(), 0x5a)) << "something was written";
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

// Gemma 4's v norm into v_out, whose layout need not be v's: v read from a fused QKV buffer (token
// stride (hq + 2 hk) d) into a contiguous v_out, and v contiguous into a head-major v_out
// [b, h, s, d]. v_out takes the reference's normed values at its own strides, nothing beyond them is
// written and v is left as it was, on every backend and thread count.
TEST(FusedQkNormRope, VNormIntoAVOutOfItsOwnLayout) {
  int seed = 4100;
  for (const DType dtype : {DType::bf16, DType::f32}) {
    for (const bool qkv_input : {true, false}) {
      test::NormCase c{.schedule = schedule_of(128, 128, Pairing::half), .dtype = dtype, .seed = ++seed};
      c.rounding = NormRounding::gemma;
      c.weight_offset = 1.0f;
      c.v_norm = true;
      c.tokens = 7;
      SCOPED_TRACE(c.name() + (qkv_input ? " v in a QKV buffer" : " head-major v_out"));
      const int64_t d = c.schedule.head_dim, hq = c.heads_q, hk = c.heads_k, es = size_of(dtype);
      const int64_t row = (hq + 2 * hk) * d;  // one token of the fused QKV buffer
      test::NormSetup base(c);
      Buffer want = base.v;  // [tokens, hk, d]
      base.reference_v_norm(want);
      for (const Backend backend : {Backend::reference, Backend::automatic}) {
        for (const int threads : {1, 2}) {
          test::NormSetup s(c);
          Buffer qkv(static_cast<size_t>(c.tokens * row * es), 0);
          TensorView v_in = s.view(s.v, hk);
          if (qkv_input) {  // v's heads after q's and k's in each token's row
            for (int64_t t = 0; t < c.tokens; ++t) {
              std::memcpy(qkv.data() + (t * row + (hq + hk) * d) * es, s.v.data() + t * hk * d * es,
                          static_cast<size_t>(hk * d * es));
            }
            v_in = TensorView{.data = qkv.data() + (hq + hk) * d * es, .dtype = dtype, .shape = {1, c.tokens, hk, d},
                              .strides = {c.tokens * row, row, d, 1}};
          }
          const Buffer qkv_before = qkv, v_before = s.v;
          const int64_t guard = 64;
          Buffer out(static_cast<size_t>((c.tokens * hk * d + 2 * guard) * es), 0x6b);
          unsigned char* out_data = out.data() + guard * es;
          const TensorView v_out = qkv_input ? TensorView::bshd(out_data, dtype, 1, c.tokens, hk, d)
                                             : TensorView{.data = out_data, .dtype = dtype, .shape = {1, c.tokens, hk, d},
                                                          .strides = {c.tokens * hk * d, d, c.tokens * d, 1}};  // [b, h, s, d]
          QkNormRopeArgs a = s.norm_args();
          a.rope.backend = backend;
          a.rope.threads = threads;
          a.v = v_in;
          a.v_out = v_out;
          qk_norm_rope(c.schedule, a);
          for (int64_t t = 0; t < c.tokens; ++t) {
            for (int64_t h = 0; h < hk; ++h) {
              const int64_t at = qkv_input ? (t * hk + h) * d : (h * c.tokens + t) * d;
              ASSERT_EQ(std::memcmp(out_data + at * es, want.data() + (t * hk + h) * d * es, static_cast<size_t>(d * es)), 0)
                  << "v_out token " << t << " head " << h << ", backend " << static_cast<int>(backend) << ", threads "
                  << threads;
            }
          }
          EXPECT_TRUE(std::all_of(out.begin(), out.begin() + guard * es, [](unsigned char b) { return b == 0x6b; }));
          EXPECT_TRUE(std::all_of(out.end() - guard * es, out.end(), [](unsigned char b) { return b == 0x6b; }));
          EXPECT_TRUE(qkv == qkv_before && s.v == v_before) << "v is read only";
        }
      }
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

using StoreEdit = std::function<void(test::StoreSetup&, RopeStoreArgs&)>;

// Each (message, edit): rope_store on fresh buffers of `c`, its arguments edited, is refused with an
// error containing `message`, and writes nothing.
void expect_store_refused(const test::StoreCase& c, const std::vector<std::pair<std::string, StoreEdit>>& cases) {
  for (const auto& [message, edit] : cases) {
    test::StoreSetup s(c);
    RopeStoreArgs args = s.store_args();
    edit(s, args);
    const Buffer q = s.q, k = s.k, v = s.v, kc = s.k_cache_bytes, vc = s.v_cache_bytes;
    try {
      rope_store(c.schedule, args);
      ADD_FAILURE() << "no error for " << message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
    EXPECT_TRUE(s.q == q && s.k == k && s.v == v && s.k_cache_bytes == kc && s.v_cache_bytes == vc)
        << message << ": something was written";
  }
}

// An output may be its own input exactly (in place), never another input: a k cache that is k
// itself, a v that is q, a k_out that is v, a v normed in place that is k. Each such call has no
// single right answer (the composition reads what the fused pass has already written), so each is
// refused, naming both, with nothing written. They were accepted once, with wrong values.
TEST(FusedAliasing, AnOutputThatIsAnotherInputIsRefused) {
  test::StoreCase c;
  c.schedule = schedule_of(64, 64, Pairing::half);
  c.heads_q = 2;  // q, k and v of one shape: any may stand for another
  c.tokens = 5;
  c.seed = 811;
  static std::vector<int64_t> identity_slots;
  const auto store_cases = std::vector<std::pair<std::string, StoreEdit>>{
      {"k_cache overlaps k", [](test::StoreSetup& s, RopeStoreArgs& a) {
         // A one-block cache whose rows are k's own: [1, tokens, heads, d] at k's address.
         a.cache.k_cache = CacheView::nhd(a.rope.k.data, s.c.cache_dtype, 1, s.c.tokens, s.c.heads_k, s.d);
         identity_slots.resize(static_cast<size_t>(s.c.tokens));
         std::iota(identity_slots.begin(), identity_slots.end(), 0);
         a.cache.slots = Slots::of(std::span<const int64_t>(identity_slots)); }},
      {"v_cache overlaps v", [](test::StoreSetup& s, RopeStoreArgs& a) {
         a.cache.v_cache = CacheView::nhd(a.cache.v.data, s.c.cache_dtype, 1, s.c.tokens, s.c.heads_k, s.d);
         identity_slots.resize(static_cast<size_t>(s.c.tokens));
         std::iota(identity_slots.begin(), identity_slots.end(), 0);
         a.cache.slots = Slots::of(std::span<const int64_t>(identity_slots)); }},
      {"q (in place) overlaps v", [](test::StoreSetup&, RopeStoreArgs& a) { a.cache.v = a.rope.q; }},
      {"k_out overlaps v", [](test::StoreSetup&, RopeStoreArgs& a) { a.rope.k_out = a.cache.v; }},
  };
  expect_store_refused(c, store_cases);
  // q_out that is q, k_out that is k: in place, taken.
  {
    test::StoreSetup s(c);
    RopeStoreArgs args = s.store_args();
    args.rope.q_out = args.rope.q;
    args.rope.k_out = args.rope.k;
    EXPECT_NO_THROW(rope_store(c.schedule, args));
  }
  test::NormCase n{.schedule = schedule_of(64, 64, Pairing::half), .dtype = DType::bf16, .seed = 812};
  n.heads_q = n.heads_k;
  const auto norm_cases = std::vector<std::pair<std::string, std::function<void(test::NormSetup&, QkNormRopeArgs&)>>>{
      {"k_cache overlaps k", [](test::NormSetup& s, QkNormRopeArgs& a) {  // k written in place and cached
         s.write = CacheWrite{.slots = Slots::of(std::span<const int64_t>(s.slots)),
                              .k_cache = CacheView::nhd(a.rope.k.data, s.c.dtype, 1, s.c.tokens, s.c.heads_k, s.d)};
         identity_slots.resize(static_cast<size_t>(s.c.tokens));
         std::iota(identity_slots.begin(), identity_slots.end(), 0);
         s.write.slots = Slots::of(std::span<const int64_t>(identity_slots));
         a.rope.k_out = a.rope.k;
         a.store = &s.write; }},
      {"v (in place) overlaps k", [](test::NormSetup&, QkNormRopeArgs& a) {  // v normed in place is k
         a.v = a.rope.k;
         a.v_norm = true; }},
      {"v (in place) overlaps q", [](test::NormSetup&, QkNormRopeArgs& a) {
         a.v = a.rope.q;
         a.v_norm = true; }},
  };
  for (const auto& [message, edit] : norm_cases) {
    test::NormSetup s(n);
    QkNormRopeArgs args = s.norm_args();
    edit(s, args);
    const Buffer q = s.q, k = s.k, v = s.v;
    try {
      qk_norm_rope(n.schedule, args);
      ADD_FAILURE() << "no error for " << message;
    } catch (const Error& e) {
      // Either order names the pair: the check meets it from whichever side comes first.
      const std::string what = e.what();
      EXPECT_TRUE(what.find(message) != std::string::npos || what.find("overlaps v (in place)") != std::string::npos)
          << what;
    }
    EXPECT_TRUE(s.q == q && s.k == k && s.v == v) << message << ": something was written";
  }
}

// rope_store reads k (its rotated rows go to the cache) unless k_out is set: a k whose tokens share
// one row (stride 0 over seq, an expanded tensor) is taken, and gives the bits of the same call on k
// written out token by token. Rotated in place (qk_norm_rope, or rope_store with k_out = k) it is
// refused: each element would be written more than once.
TEST(FusedAliasing, RopeStoreReadsAnExpandedK) {
  // `run(setup, expand)` on an expanded k (every token's row is token 0's, stride 0 over seq) and on
  // the same rows written out: the same bits, and k itself not written.
  const auto same_as_written_out = [](auto& expanded, auto& written_out, const auto& run) {
    const int64_t row = expanded.c.heads_k * expanded.d * static_cast<int64_t>(size_of(expanded.c.dtype));
    for (int64_t t = 1; t < expanded.c.tokens; ++t) {
      std::memcpy(written_out.k.data() + t * row, written_out.k.data(), static_cast<size_t>(row));
    }
    const Buffer k_before = expanded.k;
    run(expanded, true);
    run(written_out, false);
    EXPECT_TRUE(expanded.q == written_out.q);
    EXPECT_TRUE(expanded.k_cache_bytes == written_out.k_cache_bytes);
    EXPECT_TRUE(expanded.v_cache_bytes == written_out.v_cache_bytes);
    EXPECT_TRUE(expanded.k == k_before) << "k was written";
  };
  test::StoreCase c;
  c.schedule = schedule_of(64, 64, Pairing::half);
  c.tokens = 6;
  c.seed = 813;
  test::StoreSetup store_expanded(c), store_written_out(c);
  same_as_written_out(store_expanded, store_written_out, [&](test::StoreSetup& s, bool expand) {
    RopeStoreArgs a = s.store_args();
    if (expand) a.rope.k.strides[1] = 0;
    rope_store(c.schedule, a);
  });
  // qk_norm_rope with a cache write reads k the same way (k_out unset).
  test::NormCase n{.schedule = schedule_of(64, 64, Pairing::half), .dtype = DType::bf16, .seed = 814};
  n.store = true;
  test::NormSetup norm_expanded(n), norm_written_out(n);
  same_as_written_out(norm_expanded, norm_written_out, [&](test::NormSetup& s, bool expand) {
    QkNormRopeArgs a = s.norm_args();
    if (expand) a.rope.k.strides[1] = 0;
    qk_norm_rope(n.schedule, a);
  });
  test::StoreSetup s(c);
  RopeStoreArgs a = s.store_args();
  a.rope.k.strides[1] = 0;
  a.rope.k_out = a.rope.k;  // written in place: refused
  try {
    rope_store(c.schedule, a);
    ADD_FAILURE() << "an expanded k written in place was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k (in place) strides [768, 0, 64, 1] make elements overlap"),
              std::string::npos)
        << e.what();
  }
}

// What the rows read as they go besides q, k and v (slots, positions, scales, norm weights, deltas)
// may not lie in memory a call writes: a later token would read what an earlier one wrote (a slot
// sending keys out of bounds, a position turning by another angle). Each call below places such an
// array, with valid values, inside an output; each is refused naming both, nothing written.
TEST(FusedAliasing, WhatTheRowsReadMayNotLieInAnOutput) {
  test::StoreCase c;
  c.schedule = schedule_of(64, 64, Pairing::half);
  c.dtype = DType::f32;
  c.cache_dtype = DType::fp8_e4m3;
  c.scaled = true;
  c.tokens = 5;
  c.seed = 815;
  // place(into, array): the array's bytes copied to the start of `into`, returning where they lie.
  const auto place = [](Buffer& into, const auto& array) {
    const size_t bytes = array.size() * sizeof(array[0]);
    EXPECT_LE(bytes, into.size());
    std::memcpy(into.data(), array.data(), bytes);
    return reinterpret_cast<const std::remove_cvref_t<decltype(array[0])>*>(into.data());
  };
  const auto store_cases = std::vector<std::pair<std::string, StoreEdit>>{
      {"k_cache overlaps slots", [&](test::StoreSetup& s, RopeStoreArgs& a) {
         a.cache.slots = Slots::of(std::span<const int64_t>(place(s.k_cache_bytes, s.slots), s.slots.size())); }},
      {"v_cache overlaps v_quant.scale", [&](test::StoreSetup& s, RopeStoreArgs& a) {
         a.cache.v_quant.scale = place(s.v_cache_bytes, s.v_scales); }},
      {"q (in place) overlaps k_quant.scale", [&](test::StoreSetup& s, RopeStoreArgs& a) {
         a.cache.k_quant.scale = place(s.q, s.k_scales); }},
      {"q (in place) overlaps positions", [&](test::StoreSetup& s, RopeStoreArgs& a) {
         a.rope.positions = Positions::per_token(std::span<const int64_t>(place(s.q, s.positions), s.positions.size())); }},
      {"k_cache overlaps positions", [&](test::StoreSetup& s, RopeStoreArgs& a) {
         a.rope.positions =
             Positions::per_token(std::span<const int64_t>(place(s.k_cache_bytes, s.positions), s.positions.size())); }},
  };
  expect_store_refused(c, store_cases);
  // qk_norm_rope: a weight inside k, written in place.
  {
    test::NormCase n{.schedule = schedule_of(64, 64, Pairing::half), .dtype = DType::f32, .seed = 816};
    n.rounding = NormRounding::gemma;  // f32 weights
    test::NormSetup s(n);
    QkNormRopeArgs a = s.norm_args();
    std::vector<unsigned char> weight(s.q_weight.begin(), s.q_weight.end());
    a.q_weight.data = place(s.k, weight);
    const Buffer q = s.q, k = s.k;
    try {
      qk_norm_rope(n.schedule, a);
      ADD_FAILURE() << "no error for a q_weight inside k";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("k (in place) overlaps q_weight"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(s.q == q && s.k == k) << "something was written";
  }
  // rerotate_cache: deltas inside the cache moved in place, raw positions inside `out`.
  {
    test::StoreSetup s(c);
    std::vector<int64_t> deltas(s.slots.size(), 7);
    RerotateCacheArgs r{.cache = s.k_cache, .slots = Slots::of(std::span<const int64_t>(s.slots)),
                        .delta = place(s.k_cache_bytes, deltas), .quant = s.k_quant};
    const Buffer kc = s.k_cache_bytes;
    try {
      rerotate_cache(c.schedule, r);
      ADD_FAILURE() << "no error for deltas inside the cache";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cache (in place) overlaps delta"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(s.k_cache_bytes == kc) << "the cache was written";
    Buffer out_bytes(s.k_cache_bytes.size(), 0x5a);
    RerotateCacheArgs raw{.cache = s.k_cache, .slots = Slots::of(std::span<const int64_t>(s.slots)),
                          .mode = RerotateMode::raw, .quant = s.k_quant};
    raw.out = s.k_cache;
    raw.out.data = out_bytes.data();
    raw.positions = Positions::per_token(std::span<const int64_t>(place(out_bytes, s.positions), s.positions.size()));
    const Buffer out_before = out_bytes;
    try {
      rerotate_cache(c.schedule, raw);
      ADD_FAILURE() << "no error for raw positions inside out";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("out overlaps positions"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(out_bytes == out_before && s.k_cache_bytes == kc) << "something was written";
  }
  // apply itself: per-token positions inside k, rotated in place.
  {
    test::StoreSetup s(c);
    ApplyArgs a = s.rope_args();
    a.positions = Positions::per_token(std::span<const int64_t>(place(s.k, s.positions), s.positions.size()));
    const Buffer q = s.q, k = s.k;
    try {
      apply(c.schedule, a);
      ADD_FAILURE() << "no error for positions inside k";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("k (in place) overlaps positions"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(s.q == q && s.k == k) << "something was written";
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

// One move of quantised keys: each value lands within half a code step of the exact rotation (long
// double, angle Δ·10000^(-2j/d) written out here) of its dequantised pair, as the docs state (e4m3
// 2^-4 relative, e5m2 2^-3, int8 half a unit), beyond which only saturation goes (int8: ±127).
TEST(FusedRerotateCache, RequantisationAddsAtMostHalfACodeStepPerMove) {
  for (const DType cache : {DType::fp8_e4m3, DType::fp8_e5m2, DType::i8}) {
    SCOPED_TRACE(to_string(cache));
    test::RerotateCase c;
    c.schedule = schedule_of(64, 64, Pairing::half);
    c.cache_dtype = cache;
    c.tokens = 30;
    c.seed = 1300 + static_cast<int>(cache);
    test::RerotateSetup s(c);
    const Buffer before = s.cache_bytes;
    rerotate_cache(c.schedule, s.args());
    const auto code_value = [&](const Buffer& b, int64_t i) -> long double {
      if (cache == DType::i8) return static_cast<int8_t>(b[static_cast<size_t>(i)]);
      return test::oracle_fp8_value(b[static_cast<size_t>(i)], cache == DType::fp8_e4m3);
    };
    const auto half_step = [&](long double v) -> long double {  // in code units, at |v|
      if (cache == DType::i8) return 0.5L;
      const int e = v == 0 ? -100 : std::ilogb(static_cast<double>(v));
      return cache == DType::fp8_e4m3 ? std::ldexp(1.0L, std::max(e, -6) - 4) : std::ldexp(1.0L, std::max(e, -14) - 3);
    };
    long double worst = 0;  // the largest error seen, in half steps
    int64_t saturated = 0;
    for (size_t t = 0; t < s.slots.size(); ++t) {
      const int64_t slot = s.slots[t];
      if (slot < 0) continue;
      for (int64_t h = 0; h < c.heads; ++h) {
        for (int64_t j = 0; j < 32; ++j) {
          const int64_t ia = test::cache_element(s.cache, slot, h, j), ib = test::cache_element(s.cache, slot, h, j + 32);
          const long double x = code_value(before, ia) * s.scale, y = code_value(before, ib) * s.scale;
          const long double angle = static_cast<long double>(s.delta[t]) * std::pow(10000.0L, -2.0L * j / 64.0L);
          const long double ideal[2] = {x * std::cos(angle) - y * std::sin(angle), x * std::sin(angle) + y * std::cos(angle)};
          const int64_t at[2] = {ia, ib};
          for (int side = 0; side < 2; ++side) {
            const long double want = ideal[side] / s.scale, got = code_value(s.cache_bytes, at[side]);
            if (cache == DType::i8 && std::fabs(want) > 127.5L) {
              EXPECT_EQ(std::fabs(got), 127.0L) << "saturated at " << at[side];
              ++saturated;
              continue;
            }
            const long double error = std::fabs(got - want), bound = half_step(std::fabs(want));
            EXPECT_LE(error, bound + 1e-5L * (std::fabs(x) + std::fabs(y)) / s.scale)
                << "at " << at[side] << ": code value " << got << ", exact " << want;
            worst = std::max(worst, error / bound);
          }
        }
      }
    }
    EXPECT_GT(worst, 0.9L) << "the bound is tight: some value errs by nearly half a step";
    static_cast<void>(saturated);  // int8 codes of N(0, 40) pairs: a few rotate beyond ±127
  }
}

// CacheView's layouts against their formulas written out: v (copied unchanged into v_cache) lands
// at (slot / bs)·s_block + (slot % bs)·s_token + h·s_head + offset + d with the strides of
// [num_blocks, block_size, heads, row] (NHD) or [num_blocks, heads, block_size, row] (HND).
TEST(FusedRopeStore, CacheViewsAddressTheirLayoutsElementForElement) {
  const int64_t tokens = 5, heads = 3, d = 8, blocks = 4, bs = 4, row = 13, offset = 2;
  const Schedule schedule = make_schedule(Spec{.head_dim = d});
  for (const bool hnd : {false, true}) {
    SCOPED_TRACE(hnd ? "HND" : "NHD");
    std::vector<float> q(static_cast<size_t>(tokens * heads * d), 1.0f), k = q, v(q.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i + 1);
    std::vector<float> k_mem(static_cast<size_t>(blocks * bs * heads * row), -1.0f), v_mem = k_mem;
    const std::vector<int64_t> slots = {9, 0, 15, -1, 6};
    RopeStoreArgs a;
    a.rope.q = TensorView::bshd(q.data(), DType::f32, 1, tokens, heads, d);
    a.rope.k = TensorView::bshd(k.data(), DType::f32, 1, tokens, heads, d);
    a.cache.slots = Slots::of(std::span<const int64_t>(slots));
    const auto view = hnd ? &CacheView::hnd : &CacheView::nhd;
    a.cache.k_cache = view(k_mem.data(), DType::f32, blocks, bs, heads, d, offset, row);
    a.cache.v_cache = view(v_mem.data(), DType::f32, blocks, bs, heads, d, offset, row);
    a.cache.v = TensorView::bshd(v.data(), DType::f32, 1, tokens, heads, d);
    rope_store(schedule, a);
    std::vector<float> want(v_mem.size(), -1.0f);
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t slot = slots[static_cast<size_t>(t)];
      if (slot < 0) continue;
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t e = 0; e < d; ++e) {
          const int64_t at = hnd ? (slot / bs) * heads * bs * row + h * bs * row + (slot % bs) * row + offset + e
                                 : (slot / bs) * bs * heads * row + (slot % bs) * heads * row + h * row + offset + e;
          want[static_cast<size_t>(at)] = v[static_cast<size_t>((t * heads + h) * d + e)];
        }
      }
    }
    EXPECT_TRUE(want == v_mem);
    for (size_t i = 0; i < k_mem.size(); ++i) {
      EXPECT_EQ(k_mem[i] == -1.0f, want[i] == -1.0f) << "k_cache's written elements are v_cache's, at " << i;
    }
  }
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
  // Delta mode turns by exact angles of the deltas: angles for raw keys are refused, not ignored.
  a.numerics = AngleMode::hf_float32;
  EXPECT_ROTARY_ERROR(rerotate_cache(c.schedule, a), "numerics=hf_float32 is for raw mode");
  a = s.args();
  const Table table = Table::range(c.schedule, 0, 16);
  a.table = &table;
  EXPECT_ROTARY_ERROR(rerotate_cache(c.schedule, a), "table is for raw mode");
  EXPECT_TRUE(before == s.cache_bytes);
}


// ---- the vectorised CPU rows (src/fused/cpu_rows.cpp) against the per-token body ----
//
// Backend::reference runs the body (body.hpp: what CUDA runs); the default backend the rows. Inputs
// carry NaNs (quiet and signalling, with payloads), infinities, signed zeros and subnormals: every
// output and cache element must agree bit for bit, with odd token counts and every thread count,
// except that a NaN the arithmetic made may differ in sign and payload (which operand's NaN an
// instruction propagates is the instruction's, as between CPU and GPU): NaN compares as NaN.

namespace rows {

// Overwrites about one element in eleven of `b` (elements of `dtype`) with a special value.
void add_specials(Buffer& b, DType dtype, std::mt19937& rng) {
  const int64_t es = size_of(dtype);
  const int64_t n = static_cast<int64_t>(b.size()) / es;
  const std::vector<uint32_t> f32 = {0x7fc00001u, 0x7f800001u, 0xff812345u, 0x7f800000u, 0xff800000u,
                                     0x80000000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu};
  const std::vector<uint16_t> f16 = {0x7e01, 0x7c01, 0xfd55, 0x7c00, 0xfc00, 0x8000, 0x0001, 0x83ff, 0x7bff};
  const std::vector<uint16_t> bf16 = {0x7fc1, 0x7f81, 0xff95, 0x7f80, 0xff80, 0x8000, 0x0001, 0x807f, 0x7f7f};
  std::uniform_int_distribution<int64_t> pick(0, 10);
  for (int64_t i = 0; i < n; ++i) {
    if (pick(rng) != 0) continue;
    const auto which = static_cast<size_t>(pick(rng) % 9);
    unsigned char* at = b.data() + i * es;
    if (dtype == DType::f32) {
      std::memcpy(at, &f32[which], 4);
    } else {
      std::memcpy(at, dtype == DType::f16 ? &f16[which] : &bf16[which], 2);
    }
  }
}

struct Output {
  Buffer bytes;
  DType dtype;
};

std::vector<Output> run_store(const test::StoreCase& c, Backend backend, int threads) {
  test::StoreSetup s(c);
  std::mt19937 rng(static_cast<uint32_t>(c.seed) + 77);
  add_specials(s.q, c.dtype, rng);
  add_specials(s.k, c.dtype, rng);
  add_specials(s.v, c.dtype, rng);
  if (!s.k_pass.empty()) add_specials(s.k_pass, c.dtype, rng);
  RopeStoreArgs args = s.store_args();
  args.rope.backend = backend;
  args.rope.threads = threads;
  Buffer k_out(s.k.size());
  args.rope.k_out = s.view(k_out, c.heads_k);
  rope_store(c.schedule, args);
  return {{s.q, c.dtype}, {k_out, c.dtype}, {s.k_cache_bytes, c.cache_dtype}, {s.v_cache_bytes, c.cache_dtype}};
}

// specials: seed the inputs with NaNs, infinities, signed zeros and subnormals (which leave few heads
// with a finite sum of squares: the plain inputs test the sums themselves).
std::vector<Output> run_norm(const test::NormCase& c, Backend backend, int threads, bool specials = true) {
  test::NormSetup s(c);
  std::mt19937 rng(static_cast<uint32_t>(c.seed) + 78);
  if (specials) {
    add_specials(s.q, c.dtype, rng);
    add_specials(s.k, c.dtype, rng);
    add_specials(s.v, c.dtype, rng);
  }
  QkNormRopeArgs args = s.norm_args();
  args.rope.backend = backend;
  args.rope.threads = threads;
  qk_norm_rope(c.schedule, args);
  return {{s.q, c.dtype}, {s.k, c.dtype}, {s.v, c.dtype}, {s.k_cache_bytes, c.dtype}, {s.v_cache_bytes, c.dtype}};
}

// The first element that differs (NaN = NaN), or "none".
std::string difference(const Output& a, const Output& b) {
  if (a.bytes.size() != b.bytes.size()) return "sizes differ";
  const int64_t es = size_of(a.dtype);
  for (int64_t i = 0; i < static_cast<int64_t>(a.bytes.size()) / es; ++i) {
    if (std::memcmp(a.bytes.data() + i * es, b.bytes.data() + i * es, static_cast<size_t>(es)) == 0) continue;
    const float x = test::load_value(a.dtype, a.bytes.data(), i);
    const float y = test::load_value(b.dtype, b.bytes.data(), i);
    if (std::isnan(x) && std::isnan(y)) continue;
    return fmt::format("element {}: {} vs {}", i, x, y);
  }
  return "none";
}

void expect_same(const std::vector<Output>& body, const std::vector<Output>& fast, const std::string& name) {
  ASSERT_EQ(body.size(), fast.size());
  for (size_t i = 0; i < body.size(); ++i) EXPECT_EQ(difference(body[i], fast[i]), "none") << name << " output " << i;
}

}  // namespace rows

void expect_rope_store_rows_equal_the_body() {
  int seed = 5000;
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (const DType cache : {dtype, DType::fp8_e4m3, DType::fp8_e5m2, DType::i8, DType::f32}) {
      for (const auto& [d, r, off, pairing] : {std::tuple{128, 128, 0, Pairing::half},
                                                std::tuple{96, 32, 16, Pairing::interleaved},
                                                std::tuple{80, 80, 0, Pairing::interleaved},
                                                std::tuple{64, 48, 8, Pairing::half}}) {
        test::StoreCase c;
        c.schedule = schedule_of(d, r, pairing, off);
        c.dtype = dtype;
        c.cache_dtype = cache;
        c.scaled = is_quantised_dtype(cache);
        c.per_head_scale = seed % 2 == 0;
        c.mode = seed % 3 == 0 ? ScaleMode::multiply : ScaleMode::divide;
        c.layout = seed % 2 == 0 ? Layout::nhd : Layout::hnd;
        c.tokens = 13;
        c.seed = ++seed;
        const auto body = rows::run_store(c, Backend::reference, 1);
        for (const int threads : {1, 2}) rows::expect_same(body, rows::run_store(c, Backend::automatic, threads), c.name());
      }
    }
  }
}
TEST(FusedRows, RopeStoreEqualsTheBodyWithNaNsInfinitiesAndSubnormals) { expect_rope_store_rows_equal_the_body(); }

void expect_rope_store_streams_and_sources_equal_the_body() {
  int seed = 5100;
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    test::StoreCase mrope;
    mrope.schedule = make_schedule(Spec{.head_dim = 128, .stream_layout = StreamLayout::sections, .sections = {16, 24, 24}});
    mrope.mrope = true;
    mrope.dtype = mrope.cache_dtype = dtype;
    mrope.seed = ++seed;
    rows::expect_same(rows::run_store(mrope, Backend::reference, 1), rows::run_store(mrope, Backend::automatic, 0),
                      mrope.name());
    for (const test::AngleSource source : {test::AngleSource::table, test::AngleSource::caller, test::AngleSource::hf_float32}) {
      test::StoreCase c;
      c.schedule = schedule_of(64, 64, Pairing::half);
      c.source = source;
      c.dtype = c.cache_dtype = dtype;
      c.tokens = 7;
      c.seed = ++seed;
      rows::expect_same(rows::run_store(c, Backend::reference, 1), rows::run_store(c, Backend::automatic, 0), c.name());
    }
    test::StoreCase xpos;
    xpos.schedule = make_schedule(Spec{.head_dim = 64, .xpos_scale_base = 512.0});
    xpos.dtype = xpos.cache_dtype = dtype;
    xpos.seed = ++seed;
    rows::expect_same(rows::run_store(xpos, Backend::reference, 1), rows::run_store(xpos, Backend::automatic, 0),
                      xpos.name());
    test::StoreCase mla;
    mla.schedule = schedule_of(64, 64, Pairing::interleaved);
    mla.layout = Layout::mla;
    mla.pass_dim = 96;
    mla.heads_k = 1;
    mla.dtype = mla.cache_dtype = dtype;
    mla.seed = ++seed;
    rows::expect_same(rows::run_store(mla, Backend::reference, 1), rows::run_store(mla, Backend::automatic, 0),
                      mla.name());
  }
}
TEST(FusedRows, RopeStoreWithMropeXposCallerAnglesAndMlaEqualsTheBody) { expect_rope_store_streams_and_sources_equal_the_body(); }

void expect_qk_norm_rope_rows_equal_the_body() {
  int seed = 5200;
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (const NormOrder order : {NormOrder::norm_then_rope, NormOrder::rope_then_norm}) {
      for (const NormRounding rounding : {NormRounding::llama, NormRounding::gemma}) {
        for (const NormScope scope : {NormScope::head, NormScope::all_heads}) {
          test::NormCase c{.schedule = schedule_of(seed % 2 == 0 ? 128 : 96, 64, Pairing::half, 16), .dtype = dtype,
                           .seed = ++seed};
          c.order = order;
          c.rounding = rounding;
          c.scope = scope;
          c.heads_q = 7;  // not a multiple of the four sums side by side
          c.weight_offset = rounding == NormRounding::gemma ? 1.0f : 0.0f;
          c.weights = seed % 3 != 0;
          c.v_norm = seed % 2 == 0;
          c.store = seed % 4 < 2;
          c.tokens = 11;
          const auto body = rows::run_norm(c, Backend::reference, 1);
          for (const int threads : {1, 2}) rows::expect_same(body, rows::run_norm(c, Backend::automatic, threads), c.name());
        }
      }
    }
  }
}
TEST(FusedRows, QkNormRopeEqualsTheBodyInEveryOrderRoundingAndScope) { expect_qk_norm_rope_rows_equal_the_body(); }

// The caller's float32 weights may hold NaNs with payload bits anywhere: the bf16 norm rows round
// them NaN-safely, so such a weight gives NaN where the body gives NaN (a NaN of 0x7fffffff once came
// out of the vector rows as -0.0), in both roundings, with and without weight_offset.
TEST(FusedRows, QkNormRopeNaNWeightsWithPayloadBitsGiveNaN) {
  const uint32_t nans[] = {0x7fffffffu, 0xffffffffu, 0x7f800001u, 0x7fc08001u, 0xffc0ffffu};
  int seed = 5700;
  for (const NormRounding rounding : {NormRounding::llama, NormRounding::gemma}) {
    for (const float offset : {0.0f, 1.0f}) {
      test::NormCase c{.schedule = schedule_of(128, 128, Pairing::half), .dtype = DType::bf16, .seed = ++seed};
      c.rounding = rounding;
      c.weight_offset = offset;
      const auto run = [&](Backend backend) {
        test::NormSetup s(c);
        std::mt19937 rng(static_cast<uint32_t>(c.seed));
        s.weight_dtype = DType::f32;  // float32 weights in both roundings, a quarter of them NaNs
        for (Buffer* w : {&s.q_weight, &s.k_weight}) {
          w->assign(128 * 4, 0);
          for (size_t i = 0; i < 128; ++i) {
            const float value = 0.5f + static_cast<float>(rng() % 100) / 100.0f;
            std::memcpy(w->data() + 4 * i, &value, 4);
            if (rng() % 4 == 0) std::memcpy(w->data() + 4 * i, &nans[rng() % std::size(nans)], 4);
          }
        }
        QkNormRopeArgs args = s.norm_args();
        args.rope.backend = backend;
        qk_norm_rope(c.schedule, args);
        return std::vector<rows::Output>{{s.q, c.dtype}, {s.k, c.dtype}};
      };
      const auto body = run(Backend::reference);
      const auto fast = run(Backend::automatic);
      rows::expect_same(body, fast, c.name());
      int64_t nan_outputs = 0;
      for (const auto& out : body) {
        for (int64_t i = 0; i < static_cast<int64_t>(out.bytes.size()) / 2; ++i) {
          nan_outputs += std::isnan(test::load_value(out.dtype, out.bytes.data(), i));
        }
      }
      EXPECT_GT(nan_outputs, 0) << c.name();
    }
  }
}

// Many heads: the head-scope sums run as transposed blocks of as many heads as a vector has double
// lanes (four, two and one block side by side), with channels after the last whole block and heads
// after the last block summed one by one; 59 and 13 heads and 98 channels leave each part some work
// on every target.
void expect_many_heads_equal_the_body(int seed) {
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (const NormOrder order : {NormOrder::norm_then_rope, NormOrder::rope_then_norm}) {
      for (const int64_t d : {98, 128}) {
        test::NormCase c{.schedule = schedule_of(d, 64, Pairing::half, d == 98 ? 16 : 0), .dtype = dtype, .seed = ++seed};
        c.order = order;
        c.heads_q = 59;
        c.heads_k = 13;
        c.tokens = 3;
        c.store = seed % 2 == 0;
        for (const bool specials : {false, true}) {
          rows::expect_same(rows::run_norm(c, Backend::reference, 1, specials),
                            rows::run_norm(c, Backend::automatic, 1, specials),
                            c.name() + (specials ? " specials" : " plain"));
        }
      }
    }
  }
}

TEST(FusedRows, QkNormRopeWithManyHeadsEqualsTheBody) { expect_many_heads_equal_the_body(5400); }

// norm_then_rope with rows of contiguous channels and one slice normalises inside apply's rows
// (cpu_rows.cpp's one_pass_norm: each value normalised as the rotation loads it, the channels beside
// the slice normalised alone): the body's bits in every layout those rows read. Both pairings;
// slices whose pairs fill the vector blocks or leave a scalar tail on every target (19 and 35 pairs),
// at odd offsets too; channels beside the slice before and after it; every rounding, without weights,
// with f32 weights and weights in the data's dtype; head and all-heads scope, each in place, out of
// place (q_out, k_out: the inputs unchanged) and with k written only to its cache; exact angles, a
// table, the caller's cos/sin, hf_float32 and xPos; contiguous rows and rows with padded head and
// token strides (the gaps must keep their poison); plain inputs, and inputs with NaNs, infinities
// and subnormals (which leave most heads an infinite or NaN sum); calls of one thread and
// prefill-sized calls on two. Every such call is counted as one pass. The layouts it does not serve
// (channels with a stride, block_half, rope_then_norm) are not, and still give the body's bits.
namespace one_pass {

enum class Placement { in_place, out_of_place, k_to_cache_only };
enum class Rows { contiguous, padded, channel_strided };

struct Options {
  Placement placement = Placement::in_place;
  bool specials = true;  // most heads then have an infinite or NaN sum: plain inputs test the rest
  bool f32_weights = false;
  test::AngleSource source = test::AngleSource::exact;
  Rows rows = Rows::contiguous;
};

// b ([tokens, heads, d] contiguous) copied into a buffer of 0x5a bytes laid out as `rows` says.
struct LaidOut {
  Buffer bytes;
  TensorView view;
};
LaidOut lay_out(const Buffer& b, DType dtype, int64_t tokens, int64_t heads, int64_t d, Rows rows) {
  const int64_t es = size_of(dtype);
  const int64_t step = rows == Rows::channel_strided ? 2 : 1;
  const int64_t head_stride = rows == Rows::contiguous ? d : rows == Rows::padded ? d + 8 : 2 * d + 2;
  const int64_t token_stride = rows == Rows::contiguous ? heads * d : heads * head_stride + 16;
  LaidOut out{Buffer(static_cast<size_t>(tokens * token_stride * es), 0x5a), {}};
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t c = 0; c < d; ++c) {
        std::memcpy(out.bytes.data() + (t * token_stride + h * head_stride + c * step) * es,
                    b.data() + ((t * heads + h) * d + c) * es, static_cast<size_t>(es));
      }
    }
  }
  out.view = TensorView{.data = out.bytes.data(), .dtype = dtype, .shape = {1, tokens, heads, d},
                        .strides = {tokens * token_stride, token_stride, head_stride, step}};
  return out;
}

std::vector<rows::Output> run(const test::NormCase& c, const Options& o, Backend backend, int threads) {
  test::NormSetup s(c);
  std::mt19937 rng(static_cast<uint32_t>(c.seed) + 79);
  if (o.specials) {
    rows::add_specials(s.q, c.dtype, rng);
    rows::add_specials(s.k, c.dtype, rng);
    rows::add_specials(s.v, c.dtype, rng);
  }
  if (o.f32_weights) {
    s.weight_dtype = DType::f32;
    s.q_weight = test::random_values(DType::f32, static_cast<int64_t>(s.q_weight.size()) / size_of(c.dtype), rng, 1.0f);
    s.k_weight = test::random_values(DType::f32, static_cast<int64_t>(s.k_weight.size()) / size_of(c.dtype), rng, 1.0f);
  }
  if (o.source != test::AngleSource::exact || c.schedule.xpos()) {
    for (int64_t& p : s.positions) p %= 2048;  // the table's and the caller's rows
  }
  QkNormRopeArgs a = s.norm_args();
  a.rope.backend = backend;
  a.rope.threads = threads;
  const Table table = Table::range(c.schedule, 0, 2048);
  const int64_t width = c.schedule.rotary_dim / 2;
  std::vector<float> cos(static_cast<size_t>(2048 * width)), sin(cos.size());
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (float& x : cos) x = unit(rng);
  for (float& x : sin) x = unit(rng);
  const CallerAngles caller{.index = CallerAngles::Index::per_position, .columns = CallerAngles::Columns::pairs,
                            .cos = cos.data(), .sin = sin.data(), .shape = {1, 2048, width},
                            .cos_strides = {0, width, 1}, .sin_strides = {0, width, 1}};
  if (o.source == test::AngleSource::table) a.rope.table = &table;
  if (o.source == test::AngleSource::caller) a.rope.caller_angles = &caller;
  if (o.source == test::AngleSource::hf_float32) a.rope.numerics = AngleMode::hf_float32;
  const int64_t d = c.schedule.head_dim;
  LaidOut q = lay_out(s.q, c.dtype, c.tokens, c.heads_q, d, o.rows);
  LaidOut k = lay_out(s.k, c.dtype, c.tokens, c.heads_k, d, o.rows);
  LaidOut q_out = lay_out(Buffer(s.q.size(), 0x5a), c.dtype, c.tokens, c.heads_q, d, o.rows);
  LaidOut k_out = lay_out(Buffer(s.k.size(), 0x5a), c.dtype, c.tokens, c.heads_k, d, o.rows);
  a.rope.q = q.view;
  a.rope.k = k.view;
  if (o.placement == Placement::out_of_place) {
    a.rope.q_out = q_out.view;
    a.rope.k_out = k_out.view;
  }
  qk_norm_rope(c.schedule, a);
  return {{q.bytes, c.dtype}, {k.bytes, c.dtype}, {q_out.bytes, c.dtype}, {k_out.bytes, c.dtype}, {s.v, c.dtype},
          {s.k_cache_bytes, c.dtype}, {s.v_cache_bytes, c.dtype}};
}

struct Shape {
  int64_t d, r, offset;
  Pairing pairing;
  bool xpos = false;
};

// Each shape in each placement; the other options cycle with the seed (scope, rows and the angle
// source per shape, so that every placement meets each). tokens and threads: the calls' size and the
// teams asked for.
void expect_equal_the_body(int seed, const std::vector<Shape>& shapes, const std::vector<DType>& dtypes,
                           int64_t tokens = 6, std::vector<int> thread_counts = {1, 2}, Rows only_rows = Rows::contiguous,
                           bool cycle_rows = true, NormOrder order = NormOrder::norm_then_rope) {
  const test::AngleSource sources[] = {test::AngleSource::exact, test::AngleSource::table, test::AngleSource::caller,
                                       test::AngleSource::hf_float32};
  int shape_index = 0;
  for (const DType dtype : dtypes) {
    for (const Shape& shape : shapes) {
      ++shape_index;
      for (const Placement placement : {Placement::in_place, Placement::out_of_place, Placement::k_to_cache_only}) {
        ++seed;
        const Schedule schedule =
            shape.xpos ? make_schedule(Spec{.head_dim = shape.d, .rotary_dim = shape.r, .pairing = shape.pairing,
                                            .rotary_offset = shape.offset, .xpos_scale_base = 512.0})
                       : schedule_of(shape.d, shape.r, shape.pairing, shape.offset);
        test::NormCase c{.schedule = schedule, .dtype = dtype, .seed = seed};
        c.order = order;
        c.rounding = seed % 2 == 0 ? NormRounding::llama : NormRounding::gemma;
        c.weight_offset = c.rounding == NormRounding::gemma && seed % 4 == 1 ? 1.0f : 0.0f;
        c.scope = shape_index % 2 == 0 ? NormScope::all_heads : NormScope::head;
        c.weights = seed % 5 != 0;
        c.v_norm = seed % 2 == 1;
        c.store = placement == Placement::k_to_cache_only || (placement == Placement::out_of_place && seed % 2 == 0);
        c.heads_q = tokens > 6 ? 16 : 5;
        c.heads_k = tokens > 6 ? 4 : 3;
        c.tokens = tokens;
        Options o{.placement = placement,
                  .f32_weights = c.weights && c.rounding == NormRounding::llama && seed % 4 == 2,
                  .source = shape.xpos ? test::AngleSource::exact : sources[shape_index % 4],
                  .rows = cycle_rows && shape_index % 3 == 1 ? Rows::padded : only_rows};
        for (const bool specials : {false, true}) {
          o.specials = specials;
          const std::string name =
              fmt::format("{} placement {} specials {} f32 weights {} source {} rows {}", c.name(),
                          static_cast<int>(placement), specials, o.f32_weights, static_cast<int>(o.source),
                          static_cast<int>(o.rows));
          const auto body = run(c, o, Backend::reference, 1);
          for (const int threads : thread_counts) {
            const int64_t before = detail::one_pass_norm_call_count();
            rows::expect_same(body, run(c, o, Backend::automatic, threads), name);
            const bool one = o.rows != Rows::channel_strided && order == NormOrder::norm_then_rope;
            EXPECT_EQ(detail::one_pass_norm_call_count() - before, one ? 1 : 0)
                << name << " threads " << threads;
          }
        }
      }
    }
  }
}

}  // namespace one_pass

TEST(FusedRows, QkNormRopeInOnePassEqualsTheBody) {
  one_pass::expect_equal_the_body(5800,
                                  {{128, 128, 0, Pairing::half},
                                   {128, 128, 0, Pairing::interleaved},
                                   {80, 80, 0, Pairing::half},
                                   {96, 38, 3, Pairing::interleaved},
                                   {128, 70, 0, Pairing::half},
                                   {76, 38, 1, Pairing::half},
                                   {98, 64, 16, Pairing::half},
                                   {96, 48, 40, Pairing::interleaved},
                                   {200, 64, 8, Pairing::half},
                                   {64, 64, 0, Pairing::half, true},
                                   {96, 70, 17, Pairing::interleaved, true}},
                                  {DType::bf16, DType::f16, DType::f32});
}

// M-RoPE (Qwen3-VL's sections, half and interleaved pairing): three position streams per token, the
// rows' angles per pair from its stream; the one pass serves it as any angle row.
TEST(FusedRows, QkNormRopeInOnePassWithMropeEqualsTheBody) {
  int seed = 5880;
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (const Pairing pairing : {Pairing::half, Pairing::interleaved}) {
      test::NormCase c{.schedule = make_schedule(Spec{.head_dim = 128, .pairing = pairing,
                                                      .stream_layout = StreamLayout::sections,
                                                      .sections = {16, 24, 24}}),
                       .dtype = dtype, .seed = ++seed};
      c.mrope = true;
      c.scope = seed % 2 == 0 ? NormScope::head : NormScope::all_heads;
      for (const bool specials : {false, true}) {
        const auto body = rows::run_norm(c, Backend::reference, 1, specials);
        const int64_t before = detail::one_pass_norm_call_count();
        rows::expect_same(body, rows::run_norm(c, Backend::automatic, 1, specials), c.name());
        EXPECT_EQ(detail::one_pass_norm_call_count() - before, 1) << c.name();
      }
    }
  }
}

// Calls of 60 tokens of 16 q and 4 k heads move more than the 512 KiB that two threads take
// (fused.cpp's team_size: one per 256 KiB; all but the bf16 96-channel calls), so two threads each run
// their own rows' scratch and norms.
TEST(FusedRows, QkNormRopeInOnePassOnTwoThreadsEqualsTheBody) {
  one_pass::expect_equal_the_body(5870, {{128, 128, 0, Pairing::half}, {96, 38, 3, Pairing::interleaved}},
                                  {DType::bf16, DType::f32}, 60, {2});
}

// The rows keep their float scratch per thread from call to call (cpu_rows.cpp's float_scratch):
// callers on several threads at once, each alternating shapes that resize it (head counts, scopes,
// dtypes, weights or none) and running one- and two-thread teams of their own, all get the body's bits.
TEST(FusedRows, ConcurrentCallersEachKeepTheirOwnScratch) {
  std::vector<test::NormCase> cases;
  int seed = 6000;
  for (const DType dtype : {DType::bf16, DType::f32, DType::f16}) {
    for (const int64_t heads : {3, 16}) {
      test::NormCase c{.schedule = schedule_of(heads == 3 ? 64 : 128, 64, Pairing::half, 0), .dtype = dtype,
                       .seed = ++seed};
      c.heads_q = heads;
      c.heads_k = heads == 3 ? 1 : 4;
      c.scope = heads == 3 ? NormScope::all_heads : NormScope::head;
      c.weights = seed % 3 != 0;
      c.tokens = heads == 3 ? 1 : 9;
      cases.push_back(c);
    }
  }
  std::vector<std::vector<rows::Output>> body;
  for (const auto& c : cases) body.push_back(rows::run_norm(c, Backend::reference, 1));
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const size_t which = static_cast<size_t>(t + i) % cases.size();
        const auto fast = rows::run_norm(cases[which], Backend::automatic, 1 + (i + t) % 2);
        for (size_t o = 0; o < fast.size(); ++o) wrong += rows::difference(body[which][o], fast[o]) != "none";
      }
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(FusedRows, QkNormRopeOutsideTheOnePassLayoutsEqualsTheBody) {
  one_pass::expect_equal_the_body(5890, {{128, 128, 0, Pairing::half}, {96, 38, 3, Pairing::interleaved}},
                                  {DType::bf16, DType::f16, DType::f32}, 6, {1, 2}, one_pass::Rows::channel_strided,
                                  false);
  // rope_then_norm (normalised from scratch into the output, or in scratch for a k only cached), in
  // every placement, contiguous and padded rows, and channel-strided ones.
  one_pass::expect_equal_the_body(5895, {{128, 128, 0, Pairing::half}, {96, 38, 3, Pairing::interleaved},
                                         {80, 80, 0, Pairing::half}},
                                  {DType::bf16, DType::f16, DType::f32}, 6, {1, 2}, one_pass::Rows::contiguous, true,
                                  NormOrder::rope_then_norm);
  one_pass::expect_equal_the_body(5897, {{96, 38, 3, Pairing::interleaved}}, {DType::bf16, DType::f32}, 6, {1},
                                  one_pass::Rows::channel_strided, false, NormOrder::rope_then_norm);
  int seed = 5900;
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    test::NormCase blocks{.schedule = make_schedule(Spec{.head_dim = 64, .rotary_dim = 64, .blocks = 2}),
                          .dtype = dtype, .seed = ++seed};
    test::NormCase after{.schedule = schedule_of(96, 64, Pairing::interleaved, 16), .dtype = dtype, .seed = ++seed};
    after.order = NormOrder::rope_then_norm;
    for (const test::NormCase& c : {blocks, after}) {
      const auto body = rows::run_norm(c, Backend::reference, 1);
      const int64_t before = detail::one_pass_norm_call_count();
      rows::expect_same(body, rows::run_norm(c, Backend::automatic, 1), c.name());
      EXPECT_EQ(detail::one_pass_norm_call_count(), before) << c.name();
    }
  }
}

// A k cache of the data's dtype whose channels are not contiguous (strides[3] 2, or -1: each row
// reversed): the rows rotate k into scratch and copy it channel by channel, and a one-pass norm
// stays in apply's contiguous rows. Bit for bit against the body, rope_store and qk_norm_rope with a
// store (k then written only to the cache: the path that rotates k straight into its cache row when
// the channels are contiguous). Rotating into such a row once skipped the norm.
TEST(FusedRows, AKCacheWithStridedChannelsEqualsTheBody) {
  int seed = 5950;
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (const int64_t step : {int64_t{2}, int64_t{-1}}) {
      // `bytes` holding a [4 blocks, 16, heads, d] cache with channel stride `step`.
      const auto strided = [&](Buffer& bytes, int64_t heads, int64_t d) {
        const int64_t pitch = d * std::abs(step);
        bytes.assign(static_cast<size_t>(4 * 16 * heads * pitch * size_of(dtype)), 0xa5);
        return CacheView{.data = bytes.data() + (step < 0 ? (d - 1) * size_of(dtype) : 0), .dtype = dtype,
                         .block_size = 16, .num_blocks = 4, .heads = heads, .head_dim = d,
                         .strides = {16 * heads * pitch, heads * pitch, pitch, step}};
      };
      const auto norm_run = [&](Backend backend, int threads) {
        test::NormCase c{.schedule = schedule_of(96, 64, Pairing::half, 8), .dtype = dtype, .seed = seed};
        c.store = true;
        c.tokens = 7;
        test::NormSetup s(c);
        s.k_cache = strided(s.k_cache_bytes, c.heads_k, s.d);
        QkNormRopeArgs a = s.norm_args();
        a.rope.backend = backend;
        a.rope.threads = threads;
        qk_norm_rope(c.schedule, a);
        return std::tuple{s.q, s.k_cache_bytes, s.v_cache_bytes};
      };
      const auto store_run = [&](Backend backend, int threads) {
        test::StoreCase c;
        c.schedule = schedule_of(96, 64, Pairing::interleaved, 16);
        c.dtype = c.cache_dtype = dtype;
        c.tokens = 7;
        c.seed = seed;
        test::StoreSetup s(c);
        s.k_cache = strided(s.k_cache_bytes, c.heads_k, s.d);
        RopeStoreArgs a = s.store_args();
        a.rope.backend = backend;
        a.rope.threads = threads;
        rope_store(c.schedule, a);
        return std::tuple{s.q, s.k_cache_bytes, s.v_cache_bytes};
      };
      ++seed;
      const auto norm_body = norm_run(Backend::reference, 1);
      const auto store_body = store_run(Backend::reference, 1);
      for (const int threads : {1, 2}) {
        EXPECT_TRUE(norm_run(Backend::automatic, threads) == norm_body)
            << "qk_norm_rope " << to_string(dtype) << " channel stride " << step << " threads " << threads;
        EXPECT_TRUE(store_run(Backend::automatic, threads) == store_body)
            << "rope_store " << to_string(dtype) << " channel stride " << step << " threads " << threads;
      }
    }
  }
}

// rerotate_cache's rows (f32, f16 and bf16 caches: apply's row kernel, angles formed once per run of
// equal deltas) against the body (Backend::reference), bit for bit: runs of equal and of different
// deltas (per stream for M-RoPE), skipped slots, both pairings, a rotated slice at an offset, raw
// keys, in place and into another cache, NaNs, infinities and subnormals, one and two threads.
void expect_rerotate_rows_equal_the_body() {
  int seed = 5600;
  const std::vector<std::pair<std::string, Schedule>> schedules = {
      {"half d128", schedule_of(128, 128, Pairing::half)},
      {"interleaved d96 r32 at 16", schedule_of(96, 32, Pairing::interleaved, 16)},
      {"half d80 r48", schedule_of(80, 48, Pairing::half)},
      {"mrope d128", make_schedule(Spec{.head_dim = 128, .stream_layout = StreamLayout::sections,
                                        .sections = {16, 24, 24}})}};
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (const auto& [schedule_name, schedule] : schedules) {
      for (const Layout layout : {Layout::nhd, Layout::hnd}) {
        for (const bool raw : {false, true}) {
          for (const bool into_other : {false, true}) {
            test::RerotateCase c;
            c.schedule = schedule;
            c.cache_dtype = dtype;
            c.layout = layout;
            c.raw = raw;
            c.tokens = 23;
            c.seed = ++seed;
            test::RerotateSetup s(c);
            std::mt19937 rng(static_cast<uint32_t>(c.seed));
            rows::add_specials(s.cache_bytes, dtype, rng);
            s.slots[5] = -1;
            const int streams = schedule.streams;
            std::vector<int64_t> delta(static_cast<size_t>(streams * c.tokens));
            for (int st = 0; st < streams; ++st) {
              // Runs: 0-9 one delta in stream 0 (the other streams' alternate: a run only where every
              // stream's delta repeats), 10-14 another, then each its own.
              for (int64_t i = 0; i < c.tokens; ++i) {
                const int64_t d = i < 10   ? -512 - st * (i % 2)
                                  : i < 15 ? 77
                                           : static_cast<int64_t>(rng() % 9000) - 4500;
                delta[static_cast<size_t>(st * c.tokens + i)] = d;
              }
            }
            std::vector<int64_t> positions(static_cast<size_t>(streams * c.tokens));
            for (auto& p : positions) p = static_cast<int64_t>(rng() % 100000);
            const auto run = [&](Backend backend, int threads) {
              Buffer cache = s.cache_bytes;
              Buffer other(cache.size(), 0x5A);
              RerotateCacheArgs a = s.args();
              a.cache.data = cache.data();
              if (into_other) {
                a.out = a.cache;
                a.out.data = other.data();
              }
              if (raw) {
                a.positions = Positions::per_token(std::span<const int64_t>(positions), streams);
              } else {
                a.delta = delta.data();
                a.delta_streams = streams;
              }
              a.backend = backend;
              a.threads = threads;
              rerotate_cache(c.schedule, a);
              return std::vector<rows::Output>{{cache, dtype}, {other, dtype}};
            };
            const auto body = run(Backend::reference, 1);
            for (const int threads : {1, 2}) {
              rows::expect_same(body, run(Backend::automatic, threads),
                                fmt::format("{} {} raw={} into_other={} threads={}", schedule_name, c.name(), raw,
                                            into_other, threads));
            }
          }
        }
      }
    }
  }
}
TEST(FusedRows, RerotateCacheEqualsTheBody) { expect_rerotate_rows_equal_the_body(); }

// Calls that stream from memory prefetch later tokens' rows (apply's rows with cpu_apply_tokens'
// prefetch_limit; rerotate_cache's next slot); forced here for every size: the same bits, every
// layout, and the rows of each operation were given distances to prefetch by. Then a call large
// enough for two threads, whose ranges each stop prefetching at their own last token.
TEST(FusedRows, PrefetchingRowsEqualTheBody) {
  const detail::ScopedMinBytes every_call(detail::Threshold::prefetch, 0);
  int64_t before = detail::prefetch_distance_count();
  expect_rope_store_rows_equal_the_body();
  expect_rope_store_streams_and_sources_equal_the_body();
  EXPECT_GT(detail::prefetch_distance_count(), before) << "rope_store";
  before = detail::prefetch_distance_count();
  expect_qk_norm_rope_rows_equal_the_body();
  EXPECT_GT(detail::prefetch_distance_count(), before) << "qk_norm_rope";
  before = detail::prefetch_distance_count();
  expect_rerotate_rows_equal_the_body();
  EXPECT_GT(detail::prefetch_distance_count(), before) << "rerotate_cache";
  test::StoreCase c;
  c.schedule = schedule_of(128, 128, Pairing::half);
  c.tokens = 300;  // above the 256 KiB a thread takes (team_size): two threads
  c.seed = 701;
  const auto body = rows::run_store(c, Backend::reference, 1);
  rows::expect_same(body, rows::run_store(c, Backend::automatic, 2), c.name());
  rows::expect_same(body, rows::run_store(c, Backend::automatic, 1), c.name());
}

// Values the composition copies unchanged keep their bits, as apply's pass-through channels and a
// plain copy do: a signalling NaN in a channel outside the rotated slice (in q, k) and in v reaches
// q (in place), k_out, and a cache of the data's dtype as it was, on the rows and on the body.
TEST(FusedRows, UnchangedValuesKeepTheirBitsSignallingNaNsIncluded) {
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (const Backend backend : {Backend::reference, Backend::automatic}) {
      test::StoreCase c;
      c.schedule = schedule_of(64, 32, Pairing::half);  // channels 32..63 pass through
      c.dtype = c.cache_dtype = dtype;
      c.layout = Layout::nhd;
      c.tokens = 3;
      c.seed = 5400;
      test::StoreSetup s(c);
      const int64_t es = size_of(dtype);
      const uint32_t snan32 = 0x7f812345u;
      const uint16_t snan16 = dtype == DType::f16 ? uint16_t{0x7c55} : uint16_t{0x7f95};
      auto poison = [&](Buffer& b) {  // channel 40 of every head, every element of v
        for (int64_t i = 40; i < static_cast<int64_t>(b.size()) / es; i += 64) {
          std::memcpy(b.data() + i * es, dtype == DType::f32 ? static_cast<const void*>(&snan32) : &snan16,
                      static_cast<size_t>(es));
        }
      };
      poison(s.q);
      poison(s.k);
      for (int64_t i = 0; i < static_cast<int64_t>(s.v.size()) / es; ++i) {
        std::memcpy(s.v.data() + i * es, dtype == DType::f32 ? static_cast<const void*>(&snan32) : &snan16,
                    static_cast<size_t>(es));
      }
      const Buffer q_in = s.q;
      const Buffer k_in = s.k;
      RopeStoreArgs args = s.store_args();
      args.rope.backend = backend;
      Buffer k_out(s.k.size());
      args.rope.k_out = s.view(k_out, c.heads_k);
      rope_store(c.schedule, args);
      const std::string name = fmt::format("{} {}", to_string(dtype), backend == Backend::reference ? "body" : "rows");
      for (int64_t t = 0; t < c.tokens; ++t) {
        for (int64_t h = 0; h < c.heads_k; ++h) {
          const int64_t at = (t * c.heads_k + h) * 64 + 40;
          EXPECT_EQ(std::memcmp(k_out.data() + at * es, k_in.data() + at * es, static_cast<size_t>(es)), 0) << name;
          const int64_t slot = s.slots[static_cast<size_t>(t)];
          const int64_t row = (slot / c.block_size) * s.k_cache.strides[0] + (slot % c.block_size) * s.k_cache.strides[1] +
                              h * s.k_cache.strides[2];
          EXPECT_EQ(std::memcmp(s.k_cache_bytes.data() + (row + 40) * es, k_in.data() + at * es,
                                static_cast<size_t>(es)), 0) << name << " k_cache";
          const int64_t v_row = (slot / c.block_size) * s.v_cache.strides[0] +
                                (slot % c.block_size) * s.v_cache.strides[1] + h * s.v_cache.strides[2];
          for (int64_t d = 0; d < 64; ++d) {
            EXPECT_EQ(std::memcmp(s.v_cache_bytes.data() + (v_row + d) * es, s.v.data() + ((t * c.heads_k + h) * 64 + d) * es,
                                  static_cast<size_t>(es)), 0) << name << " v_cache";
          }
        }
        for (int64_t h = 0; h < c.heads_q; ++h) {
          const int64_t at = (t * c.heads_q + h) * 64 + 40;
          EXPECT_EQ(std::memcmp(s.q.data() + at * es, q_in.data() + at * es, static_cast<size_t>(es)), 0) << name << " q";
        }
      }
    }
  }
}

// The vector cache-row encoder (src/cpu/quant_rows.cc) gives math/quant.hpp's codes (themselves
// checked against an oracle in test_fused_quant.cpp) on every Highway target: f32 inputs over every
// binade (a stride through all 2^32 bit patterns, and random ones), every f16 and bf16 pattern,
// both scale directions, rows whose length leaves a tail.
class QuantRowsTargets : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(QuantRowsTargets);

TEST_P(QuantRowsTargets, EveryCodeIsQuantHpps) {
  std::vector<uint32_t> f32_bits;
  for (uint64_t b = 0; b <= 0xffffffffull; b += 4093) f32_bits.push_back(static_cast<uint32_t>(b));
  std::mt19937 rng(91);
  for (int i = 0; i < 100000; ++i) f32_bits.push_back(static_cast<uint32_t>(rng()));
  for (const float v : {0.0f, -0.0f, 448.0f, -448.0f, 464.0f, 57344.0f, 61440.0f, 126.5f, 127.0f, 127.5f, -127.5f,
                        0x1p-9f, 0x1p-10f, 0x1.8p-10f, 0x1p-16f, 0x1p-17f}) {
    f32_bits.push_back(detail::float_bits(v));
  }
  f32_bits.push_back(3);  // an odd length: a tail on every target
  std::vector<uint16_t> half_bits(65536 + 5);
  std::iota(half_bits.begin(), half_bits.begin() + 65536, uint16_t{0});
  for (const DType data : {DType::f32, DType::f16, DType::bf16}) {
    const void* src = data == DType::f32 ? static_cast<const void*>(f32_bits.data()) : half_bits.data();
    const auto n = static_cast<int64_t>(data == DType::f32 ? f32_bits.size() : half_bits.size());
    for (const DType code : {DType::fp8_e4m3, DType::fp8_e5m2, DType::i8}) {
      for (const auto& [scale, op] : {std::pair{1.0f, detail::ScaleOp::divide}, std::pair{0.37f, detail::ScaleOp::divide},
                                      std::pair{0.37f, detail::ScaleOp::multiply}}) {
        std::vector<uint8_t> got(static_cast<size_t>(n), 0xAA);
        detail::quantise_row(data, src, code, got.data(), n, scale, op);
        int64_t wrong = 0;
        int64_t first = -1;
        for (int64_t i = 0; i < n; ++i) {
          float v;
          if (data == DType::f32) {
            v = detail::float_from_bits(f32_bits[static_cast<size_t>(i)]);
          } else {
            const uint16_t h = half_bits[static_cast<size_t>(i)];
            v = data == DType::f16 ? detail::f16_to_f32(h) : detail::bf16_to_f32(h);
          }
          const float x = detail::scale_for_code(v, scale, op);
          const uint8_t want = code == DType::i8 ? static_cast<uint8_t>(detail::float_to_i8(x))
                                                 : detail::float_to_fp8(x, code == DType::fp8_e4m3 ? detail::kE4M3
                                                                                                  : detail::kE5M2);
          if (got[static_cast<size_t>(i)] != want) {
            if (first < 0) first = i;
            ++wrong;
          }
        }
        EXPECT_EQ(wrong, 0) << to_string(data) << " -> " << to_string(code) << " scale " << scale << " op "
                            << static_cast<int>(op) << ": first at " << first;
      }
    }
  }
}

// The norms' sums of squares (src/cpu/norm_rows.cc) are the body's in-order double sums bit for
// bit on every target. A bf16 row takes a vector-order sum only where that sum is exact, which
// depends on the sum and on the smallest nonzero value (of the call's rows, then of the row's own):
// rows whose nonzero values span 0 to 24 binades (as outlier channels do, one in a row's tail too),
// subnormals beside normals, zeros, infinities and NaNs, head and all-heads scope, lengths with and
// without a tail. The expected sums are the loop written out here. (A bound one binade too high, in
// either check, fails this test.)
class NormSumsTargets : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(NormSumsTargets);

TEST_P(NormSumsTargets, SumsOfSquaresAreTheInOrderSumsWhateverTheExponentSpread) {
  std::mt19937 rng(4242);
  const auto same = [](double a, double b) {
    return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
  };
  int64_t compared = 0;
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    const int64_t es = size_of(dtype);
    for (const int64_t n : {64, 98, 128, 256}) {
      for (int spread = 0; spread <= 24; ++spread) {
        // 0: normals; 1: with zeros and subnormals; 2: with an inf or NaN; 3: one binade, but the
        // second-to-last channel `spread` binades up (in the tail where a vector's length does not
        // divide n: the tail's exponents count too)
        for (const int kind : {0, 1, 2, 3}) {
          const int64_t heads = 9, head_stride = n + 3;
          std::vector<unsigned char> data(static_cast<size_t>(heads * head_stride * es));
          std::uniform_int_distribution<int> binade(0, spread);
          std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
          std::vector<float> values(static_cast<size_t>(heads * head_stride));
          for (int64_t i = 0; i < heads * head_stride; ++i) {
            const int lowest = dtype == DType::f16 ? -11 : -8;  // binades within every dtype's range
            const int up = kind != 3 ? binade(rng) : i % head_stride == n - 2 ? spread : 0;
            float v = std::ldexp(mantissa(rng), up + lowest) * (rng() % 2 == 0 ? 1.0f : -1.0f);
            const float subnormal = dtype == DType::f32 ? 0x1p-140f : dtype == DType::f16 ? 0x1p-24f : 0x1p-133f;
            if (kind == 1 && rng() % 13 == 0) v = rng() % 2 == 0 ? 0.0f : subnormal;
            if (kind == 2 && rng() % 97 == 0) v = rng() % 2 == 0 ? INFINITY : NAN;
            test::store_value(dtype, data.data(), i, v);
            values[static_cast<size_t>(i)] = test::load_value(dtype, data.data(), i);  // the value as stored
          }
          for (const bool all_heads : {false, true}) {
            std::vector<double> want(static_cast<size_t>(heads), 0.0), got(static_cast<size_t>(heads), -1.0);
            for (int64_t h = 0; h < heads; ++h) {
              double sum = all_heads && h > 0 ? want[0] : 0.0;
              for (int64_t c = 0; c < n; ++c) {
                const auto x = static_cast<double>(values[static_cast<size_t>(h * head_stride + c)]);
                sum = sum + x * x;
              }
              want[static_cast<size_t>(all_heads ? 0 : h)] = sum;
            }
            detail::square_sums(dtype, data.data(), head_stride, 1, heads, n, all_heads, got.data());
            for (int64_t h = 0; h < (all_heads ? 1 : heads); ++h) {
              ++compared;
              EXPECT_TRUE(same(got[static_cast<size_t>(h)], want[static_cast<size_t>(h)]))
                  << to_string(dtype) << " n " << n << " spread " << spread << " kind " << kind
                  << (all_heads ? " all heads" : " head ") << h << ": " << got[static_cast<size_t>(h)] << " vs "
                  << want[static_cast<size_t>(h)];
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 3 * 4 * 25 * 4 * 10);
}

// Each Highway target this build compiles (hwy::SetSupportedTargetsForTest): the rows' rotation is
// apply's kernel of that target, the norms and stores plain loops; every target gives the body's bits.
class FusedRowsTargets : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(FusedRowsTargets);

TEST_P(FusedRowsTargets, RopeStoreAndQkNormRopeEqualTheBody) {
  int seed = 5300;
  int round = 0;
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    test::StoreCase store;
    store.schedule = schedule_of(96, 64, Pairing::interleaved, 16);
    store.dtype = dtype;
    store.cache_dtype = round++ % 2 == 0 ? dtype : DType::fp8_e4m3;  // f16 data into an fp8 cache
    store.scaled = is_quantised_dtype(store.cache_dtype);
    store.tokens = 5;
    store.seed = ++seed;
    rows::expect_same(rows::run_store(store, Backend::reference, 1), rows::run_store(store, Backend::automatic, 1),
                      store.name());
    test::NormCase norm{.schedule = schedule_of(128, 128, Pairing::half), .dtype = dtype, .seed = ++seed};
    norm.v_norm = true;
    norm.store = true;
    rows::expect_same(rows::run_norm(norm, Backend::reference, 1), rows::run_norm(norm, Backend::automatic, 1),
                      norm.name());
  }
  expect_many_heads_equal_the_body(5500);
  one_pass::expect_equal_the_body(5950, {{80, 80, 0, Pairing::interleaved}, {98, 64, 16, Pairing::half},
                                         {96, 38, 3, Pairing::interleaved}, {128, 70, 0, Pairing::half}},
                                  {DType::bf16, DType::f16, DType::f32});
}

}  // namespace
}  // namespace rotary
