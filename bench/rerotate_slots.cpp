// rerotate_cache of a T-slot bf16 token pool (8 heads, head_dim 128), 1 thread, against apply of
// the same rows: median of 5 calls each, for bench/record-issue25-2core.md. Second argument "same":
// every slot by one delta (an eviction), else a delta per slot. Not part of the build:
//   g++ -O2 -std=c++20 bench/rerotate_slots.cpp -Iinclude -Lbuild -lrotary -lhwy -lfmt -fopenmp -o rerotate_slots
//   ./rerotate_slots 4096 same; ./rerotate_slots 4096 vary
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "rotary/fused.hpp"
#include "rotary/rotary.hpp"
using namespace rotary;
int main(int argc, char** argv) {
  const int64_t T = std::atoi(argv[1]);
  const bool same = argc > 2 && argv[2][0] == 's';
  const Schedule s = make_schedule(Spec{.head_dim = 128, .base = 500000.0});
  std::vector<uint16_t> kc(T * 8 * 128, 0x3f80), k(T * 8 * 128, 0x3f80);
  std::vector<int64_t> slot(T), delta(T), pos(T);
  for (int64_t t = 0; t < T; ++t) { slot[t] = t; delta[t] = same ? -512 : -(t % 977) - 1; pos[t] = t; }
  RerotateCacheArgs a{.cache = CacheView::nhd(kc.data(), DType::bf16, T, 1, 8, 128), .slots = Slots::of(std::span<const int64_t>(slot)), .mode = RerotateMode::delta, .delta = delta.data(), .threads = 1};
  const Table tab = Table::at(s, pos);
  const ApplyArgs ap{.q = TensorView::bshd(k.data(), DType::bf16, 1, T, 8, 128), .positions = Positions::per_token(std::span<const int64_t>(pos)), .table = &tab, .threads = 1};
  for (int op = 0; op < 2; ++op) {
    std::vector<double> ns;
    for (int r = 0; r < 5; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      if (op == 0) rerotate_cache(s, a); else apply(s, ap);
      ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ns.begin(), ns.end());
    std::printf("%s T=%ld: %.1f us\n", op == 0 ? "rerotate_cache" : "apply(table)", (long)T, ns[2] / 1e3);
  }
}
