// The fused operations' CUDA work split played on the host: per token, the angle row filled by
// `threads` threads (fused_angles with thread/threads, as a block's threads fill shared memory),
// the all-heads norms, then one item (head) per warp, its norm factor then its 32 lanes, in an order
// unlike the CPU loop's. The body
// is src/fused/body.hpp, the one the CPU runs: the results must equal rotary::rope_store's and
// qk_norm_rope's bit for bit (CPU == CUDA without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "fused/body.hpp"
#include "fused/fused_args.hpp"
#include "kernel/args.hpp"
#include "support/fused_cases.hpp"

namespace rotary {
namespace {

template <class T>
void emulate_grid(const detail::FusedKernelArgs& f, int threads) {
  using Value = typename detail::Storage<T>::Value;
  const detail::PairArrays pairs = detail::pair_arrays(f.rope);
  std::vector<detail::AngleCell<Value>> shared(static_cast<size_t>(f.rope.rotary_dim / 2));
  const int64_t items = detail::fused_items(f);
  for (int64_t token = f.rope.tokens - 1; token >= 0; --token) {  // blocks in any order
    for (int t = 0; t < threads; ++t) detail::fused_angles<Value>(f, pairs, token, t, threads, shared.data());
    if (detail::token_error(f.rope, token) != 0) continue;
    float token_r[2];
    detail::fused_token_norms<T>(f, pairs, shared.data(), token, token_r);
    // A warp per item: the factor first (its first thread), then its 32 lanes, here in reverse.
    for (int64_t item = items - 1; item >= 0; --item) {
      const float r = detail::fused_item_factor<T>(f, pairs, shared.data(), token, item, token_r);
      for (int64_t lane = 31; lane >= 0; --lane) detail::fused_item<T>(f, pairs, shared.data(), token, item, r, lane, 32);
    }
  }
}

void emulate(const detail::FusedKernelArgs& f, int threads) {
  detail::with_storage(f.rope.dtype, [&]<class T>() { emulate_grid<T>(f, threads); });
}

TEST(FusedEmulation, RopeStoreGridEqualsTheCpu) {
  int seed = 1;
  for (const DType cache : {DType::bf16, DType::fp8_e4m3, DType::i8}) {
    for (const int64_t d : {64, 128, 256}) {
      test::StoreCase c;
      c.schedule = make_schedule(Spec{.head_dim = d, .rotary_dim = d / 2, .pairing = Pairing::interleaved});
      c.cache_dtype = cache;
      c.scaled = is_quantised_dtype(cache);
      c.per_head_scale = true;
      c.seed = ++seed;
      SCOPED_TRACE(c.name());
      test::StoreSetup cpu(c), gpu(c);
      rope_store(c.schedule, cpu.store_args());
      const RopeStoreArgs args = gpu.store_args();
      detail::validate_rope_store(c.schedule, args, true);
      emulate(detail::make_rope_store_args(c.schedule, args, nullptr), 32);
      EXPECT_TRUE(cpu.q == gpu.q);
      EXPECT_TRUE(cpu.k_cache_bytes == gpu.k_cache_bytes);
      EXPECT_TRUE(cpu.v_cache_bytes == gpu.v_cache_bytes);
    }
  }
}

TEST(FusedEmulation, QkNormRopeGridEqualsTheCpu) {
  int seed = 50;
  for (const NormScope scope : {NormScope::head, NormScope::all_heads}) {
    for (const NormOrder order : {NormOrder::norm_then_rope, NormOrder::rope_then_norm}) {
      test::NormCase c{.schedule = make_schedule(Spec{.head_dim = 128}), .dtype = DType::bf16, .seed = ++seed};
      c.scope = scope;
      c.order = order;
      c.store = true;
      c.v_norm = true;
      SCOPED_TRACE(c.name());
      test::NormSetup cpu(c), gpu(c);
      qk_norm_rope(c.schedule, cpu.norm_args());
      const QkNormRopeArgs args = gpu.norm_args();
      detail::validate_qk_norm_rope(c.schedule, args, true);
      emulate(detail::make_qk_norm_rope_args(c.schedule, args, nullptr), 64);
      EXPECT_TRUE(cpu.q == gpu.q);
      EXPECT_TRUE(cpu.k_cache_bytes == gpu.k_cache_bytes);
      EXPECT_TRUE(cpu.v_cache_bytes == gpu.v_cache_bytes);
    }
  }
}

// rerotate_cache's split: per slot the angle row, then a warp per head, its 32 lanes (in reverse).
TEST(FusedEmulation, RerotateCacheGridEqualsTheCpu) {
  const Schedule schedule = make_schedule(Spec{.head_dim = 128, .rotary_dim = 96, .base = 500000.0});
  std::mt19937 rng(77);
  for (const DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    for (const bool out_of_place : {false, true}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + (out_of_place ? " out of place" : " in place"));
      const int64_t blocks = 6, block = 16, heads = 3, d = 128, count = 40;
      const int64_t es = size_of(dtype);
      std::vector<unsigned char> cpu_in(static_cast<size_t>(blocks * block * heads * d * es));
      for (auto& byte : cpu_in) byte = static_cast<unsigned char>(rng() % 0x70);  // finite codes and values
      std::vector<unsigned char> gpu_in = cpu_in, cpu_out(cpu_in.size(), 0x11), gpu_out(cpu_in.size(), 0x11);
      std::vector<int64_t> slots(static_cast<size_t>(count)), delta(static_cast<size_t>(count));
      std::vector<int64_t> all(static_cast<size_t>(blocks * block));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t i = 0; i < count; ++i) {
        slots[static_cast<size_t>(i)] = i == 7 ? -1 : all[static_cast<size_t>(i)];
        delta[static_cast<size_t>(i)] = static_cast<int64_t>(rng() % 3001) - 1500;
      }
      const float scale = 0.11f;
      const auto args = [&](std::vector<unsigned char>& in, std::vector<unsigned char>& out) {
        RerotateCacheArgs a{.cache = CacheView::nhd(in.data(), dtype, blocks, block, heads, d),
                            .slots = Slots::of(std::span<const int64_t>(slots))};
        if (out_of_place) a.out = CacheView::nhd(out.data(), dtype, blocks, block, heads, d);
        a.delta = delta.data();
        if (is_quantised_dtype(dtype)) a.quant = CacheQuant{.scale = &scale};
        return a;
      };
      rerotate_cache(schedule, args(cpu_in, cpu_out));
      const RerotateCacheArgs gpu = args(gpu_in, gpu_out);
      detail::validate_rerotate_cache(schedule, gpu, true);
      const detail::RerotateKernelArgs r = detail::make_rerotate_args(schedule, gpu, nullptr);
      const detail::PairArrays pairs = detail::pair_arrays(r.rope);
      std::vector<detail::AngleCell<float>> cells(static_cast<size_t>(r.rope.rotary_dim / 2));
      for (int64_t i = r.count - 1; i >= 0; --i) {  // blocks in any order
        if (slots[static_cast<size_t>(i)] < 0) continue;
        for (int64_t j = 0; j < r.rope.rotary_dim / 2; ++j) cells[static_cast<size_t>(j)] = detail::rerotate_angle(r, pairs, i, j);
        for (int64_t h = r.heads - 1; h >= 0; --h) {
          for (int64_t lane = 31; lane >= 0; --lane) detail::rerotate_item(r, pairs, cells.data(), i, h, lane, 32);
        }
      }
      EXPECT_TRUE(cpu_in == gpu_in);
      EXPECT_TRUE(cpu_out == gpu_out);
    }
  }
}

