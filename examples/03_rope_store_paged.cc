// The README's paged-cache write: Llama-3.1-8B's RoPE on q and k of three tokens, the rotated k and
// v written in one pass to fp8 e4m3 caches of vLLM's / FlashInfer's NHD layout ([num_blocks, 16,
// kv_heads, head_dim]) at each token's slot, with a per-tensor scale that divides (vLLM's). The
// third token is padding (slot -1): its q is rotated, nothing of it is cached.
#include <rotary/fused.hpp>
#include <rotary/rotary.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

static uint16_t to_bf16(float x) {  // bfloat16: the upper half of a float32 (exact for 1.0)
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

int main() {
  const int64_t tokens = 3, num_blocks = 64, block_size = 16, heads = 32, kv_heads = 8, d = 128;
  std::vector<uint16_t> q(tokens * heads * d, to_bf16(1.0f)), k(tokens * kv_heads * d, to_bf16(1.0f));
  std::vector<uint16_t> v(tokens * kv_heads * d, to_bf16(0.5f));
  std::vector<uint8_t> k_cache(num_blocks * block_size * kv_heads * d), v_cache(k_cache.size());
  const std::vector<int64_t> slots = {5 * 16 + 1, 9 * 16 + 15, -1};   // vLLM's slot_mapping; -1: padding
  const std::vector<int64_t> positions = {17, 4095, 3};

  const rotary::Schedule schedule = rotary::make_schedule(rotary::Spec{
      .head_dim = 128, .base = 500000.0, .pairing = rotary::Pairing::half,
      .schedule = rotary::ScheduleType::llama3, .factor = 8.0, .original_max_position = 8192,
      .low_freq_factor = 1.0, .high_freq_factor = 4.0});
  const auto view = [&](std::vector<uint16_t>& x, int64_t h) {
    return rotary::TensorView::bshd(x.data(), rotary::DType::bf16, 1, tokens, h, d);
  };
  const float k_scale = 0.05f, v_scale = 0.05f;
  rotary::CacheWrite write{
      .slots = rotary::Slots::of(std::span<const int64_t>(slots)),
      .k_cache = rotary::CacheView::nhd(k_cache.data(), rotary::DType::fp8_e4m3, num_blocks, block_size, kv_heads, d),
      .v_cache = rotary::CacheView::nhd(v_cache.data(), rotary::DType::fp8_e4m3, num_blocks, block_size, kv_heads, d),
      .v = view(v, kv_heads), .k_quant = {.scale = &k_scale}, .v_quant = {.scale = &v_scale}};
  rotary::rope_store(schedule, {.rope = {.q = view(q, heads), .k = view(k, kv_heads),
                                         .positions = rotary::Positions::per_token(positions)},
                                .cache = write});

  // Which cache rows hold anything now: the two real tokens' slots only.
  std::printf("k_cache rows written:");
  for (int64_t slot = 0; slot < num_blocks * block_size; ++slot) {
    bool any = false;
    for (int64_t i = 0; i < kv_heads * d; ++i) any = any || k_cache[slot * kv_heads * d + i] != 0;
    if (any) std::printf(" %lld", static_cast<long long>(slot));
  }
  // v = 0.5 / 0.05 = 10 in e4m3 (exact: 1.25 * 2^3): code 0x52.
  std::printf("; v_cache[slot 81][0][0] code 0x%02x\n", v_cache[81 * kv_heads * d]);
  return 0;
}
