// Instructions per rotary::apply call on the table path, for bench/record-issue24-2core.md: decode
// (q 32 heads + k 8 heads, one token) and batched decode (64 tokens, per-token positions, a list
// table), f32, in place, one thread. Not part of the build; against a build tree's librotary.a:
//   g++ -O2 -std=c++20 bench/callgrind_apply.cpp -Iinclude -Lbuild -lrotary -lhwy -lfmt -fopenmp -o /tmp/apply_calls
//   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$B \
//     --toggle-collect='rotary::apply(rotary::Schedule const&, rotary::ApplyArgs const&)' /tmp/apply_calls 700 $B
//   callgrind_annotate /tmp/cg.$B | grep 'PROGRAM TOTALS'     # divided by 700; B = 1 or 64
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <algorithm>
#include "rotary/rotary.hpp"
using namespace rotary;
int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 200000;
  const int64_t batch = argc > 2 ? std::atoi(argv[2]) : 1;
  const Schedule s = make_schedule(Spec{.head_dim = 128, .base = 500000.0, .pairing = Pairing::half,
      .schedule = ScheduleType::llama3, .factor = 8.0, .original_max_position = 8192,
      .low_freq_factor = 1.0, .high_freq_factor = 4.0});
  std::vector<int64_t> pos(static_cast<size_t>(batch));
  std::mt19937_64 rng(1);
  for (auto& p : pos) p = batch == 1 ? 4096 : static_cast<int64_t>(rng() % 4096);
  const Table t = Table::at(s, pos);
  std::vector<float> q(static_cast<size_t>(batch * 32 * 128), 0.5f), k(static_cast<size_t>(batch * 8 * 128), 0.25f);
  ApplyArgs a{.q = TensorView::bshd(q.data(), DType::f32, batch, 1, 32, 128),
              .k = TensorView::bshd(k.data(), DType::f32, batch, 1, 8, 128),
              .positions = Positions::per_token(std::span<const int64_t>(pos)), .table = &t, .threads = 1};
  std::vector<double> times;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls / 7; ++i) apply(s, a);
    times.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / (calls / 7));
  }
  std::sort(times.begin(), times.end());
  std::printf("%.1f ns per call (median of 7)\n", times[3]);
}
