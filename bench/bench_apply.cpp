// Google Benchmark suite for developers (not part of `make test`): apply on Llama-3.1-8B shapes.
// Build with -DROTARY_BUILD_BENCH=ON; run build/bench_apply. The ratio figures of record come from
// `rotary bench`, which times memcpy of the same bytes in the same process.
#include <benchmark/benchmark.h>

#include <cstring>

#include <vector>

#include "rotary/rotary.hpp"

namespace {

rotary::Schedule llama31() {
  return rotary::make_schedule(rotary::Spec{.head_dim = 128, .base = 500000.0,
                                            .schedule = rotary::ScheduleType::llama3, .factor = 8.0,
                                            .original_max_position = 8192, .low_freq_factor = 1.0,
                                            .high_freq_factor = 4.0});
}

void BM_Apply(benchmark::State& state) {
  const int64_t seq = state.range(0);
  const bool table_angles = state.range(1) != 0;
  const auto dtype = static_cast<rotary::DType>(state.range(2));
  const int threads = static_cast<int>(state.range(3));
  const rotary::Schedule schedule = llama31();
  const rotary::Table table = rotary::Table::range(schedule, 0, seq);
  std::vector<unsigned char> q(static_cast<size_t>(seq * 32 * 128 * rotary::size_of(dtype)));
  const auto view = rotary::TensorView::bshd(q.data(), dtype, 1, seq, 32, 128);
  for (auto _ : state) {
    rotary::apply(schedule, {.q = view, .table = table_angles ? &table : nullptr, .threads = threads});
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(2 * q.size()));
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

// args: seq, table?, dtype (0 f32, 3 bf16), threads
BENCHMARK(BM_Apply)->ArgsProduct({{1, 4096}, {0, 1}, {0, 3}, {1, 0}})->UseRealTime();
BENCHMARK(BM_Memcpy)->Arg(4096 * 32 * 128 * 4)->Arg(4096 * 32 * 128 * 2)->Arg(32 * 128 * 4)->UseRealTime();
BENCHMARK_MAIN();
