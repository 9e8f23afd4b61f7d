#include "bench.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "../src/text.hpp"
#include "commands.hpp"
#include "parse.hpp"
#include "rotary/rotary.hpp"

namespace rotary::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Llama-3.1-8B shapes: 32 query heads, 8 key/value heads, head_dim 128.
struct Case {
  const char* name;
  int64_t batch, seq, heads;
};
constexpr Case kCases[] = {{"prefill_q", 1, 4096, 32},
                           {"prefill_k", 1, 4096, 8},
                           {"decode", 1, 1, 32},
                           {"batched_decode", 64, 1, 32}};
constexpr int64_t kHeadDim = 128;
constexpr int64_t kDecodePosition = 131071;
// Working sets, the same for the kernel and for memcpy. Decode-sized operations (at most 2 MiB)
// rotate among 4 to 16 buffers holding at most 8 MiB of inputs and outputs: they stay resident in
// the last-level cache, as q and k are when the projection that wrote them has just finished, yet
// no repetition finds its buffer in L1 from the previous one, and the inputs are too many for a
// branch predictor to learn (the scalar reference branches on the data; in inference every call
// brings new values). Larger (prefill) operations cycle through enough buffers to exceed 96 MiB,
// far beyond the last-level cache, so both sides stream from DRAM.
constexpr int64_t kCachedOperationBytes = int64_t{2} << 20;
constexpr int64_t kCachedWorkingSetBytes = int64_t{8} << 20;
constexpr int64_t kStreamingWorkingSetBytes = int64_t{96} << 20;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// memcpy of `bytes` split over `threads` (the same split the kernel gets).
void parallel_copy(unsigned char* dst, const unsigned char* src, int64_t bytes, int threads) {
  if (threads <= 1) {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t n = omp_get_num_threads();
    const int64_t me = omp_get_thread_num();
    const int64_t first = bytes * me / n;
    const int64_t last = bytes * (me + 1) / n;
    std::memcpy(dst + first, src + first, static_cast<size_t>(last - first));
  }
}

Schedule llama31(Pairing pairing) {
  return make_schedule(Spec{.head_dim = kHeadDim, .base = 500000.0, .pairing = pairing,
                            .schedule = ScheduleType::llama3, .factor = 8.0,
                            .original_max_position = 8192, .low_freq_factor = 1.0,
                            .high_freq_factor = 4.0});
}

template <class T>
bool contains(const std::vector<T>& list, const T& value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

void check_list(const std::vector<std::string>& given, const std::vector<std::string>& allowed,
                const char* option) {
  if (given.empty()) throw Error(fmt::format("{} is empty", option));
  for (const auto& g : given) {
    if (!contains(allowed, g)) {
      throw Error(fmt::format("{}='{}' must be one of {}", option, detail::excerpt(g), fmt::join(allowed, ", ")));
    }
  }
}

struct Row {
  std::string case_name, dtype, pairing, angles;
  bool inplace;
  int threads;
  double median_ns, gbps, memcpy_median_ns, ratio_to_memcpy, speedup_vs_reference;
};

}  // namespace

