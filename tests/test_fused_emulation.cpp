// The fused operations' CUDA work split played on the host: per token, the angle row filled by
// `threads` threads (fused_angles with thread/threads, as a block's threads fill shared memory),
// the all-heads norms, then one item (head) per warp, its norm factor then its 32 lanes, in an order
// unlike the CPU loop's. The body
// is src/fused/body.hpp, the one the CPU runs: the results must equal rotary::rope_store's and
// qk_norm_rope's bit for bit (CPU == CUDA without a GPU).
#include <gtest/gtest.h>

#include <vector>

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

}  // namespace
}  // namespace rotary
