// Instructions per decode call of the fused operations (Llama-3.1-8B: 32 q / 8 kv heads, head_dim
// 128, f32, one token at position 4096, a range table), for bench/record-issue25-2core.md: argument
// "store" (rope_store into paged NHD f32 caches, k and v) or "norm" (qk_norm_rope with f32 weights).
// Not part of the build; against a build tree's librotary.a:
//   g++ -O2 -std=c++20 bench/callgrind_fused.cpp -Iinclude -Lbuild -lrotary -lhwy -lfmt -fopenmp -o /tmp/fused_calls
//   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.norm \
//     --toggle-collect='rotary::qk_norm_rope(rotary::Schedule const&, rotary::QkNormRopeArgs const&)' /tmp/fused_calls norm 500
//   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.store \
//     --toggle-collect='rotary::rope_store(rotary::Schedule const&, rotary::RopeStoreArgs const&)' /tmp/fused_calls store 500
//   callgrind_annotate /tmp/cg.norm | grep 'PROGRAM TOTALS'     # divided by 500
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "rotary/fused.hpp"
#include "rotary/rotary.hpp"
using namespace rotary;
int main(int argc, char** argv) {
  const bool norm = argc > 1 && std::strcmp(argv[1], "norm") == 0;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 100000;
  const Schedule s = make_schedule(Spec{.head_dim = 128, .base = 500000.0});
  std::vector<int64_t> pos{4096}, slot{777};
  const Table t = Table::range(s, 0, 8192);
  std::vector<float> q(32 * 128, 0.5f), k(8 * 128, 0.25f), v(8 * 128, 0.125f), wq(128, 1.0f), wk(128, 1.0f);
  std::vector<float> kc(64 * 16 * 8 * 128), vc(64 * 16 * 8 * 128);
  const ApplyArgs rope{.q = TensorView::bshd(q.data(), DType::f32, 1, 1, 32, 128),
                       .k = TensorView::bshd(k.data(), DType::f32, 1, 1, 8, 128),
                       .positions = Positions::per_token(std::span<const int64_t>(pos)), .table = &t, .threads = 1};
  RopeStoreArgs store;
  store.rope = rope;
  store.cache.slots = Slots::of(std::span<const int64_t>(slot));
  store.cache.k_cache = CacheView::nhd(kc.data(), DType::f32, 64, 16, 8, 128);
  store.cache.v_cache = CacheView::nhd(vc.data(), DType::f32, 64, 16, 8, 128);
  store.cache.v = TensorView::bshd(v.data(), DType::f32, 1, 1, 8, 128);
  QkNormRopeArgs qk;
  qk.rope = rope;
  qk.q_weight = NormWeight{.data = wq.data(), .dtype = DType::f32, .count = 128};
  qk.k_weight = NormWeight{.data = wk.data(), .dtype = DType::f32, .count = 128};
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) {
    if (norm) {
      qk_norm_rope(s, qk);
    } else {
      rope_store(s, store);
    }
  }
  std::printf("%s: %.1f ns per call\n", norm ? "qk_norm_rope" : "rope_store",
              std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / calls);
}
