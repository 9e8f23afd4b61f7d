// rope_store of a 4096-token bf16 prefill (Llama-3.1-8B: 32 q / 8 kv heads, head_dim 128) into an fp8
// e4m3 cache with a scale, or (argument b) a bf16 cache: median of 7 calls on 1 thread, for
// bench/record-issue25-2core.md. Not part of the build; against a build tree's librotary.a:
//   g++ -O2 -std=c++20 bench/fp8_store.cpp -Iinclude -Lbuild -lrotary -lhwy -lfmt -fopenmp -o /tmp/fp8_store
//   /tmp/fp8_store; /tmp/fp8_store b
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <numeric>
#include <algorithm>
#include "rotary/rotary.hpp"
#include "rotary/fused.hpp"
using namespace rotary;
int main(int argc, char** argv) {
  const int64_t T = 4096;
  const DType cache_dtype = argc > 1 && argv[1][0] == 'b' ? DType::bf16 : DType::fp8_e4m3;
  const Schedule s = make_schedule(Spec{.head_dim = 128, .base = 500000.0});
  std::vector<int64_t> pos(T), slot(T);
  for (int64_t i = 0; i < T; ++i) { pos[i] = (i * 7919) % 60000; slot[i] = i; }
  const Table t = Table::range(s, 0, 65536);
  std::vector<uint16_t> q(T * 32 * 128, 0x3f00), k(T * 8 * 128, 0x3e80), v(T * 8 * 128, 0x3e00);
  std::vector<uint16_t> kc(T * 8 * 128), vc(T * 8 * 128);
  const float scale = 0.05f;
  RopeStoreArgs a;
  a.rope = ApplyArgs{.q = TensorView::bshd(q.data(), DType::bf16, 1, T, 32, 128),
                     .k = TensorView::bshd(k.data(), DType::bf16, 1, T, 8, 128),
                     .positions = Positions::per_token(std::span<const int64_t>(pos)), .table = &t, .threads = 1};
  a.cache.slots = Slots::of(std::span<const int64_t>(slot));
  a.cache.k_cache = CacheView::nhd(kc.data(), cache_dtype, T / 16, 16, 8, 128);
  a.cache.v_cache = CacheView::nhd(vc.data(), cache_dtype, T / 16, 16, 8, 128);
  a.cache.v = TensorView::bshd(v.data(), DType::bf16, 1, T, 8, 128);
  if (cache_dtype != DType::bf16) { a.cache.k_quant = {.scale = &scale}; a.cache.v_quant = {.scale = &scale}; }
  std::vector<double> ts;
  for (int r = 0; r < 7; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    rope_store(s, a);
    ts.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ts.begin(), ts.end());
  std::printf("%s prefill rope_store: %.0f us (median of 7)\n", cache_dtype == DType::bf16 ? "bf16" : "fp8", ts[3]);
}