int run_bench(const BenchOptions& o, std::ostream& out) {
  check_list(o.cases, {"prefill_q", "prefill_k", "decode", "batched_decode"}, "--cases");
  check_list(o.dtypes, {"f32", "bf16", "f16"}, "--dtypes");
  check_list(o.pairings, {"half", "interleaved"}, "--pairings");
  check_list(o.angles, {"table", "on_the_fly"}, "--angles");
  check_list(o.placement, {"inplace", "outofplace"}, "--placement");
  if (o.reps < 3 || o.reps > 1000) throw Error(fmt::format("--reps={} must be in [3, 1000]", o.reps));
  std::vector<int> thread_counts = o.threads;
  const int all = omp_get_max_threads();
  if (thread_counts.empty()) {
    thread_counts = {1};
    if (all > 1) thread_counts.push_back(all);
  }
  for (int t : thread_counts) check_threads(t, "--threads");

  std::vector<Row> rows;
  std::mt19937_64 rng(o.seed);
  for (const Case& c : kCases) {
    if (!contains(o.cases, std::string(c.name))) continue;
    const int64_t tokens = c.batch * c.seq;
    std::vector<int64_t> positions(static_cast<size_t>(tokens));
    if (std::string(c.name) == "batched_decode") {
      std::uniform_int_distribution<int64_t> any(0, kDecodePosition);
      for (auto& p : positions) p = any(rng);
    } else {
      const int64_t first = c.seq == 1 ? kDecodePosition : 0;
      for (int64_t t = 0; t < tokens; ++t) positions[static_cast<size_t>(t)] = first + t;
    }
    for (const std::string& dtype_name : o.dtypes) {
      const DType dtype = dtype_name == "f32" ? DType::f32 : dtype_name == "bf16" ? DType::bf16 : DType::f16;
      const int64_t elements = tokens * c.heads * kHeadDim;
      const int64_t op_bytes = elements * size_of(dtype);
      const int64_t buffers = op_bytes <= kCachedOperationBytes
                                  ? std::clamp<int64_t>(kCachedWorkingSetBytes / (2 * op_bytes), 4, 16)
                                  : std::max<int64_t>(1, kStreamingWorkingSetBytes / op_bytes);
      // Inputs (also rotated in place), outputs (out of place and memcpy destinations).
      std::vector<unsigned char> in(static_cast<size_t>(buffers * op_bytes));
      std::vector<unsigned char> dst(static_cast<size_t>(buffers * op_bytes));
      {
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (int64_t i = 0; i < buffers * elements; ++i) {
          const float v = normal(rng);
          if (dtype == DType::f32) {
            std::memcpy(&in[static_cast<size_t>(i * 4)], &v, 4);
          } else {
            uint32_t bits;
            std::memcpy(&bits, &v, 4);
            const auto h = static_cast<uint16_t>(bits >> 16);  // any bf16/f16 pattern will do
            std::memcpy(&in[static_cast<size_t>(i * 2)], &h, 2);
          }
        }
        std::memset(dst.data(), 0, dst.size());
      }
      for (const std::string& pairing_name : o.pairings) {
        const Schedule schedule = llama31(parse_pairing(pairing_name));
        const Table table = Table::at(schedule, positions);
        for (const std::string& angles : o.angles) {
          for (const std::string& placement : o.placement) {
            const bool inplace = placement == "inplace";
            auto args_for = [&](int64_t k, int threads, Backend backend) {
              ApplyArgs a{
                  .q = TensorView::bshd(in.data() + k * op_bytes, dtype, c.batch, c.seq, c.heads, kHeadDim),
                  .positions = Positions::per_token(positions),
                  .table = angles == "table" ? &table : nullptr,
                  .threads = threads,
                  .backend = backend};
              if (!inplace) {
                a.q_out = TensorView::bshd(dst.data() + k * op_bytes, dtype, c.batch, c.seq, c.heads, kHeadDim);
              }
              return a;
            };
            // One repetition: ops_per_rep operations cycling through the buffers (at least 64, so
            // that a decode repetition lasts tens of microseconds); time per operation.
            const int64_t ops_per_rep = std::max<int64_t>(buffers, op_bytes <= kCachedOperationBytes ? 64 : 1);
            auto time_kernel = [&](int threads, Backend backend) {
              const auto start = Clock::now();
              for (int64_t k = 0; k < ops_per_rep; ++k) apply(schedule, args_for(k % buffers, threads, backend));
              return std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                     static_cast<double>(ops_per_rep);
            };
            auto time_copy = [&](int threads) {
              const auto start = Clock::now();
              for (int64_t k = 0; k < ops_per_rep; ++k) {
                const int64_t buffer = k % buffers;
                parallel_copy(dst.data() + buffer * op_bytes, in.data() + buffer * op_bytes, op_bytes, threads);
              }
              return std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                     static_cast<double>(ops_per_rep);
            };
            // The scalar reference, single-threaded (fewer repetitions for the long cases).
            std::vector<double> reference_ns;
            const int reference_reps = op_bytes >= (int64_t{8} << 20) ? 3 : 5;
            time_kernel(1, Backend::reference);
            for (int r = 0; r < reference_reps; ++r) reference_ns.push_back(time_kernel(1, Backend::reference));
            const double reference = median(reference_ns);
            for (int threads : thread_counts) {
              const int effective = threads == 0 ? all : threads;
              std::vector<double> kernel_ns, copy_ns;
              for (int w = 0; w < 2; ++w) {  // warm-up
                time_kernel(effective, Backend::automatic);
                time_copy(effective);
              }
              for (int r = 0; r < o.reps; ++r) {  // interleaved
                kernel_ns.push_back(time_kernel(effective, Backend::automatic));
                copy_ns.push_back(time_copy(effective));
              }
              Row row{c.name, dtype_name, pairing_name, angles, inplace, effective, median(kernel_ns), 0,
                      median(copy_ns), 0, 0};
              row.gbps = 2.0 * static_cast<double>(op_bytes) / row.median_ns;
              row.ratio_to_memcpy = row.median_ns / row.memcpy_median_ns;
              row.speedup_vs_reference = reference / row.median_ns;
              rows.push_back(row);
            }
          }
        }
      }
    }
  }

  if (o.json) {
    std::string text = "[\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      const std::pair<double, const char*> numbers[] = {
          {r.median_ns, "median_ns"}, {r.gbps, "gbps"}, {r.memcpy_median_ns, "memcpy_median_ns"},
          {r.ratio_to_memcpy, "ratio_to_memcpy"}, {r.speedup_vs_reference, "speedup_vs_reference"}};
      for (const auto& [value, name] : numbers) require_finite_for_json(value, fmt::format("{} of {}", name, r.case_name));
      text += fmt::format(
          "{{\"case\":\"{}\",\"dtype\":\"{}\",\"pairing\":\"{}\",\"angles\":\"{}\",\"inplace\":{},"
          "\"threads\":{},\"median_ns\":{:.1f},\"gbps\":{:.3f},\"memcpy_median_ns\":{:.1f},"
          "\"ratio_to_memcpy\":{:.4f},\"speedup_vs_reference\":{:.2f}}}{}\n",
          r.case_name, r.dtype, r.pairing, r.angles, r.inplace ? "true" : "false", r.threads, r.median_ns,
          r.gbps, r.memcpy_median_ns, r.ratio_to_memcpy, r.speedup_vs_reference, i + 1 < rows.size() ? "," : "");
    }
    out << text << "]\n";
    return 0;
  }
  out << fmt::format("rotary bench — Llama-3.1-8B shapes, head_dim 128; medians of {} interleaved "
                     "repetitions; GB/s counts bytes read + written; memcpy of the same bytes on the "
                     "same threads; decode cases rotate among 4-16 cache-resident buffers (<= 8 MiB), prefill cases "
                     "stream from DRAM (> 96 MiB)\n",
                     o.reps);
  out << fmt::format("{:<15} {:<5} {:<12} {:<10} {:<11} {:>3} {:>11} {:>8} {:>11} {:>9} {:>9}\n", "case",
                     "dtype", "pairing", "angles", "placement", "thr", "median_us", "GB/s", "memcpy_us",
                     "/memcpy", "x scalar");
  for (const Row& r : rows) {
    out << fmt::format("{:<15} {:<5} {:<12} {:<10} {:<11} {:>3} {:>11.3f} {:>8.2f} {:>11.3f} {:>9.3f} {:>9.1f}\n",
                       r.case_name, r.dtype, r.pairing, r.angles, r.inplace ? "in place" : "out of place",
                       r.threads, r.median_ns / 1e3, r.gbps, r.memcpy_median_ns / 1e3, r.ratio_to_memcpy,
                       r.speedup_vs_reference);
  }
  return 0;
}

}  // namespace rotary::cli
