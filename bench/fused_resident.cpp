// Cache-resident calls of the fused operations (Llama-3.1-8B shapes: 32 q / 8 kv heads, head_dim
// 128; T tokens at positions 0..T-1, a table): ns per call, the median of 7 runs of `calls` calls, for
// bench/record-issue25-2core.md. Arguments: bf16|f32, T, calls, norm|store|apply [after: norm in
// rope_then_norm order]. Not part of the
// build; against a build tree's librotary.a (two builds alternated: run each binary in turn):
//   g++ -O2 -std=c++20 bench/fused_resident.cpp -Iinclude -Lbuild -lrotary -lhwy -lfmt -fopenmp -o fused_resident
//   ./fused_resident bf16 16 500 norm
// Two builds (old, new: this file linked against each tree's librotary.a), alternated 15 times; the
// record quotes the min and median of each column:
//   for i in $(seq 15); do ./old bf16 16 500 norm; ./new bf16 16 500 norm; done
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include <algorithm>
#include "rotary/fused.hpp"
#include "rotary/rotary.hpp"
using namespace rotary;
int main(int argc, char** argv) {
  const bool bf = std::strcmp(argv[1], "bf16") == 0;
  const int64_t T = std::atoi(argv[2]);
  const int calls = std::atoi(argv[3]);
  const char* op = argv[4];
  const DType dt = bf ? DType::bf16 : DType::f32;
  const int64_t es = bf ? 2 : 4;
  const Schedule s = make_schedule(Spec{.head_dim = 128, .base = 500000.0});
  std::vector<int64_t> pos(T), slot(T);
  for (int64_t t = 0; t < T; ++t) { pos[t] = t; slot[t] = t; }
  const Table tab = Table::at(s, pos);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> q16(T * 32 * 128), k16(T * 8 * 128), v16(T*8*128), w16(128);
  std::vector<float> q32(T * 32 * 128), k32(T * 8 * 128), v32(T*8*128), w32(128, 1.0f);
  for (auto& x : q32) x = nd(rng);
  for (auto& x : k32) x = nd(rng);
  for (size_t i = 0; i < q16.size(); ++i) { uint32_t b; std::memcpy(&b, &q32[i], 4); q16[i] = b >> 16; }
  for (size_t i = 0; i < k16.size(); ++i) { uint32_t b; std::memcpy(&b, &k32[i], 4); k16[i] = b >> 16; }
  for (auto& w : w16) w = 0x3f80;
  void* q = bf ? (void*)q16.data() : (void*)q32.data();
  void* k = bf ? (void*)k16.data() : (void*)k32.data();
  void* v = bf ? (void*)v16.data() : (void*)v32.data();
  void* w = bf ? (void*)w16.data() : (void*)w32.data();
  std::vector<unsigned char> kc(T * 8 * 128 * es + 4096), vc(T * 8 * 128 * es + 4096);
  const ApplyArgs rope{.q = TensorView::bshd(q, dt, 1, T, 32, 128), .k = TensorView::bshd(k, dt, 1, T, 8, 128),
                       .positions = Positions::per_token(std::span<const int64_t>(pos)), .table = &tab, .threads = 1};
  QkNormRopeArgs qk;
  qk.rope = rope;
  qk.q_weight = NormWeight{.data = w, .dtype = dt, .count = 128};
  qk.k_weight = qk.q_weight;
  if (argc > 5 && std::strcmp(argv[5], "after") == 0) qk.order = NormOrder::rope_then_norm;  // Llama 4's order
  RopeStoreArgs st;
  st.rope = rope;
  st.cache.slots = Slots::of(std::span<const int64_t>(slot));
  st.cache.k_cache = CacheView::nhd(kc.data(), dt, T, 1, 8, 128);
  st.cache.v_cache = CacheView::nhd(vc.data(), dt, T, 1, 8, 128);
  st.cache.v = TensorView::bshd(v, dt, 1, T, 8, 128);
  std::vector<double> ns;
  for (int r = 0; r < 7; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      if (op[0] == 'n') qk_norm_rope(s, qk); else if (op[0] == 's') rope_store(s, st); else apply(s, rope);
    }
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / calls);
  }
  std::sort(ns.begin(), ns.end());
  std::printf("%s %s T=%ld: %.1f ns/call, %.3f ns/elem\n", op, argv[1], (long)T, ns[3], ns[3] / (T * 40 * 128));
}
