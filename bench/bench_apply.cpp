// Google Benchmark suite for developers (not part of `make test`): apply on Llama-3.1-8B shapes,
// memcpy of the same bytes, and a llama.cpp-style scalar loop for scale. Build with
// -DROTARY_BUILD_BENCH=ON; run build/bench_apply. The ratio figures of record come from
// `rotary bench`, which times memcpy of the same bytes interleaved in the same process.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "rotary/rotary.hpp"

namespace {

constexpr int64_t kHeads = 32;
constexpr int64_t kHeadDim = 128;

rotary::Schedule llama31() {
  return rotary::make_schedule(rotary::Spec{.head_dim = kHeadDim, .base = 500000.0,
                                            .schedule = rotary::ScheduleType::llama3, .factor = 8.0,
                                            .original_max_position = 8192, .low_freq_factor = 1.0,
                                            .high_freq_factor = 4.0});
}

std::vector<float> random_q(int64_t seq) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> q(static_cast<size_t>(seq * kHeads * kHeadDim));
  for (float& x : q) x = normal(rng);
  return q;
}

// args: seq, table?, dtype (0 f32, 3 bf16), threads, first position
void BM_Apply(benchmark::State& state) {
  const int64_t seq = state.range(0);
  const bool table_angles = state.range(1) != 0;
  const auto dtype = static_cast<rotary::DType>(state.range(2));
  const int threads = static_cast<int>(state.range(3));
  const int64_t first = state.range(4);
  const rotary::Schedule schedule = llama31();
  const rotary::Table table = rotary::Table::range(schedule, first, seq);
  std::vector<unsigned char> q(static_cast<size_t>(seq * kHeads * kHeadDim * rotary::size_of(dtype)));
  const std::vector<float> values = random_q(seq);
  if (dtype == rotary::DType::f32) std::memcpy(q.data(), values.data(), q.size());
  const auto view = rotary::TensorView::bshd(q.data(), dtype, 1, seq, kHeads, kHeadDim);
  for (auto _ : state) {
    rotary::apply(schedule, {.q = view, .positions = rotary::Positions::sequential(first),
                             .table = table_angles ? &table : nullptr, .threads = threads});
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(2 * q.size()));
}

// For scale: the llama.cpp approach (ggml's CPU rope, NEOX pairing), written from its description:
// per token, cosf/sinf of the float32 angle p * inv_freq for every pair (shared by the heads), then
// a scalar float rotation of every head. Single-threaded. args: seq, first position.
void BM_GgmlStyleScalar(benchmark::State& state) {
  const int64_t seq = state.range(0);
  const int64_t first = state.range(1);
  const rotary::Schedule schedule = llama31();
  const int64_t pairs = kHeadDim / 2;
  std::vector<float> inv_freq(schedule.inv_freq.begin(), schedule.inv_freq.end());
  std::vector<float> q = random_q(seq);
  std::vector<float> c(static_cast<size_t>(pairs)), s(static_cast<size_t>(pairs));
  for (auto _ : state) {
    for (int64_t t = 0; t < seq; ++t) {
      const auto p = static_cast<float>(first + t);
      for (int64_t i = 0; i < pairs; ++i) {
        const float theta = p * inv_freq[static_cast<size_t>(i)];
        c[static_cast<size_t>(i)] = std::cos(theta);
        s[static_cast<size_t>(i)] = std::sin(theta);
      }
      for (int64_t h = 0; h < kHeads; ++h) {
        float* x = q.data() + (t * kHeads + h) * kHeadDim;
        for (int64_t i = 0; i < pairs; ++i) {
          const float x0 = x[i], x1 = x[i + pairs];
          x[i] = x0 * c[static_cast<size_t>(i)] - x1 * s[static_cast<size_t>(i)];
          x[i + pairs] = x0 * s[static_cast<size_t>(i)] + x1 * c[static_cast<size_t>(i)];
        }
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(2 * q.size() * sizeof(float)));
}

void BM_Memcpy(benchmark::State& state) {
  std::vector<unsigned char> src(static_cast<size_t>(state.range(0))), dst(src.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(2 * src.size()));
}

}  // namespace

BENCHMARK(BM_Apply)->ArgsProduct({{1, 4096}, {0, 1}, {0, 3}, {1, 0}, {131071}})->UseRealTime();
BENCHMARK(BM_Apply)->Args({4096, 1, 0, 1, 0})->Args({4096, 0, 0, 1, 0})->UseRealTime();
BENCHMARK(BM_GgmlStyleScalar)->Args({1, 131071})->Args({4096, 0})->UseRealTime();
BENCHMARK(BM_Memcpy)->Arg(4096 * 32 * 128 * 4)->Arg(4096 * 32 * 128 * 2)->Arg(32 * 128 * 4)->UseRealTime();
BENCHMARK_MAIN();