// A slot beyond a cache's capacity reaches the kernels only from device memory (the host checks
// host slots): the grid skips that token's cache writes, never writing past the cache, and still
// writes the others and q. (fused.cu also flags it as slot_out_of_range: a device test.)
TEST(FusedEmulation, ASlotBeyondTheCacheIsNeverWritten) {
  const Schedule s = make_schedule(Spec{.head_dim = 64});
  const int64_t tokens = 4, d = 64, capacity = 8;
  std::vector<float> q(static_cast<size_t>(tokens * 2 * d), 1.0f), k(static_cast<size_t>(tokens * d), 1.0f);
  std::vector<float> v = k;
  // k and v caches of 2 blocks x 4 slots x 1 head, each followed by a guard of zeros.
  const size_t cache = static_cast<size_t>(capacity * d), guard = 64 * 64 * 2;
  std::vector<float> k_mem(cache + guard, 0.0f), v_mem(cache + guard, 0.0f);
  const std::vector<int64_t> slots = {0, 1, 99, 2};
  RopeStoreArgs a;
  a.rope.q = TensorView::bshd(q.data(), DType::f32, 1, tokens, 2, d);
  a.rope.k = TensorView::bshd(k.data(), DType::f32, 1, tokens, 1, d);
  a.cache.slots = Slots::of(std::span<const int64_t>(slots));
  a.cache.k_cache = CacheView::nhd(k_mem.data(), DType::f32, 2, 4, 1, d);
  a.cache.v_cache = CacheView::nhd(v_mem.data(), DType::f32, 2, 4, 1, d);
  a.cache.v = TensorView::bshd(v.data(), DType::f32, 1, tokens, 1, d);
  detail::validate_rope_store(s, a, false);  // a device call's validation: slot values not read
  emulate(detail::make_rope_store_args(s, a, nullptr), 32);
  for (const auto* mem : {&k_mem, &v_mem}) {
    for (size_t i = cache; i < mem->size(); ++i) ASSERT_EQ((*mem)[i], 0.0f) << "written past the cache at " << i;
    for (const int64_t slot : {0, 1, 2}) EXPECT_NE((*mem)[static_cast<size_t>(slot * d)], 0.0f) << "slot " << slot;
  }
}

}  // namespace
}  // namespace rotary

