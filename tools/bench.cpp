#include "bench.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <tuple>

#include "../src/text.hpp"
#include "commands.hpp"
#include "parse.hpp"
#include "rotary/rotary.hpp"

namespace rotary::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Llama-3.1-8B shapes: 32 query heads, 8 key/value heads, head_dim 128. Decode cases rotate q and
// k in one call (32 + 8 heads). `mrope` is prefill q under Qwen2-VL's 3-stream M-RoPE (half
// pairing only), timed against the same call with a single stream.
struct Case {
  const char* name;
  int64_t batch, seq, heads_q, heads_k;
  bool mrope;
};
constexpr Case kCases[] = {{"prefill_q", 1, 4096, 32, 0, false},
                           {"prefill_k", 1, 4096, 8, 0, false},
                           {"decode", 1, 1, 32, 8, false},
                           {"batched_decode", 64, 1, 32, 8, false},
                           {"mrope", 1, 4096, 32, 0, true}};
constexpr int64_t kHeadDim = 128;
constexpr int64_t kDecodePosition = 131071;
// Qwen2-VL's mrope_section: pairs [0, 16) read the temporal stream, [16, 40) height, [40, 64) width.
constexpr int64_t kMropeSection[] = {16, 24, 24};
// The M-RoPE sequence: a text prefix (t = h = w = s), then video frames of a square grid.
constexpr int64_t kMropeText = 1024;
constexpr int64_t kMropeGrid = 32;
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
// Outputs start this far past a page boundary relative to their inputs: glibc's memcpy (rep movsb)
// on some AMD processors runs ~10x slower when destination and source share their offset in a
// 4 KiB page, which would make the memcpy baseline, not the kernel, the slow side.
constexpr int64_t kOutputSkew = 1024 + 64;
constexpr uintptr_t kBufferAlignment = 64;
// apply runs one thread below this many bytes moved (src/cpu/dispatch.cpp); memcpy does the same.
constexpr int64_t kParallelBytes = int64_t{1} << 18;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// `work(first, last)` over [0, bytes) split in contiguous ranges over `threads` (the split the
// kernel gets; one thread below kParallelBytes moved, as apply).
template <class Work>
void split_bytes(int64_t bytes, int threads, Work work) {
  if (threads <= 1 || 2 * bytes < kParallelBytes) {
    work(int64_t{0}, bytes);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t n = omp_get_num_threads();
    const int64_t me = omp_get_thread_num();
    work(bytes * me / n, bytes * (me + 1) / n);
  }
}

// memcpy of `bytes` split over `threads`.
void parallel_copy(unsigned char* dst, const unsigned char* src, int64_t bytes, int threads) {
  split_bytes(bytes, threads, [&](int64_t first, int64_t last) {
    std::memcpy(dst + first, src + first, static_cast<size_t>(last - first));
  });
}

// Every byte of `bytes` loaded and stored back in place, split as parallel_copy splits: the traffic
// any in-place kernel must cause (its floor), with no arithmetic. 16-byte words kept opaque to the
// compiler, so that neither the loads nor the stores are elided.
void touch_words(unsigned char* p, int64_t bytes) {
  int64_t i = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  using Word = long long __attribute__((vector_size(16)));
  for (; i + 16 <= bytes; i += 16) {
    Word w;
    std::memcpy(&w, p + i, 16);
    asm volatile("" : "+x"(w));
    std::memcpy(p + i, &w, 16);
  }
#endif
  for (; i < bytes; ++i) {
    unsigned char v = p[i];
    asm volatile("" : "+r"(v));
    p[i] = v;
  }
}
void parallel_touch(unsigned char* p, int64_t bytes, int threads) {
  split_bytes(bytes, threads, [&](int64_t first, int64_t last) { touch_words(p + first, last - first); });
}

Schedule llama31(Pairing pairing) {
  return make_schedule(Spec{.head_dim = kHeadDim, .base = 500000.0, .pairing = pairing,
                            .schedule = ScheduleType::llama3, .factor = 8.0,
                            .original_max_position = 8192, .low_freq_factor = 1.0,
                            .high_freq_factor = 4.0});
}

// Qwen2-VL's text rotary (base 10^6, half pairing); `streams` 3: M-RoPE by mrope_section, 1: the
// same frequencies with one stream.
Schedule qwen2_vl(int streams) {
  Schedule schedule = make_schedule(Spec{.head_dim = kHeadDim, .base = 1000000.0, .pairing = Pairing::half});
  if (streams == 3) {
    schedule.streams = 3;
    for (int k = 0; k < 3; ++k) schedule.pair_stream.insert(schedule.pair_stream.end(), kMropeSection[k], k);
    validate(schedule);
  }
  return schedule;
}

// Qwen2-VL position_ids [3, 1, seq]: text tokens at s in every stream, then video frames at
// (first + frame, first + row, first + column).
std::vector<int64_t> mrope_positions(int64_t seq) {
  std::vector<int64_t> p(static_cast<size_t>(3 * seq));
  for (int64_t s = 0; s < seq; ++s) {
    int64_t t = s, h = s, w = s;
    if (s >= kMropeText) {
      const int64_t v = s - kMropeText;
      t = kMropeText + v / (kMropeGrid * kMropeGrid);
      h = kMropeText + v / kMropeGrid % kMropeGrid;
      w = kMropeText + v % kMropeGrid;
    }
    p[static_cast<size_t>(s)] = t;
    p[static_cast<size_t>(seq + s)] = h;
    p[static_cast<size_t>(2 * seq + s)] = w;
  }
  return p;
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

// The target a row must meet: a ratio to memcpy, or for M-RoPE to the same call with one stream.
struct Target {
  double limit;
  const char* against;  // "memcpy" or "single_stream"
};
Target target_of(const Case& c, DType dtype, bool table, bool inplace) {
  const std::string name = c.name;
  if (c.mrope) return {1.05, "single_stream"};
  if (name == "decode") return {table ? 2.0 : 3.0, "memcpy"};
  if (name == "batched_decode") return {dtype == DType::f32 ? 1.5 : 2.0, "memcpy"};
  return {inplace ? 0.60 : 1.05, "memcpy"};
}

struct Row {
  std::string case_name, dtype, pairing, angles;
  bool inplace;
  int threads;
  double median_ns, gbps, memcpy_median_ns, ratio_to_memcpy, speedup_vs_reference;
  double single_stream_median_ns;  // mrope only, else 0
  double touch_median_ns;          // in place only, else 0: load and store every byte in place
  double compute_floor;            // compute_ns_per_element scaled to the case, over memcpy
  Target target;
  double ratio;  // the one the target bounds
  bool pass;
};

std::string json_row(const Row& r) {
  const std::pair<double, const char*> numbers[] = {
      {r.median_ns, "median_ns"}, {r.gbps, "gbps"}, {r.memcpy_median_ns, "memcpy_median_ns"},
      {r.ratio_to_memcpy, "ratio_to_memcpy"}, {r.speedup_vs_reference, "speedup_vs_reference"},
      {r.single_stream_median_ns, "single_stream_median_ns"}, {r.touch_median_ns, "touch_median_ns"},
      {r.compute_floor, "compute_floor"},
      {r.ratio, "ratio"}};
  for (const auto& [value, name] : numbers) require_finite_for_json(value, fmt::format("{} of {}", name, r.case_name));
  std::string single = fmt::format(",\"compute_floor_ratio\":{:.4f}", r.compute_floor);
  if (r.touch_median_ns > 0) {
    single += fmt::format(",\"touch_median_ns\":{:.1f},\"touch_ratio_to_memcpy\":{:.4f}", r.touch_median_ns,
                          r.touch_median_ns / r.memcpy_median_ns);
  }
  if (r.single_stream_median_ns > 0) {
    single += fmt::format(",\"single_stream_median_ns\":{:.1f},\"ratio_to_single_stream\":{:.4f}",
                         r.single_stream_median_ns, r.ratio);
  }
  return fmt::format(
      "{{\"case\":\"{}\",\"dtype\":\"{}\",\"pairing\":\"{}\",\"angles\":\"{}\",\"inplace\":{},"
      "\"threads\":{},\"median_ns\":{:.1f},\"gbps\":{:.3f},\"memcpy_median_ns\":{:.1f},"
      "\"ratio_to_memcpy\":{:.4f},\"speedup_vs_reference\":{:.2f}{},\"target\":{:.2f},"
      "\"target_against\":\"{}\",\"pass\":{}}}",
      r.case_name, r.dtype, r.pairing, r.angles, r.inplace ? "true" : "false", r.threads, r.median_ns,
      r.gbps, r.memcpy_median_ns, r.ratio_to_memcpy, r.speedup_vs_reference, single, r.target.limit,
      r.target.against, r.pass ? "true" : "false");
}

// Inputs and outputs of `buffers` operations, q then k in each, random values. Both start on a
// 64-byte boundary, as the allocators of PyTorch, NumPy and every ML framework give them.
struct Buffers {
  int64_t count, op_bytes, q_bytes;
  std::vector<unsigned char> in_storage, dst_storage;
  static unsigned char* aligned(std::vector<unsigned char>& v) {
    const auto address = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + (kBufferAlignment - address % kBufferAlignment) % kBufferAlignment;
  }
  unsigned char* in(int64_t k) { return aligned(in_storage) + k * op_bytes; }
  unsigned char* out(int64_t k) { return aligned(dst_storage) + kOutputSkew + k * op_bytes; }
};

Buffers make_buffers(const Case& c, DType dtype, std::mt19937_64& rng) {
  const int64_t tokens = c.batch * c.seq;
  const int64_t elements = tokens * (c.heads_q + c.heads_k) * kHeadDim;
  Buffers b;
  b.op_bytes = elements * size_of(dtype);
  b.q_bytes = tokens * c.heads_q * kHeadDim * size_of(dtype);
  b.count = b.op_bytes <= kCachedOperationBytes
                ? std::clamp<int64_t>(kCachedWorkingSetBytes / (2 * b.op_bytes), 4, 16)
                : std::max<int64_t>(1, kStreamingWorkingSetBytes / b.op_bytes);
  // Inputs (also rotated in place), outputs (out of place and memcpy destinations).
  b.in_storage.resize(static_cast<size_t>(b.count * b.op_bytes) + kBufferAlignment);
  b.dst_storage.assign(static_cast<size_t>(b.count * b.op_bytes + kOutputSkew) + kBufferAlignment, 0);
  unsigned char* in = b.in(0);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < b.count * elements; ++i) {
    const float v = normal(rng);
    if (dtype == DType::f32) {
      std::memcpy(in + i * 4, &v, 4);
    } else {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const auto h = static_cast<uint16_t>(bits >> 16);  // any bf16/f16 pattern will do
      std::memcpy(in + i * 2, &h, 2);
    }
  }
  return b;
}

// The kernel's cost per element when memory costs (almost) nothing: q and k of 4 decode tokens
// (80 KiB at f32), cache-resident, rotated over and over in one buffer on one thread. Scaled to a
// case's elements and threads and divided by its memcpy time, it is the ratio the kernel would
// reach if every byte came from the cache: its compute floor.
double compute_ns_per_element(DType dtype, Pairing pairing, bool use_table, bool inplace, int reps) {
  constexpr int64_t kTokens = 4, kHeadsQ = 32, kHeadsK = 8, kCalls = 200;
  const Schedule schedule = llama31(pairing);
  std::vector<int64_t> positions(kTokens);
  std::iota(positions.begin(), positions.end(), kDecodePosition);
  const Table table = Table::at(schedule, positions);
  const int64_t es = size_of(dtype);
  const int64_t elements = kTokens * (kHeadsQ + kHeadsK) * kHeadDim;
  const int64_t q_bytes = kTokens * kHeadsQ * kHeadDim * es;
  std::vector<unsigned char> in_storage(static_cast<size_t>(elements * es) + kBufferAlignment);
  std::vector<unsigned char> out_storage(in_storage.size());
  unsigned char* in = Buffers::aligned(in_storage);
  unsigned char* out = Buffers::aligned(out_storage);
  for (int64_t i = 0; i < elements; ++i) {  // 1.0 in every dtype: rotations keep it bounded
    if (dtype == DType::f32) {
      const float one = 1.0f;
      std::memcpy(in + i * 4, &one, 4);
    } else {
      const uint16_t one = dtype == DType::f16 ? 0x3c00 : 0x3f80;
      std::memcpy(in + i * 2, &one, 2);
    }
  }
  ApplyArgs a{.q = TensorView::bshd(in, dtype, 1, kTokens, kHeadsQ, kHeadDim),
              .k = TensorView::bshd(in + q_bytes, dtype, 1, kTokens, kHeadsK, kHeadDim),
              .positions = Positions::per_token(positions),
              .table = use_table ? &table : nullptr,
              .threads = 1};
  if (!inplace) {
    a.q_out = TensorView::bshd(out, dtype, 1, kTokens, kHeadsQ, kHeadDim);
    a.k_out = TensorView::bshd(out + q_bytes, dtype, 1, kTokens, kHeadsK, kHeadDim);
  }
  std::vector<double> per_element;
  for (int r = 0; r < reps + 2; ++r) {  // the first two warm up
    const auto start = Clock::now();
    for (int64_t k = 0; k < kCalls; ++k) apply(schedule, a);
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    if (r >= 2) per_element.push_back(ns / static_cast<double>(kCalls * elements));
  }
  return median(per_element);
}

// One way to call apply: its schedule, positions and table.
struct Variant {
  const Schedule* schedule;
  Positions positions;
  const Table* table;
};

}  // namespace

int run_bench(const BenchOptions& o, std::ostream& out) {
  check_list(o.cases, {"prefill_q", "prefill_k", "decode", "batched_decode", "mrope"}, "--cases");
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
  std::map<std::tuple<std::string, std::string, bool, bool>, double> compute_cost;  // ns per element
  std::mt19937_64 rng(o.seed);
  for (const Case& c : kCases) {
    if (!contains(o.cases, std::string(c.name))) continue;
    if (c.mrope && !contains(o.pairings, std::string("half"))) continue;
    const int64_t tokens = c.batch * c.seq;
    std::vector<int64_t> positions(static_cast<size_t>(tokens));
    if (std::string(c.name) == "batched_decode") {
      std::uniform_int_distribution<int64_t> any(0, kDecodePosition);
      for (auto& p : positions) p = any(rng);
    } else {
      const int64_t first = c.seq == 1 ? kDecodePosition : 0;
      for (int64_t t = 0; t < tokens; ++t) positions[static_cast<size_t>(t)] = first + t;
    }
    const std::vector<int64_t> stream_positions = c.mrope ? mrope_positions(c.seq) : std::vector<int64_t>{};
    for (const std::string& dtype_name : o.dtypes) {
      const DType dtype = dtype_name == "f32" ? DType::f32 : dtype_name == "bf16" ? DType::bf16 : DType::f16;
      Buffers buf = make_buffers(c, dtype, rng);
      const int64_t op_bytes = buf.op_bytes;
      for (const std::string& pairing_name : o.pairings) {
        if (c.mrope && pairing_name != "half") continue;
        // The measured call, and (M-RoPE) the single-stream call it is compared with. M-RoPE
        // tables cover the sequence's positions, 0 .. seq-1, as the single-stream one does.
        const Schedule schedule = c.mrope ? qwen2_vl(3) : llama31(parse_pairing(pairing_name));
        const Schedule single = qwen2_vl(1);
        const Table table = c.mrope ? Table::range(schedule, 0, c.seq) : Table::at(schedule, positions);
        const Table single_table = Table::range(single, 0, c.mrope ? c.seq : 1);
        for (const std::string& angles : o.angles) {
          const bool use_table = angles == "table";
          const Variant main{&schedule,
                             c.mrope ? Positions::per_token(stream_positions, 3) : Positions::per_token(positions),
                             use_table ? &table : nullptr};
          const Variant reference_stream{&single, Positions::per_token(positions), use_table ? &single_table : nullptr};
          for (const std::string& placement : o.placement) {
            const bool inplace = placement == "inplace";
            auto args_for = [&](int64_t k, int threads, Backend backend, const Variant& v) {
              unsigned char* in = buf.in(k);
              unsigned char* dst = buf.out(k);
              ApplyArgs a{.q = TensorView::bshd(in, dtype, c.batch, c.seq, c.heads_q, kHeadDim),
                          .positions = v.positions,
                          .table = v.table,
                          .threads = threads,
                          .backend = backend};
              if (c.heads_k > 0) a.k = TensorView::bshd(in + buf.q_bytes, dtype, c.batch, c.seq, c.heads_k, kHeadDim);
              if (!inplace) {
                a.q_out = TensorView::bshd(dst, dtype, c.batch, c.seq, c.heads_q, kHeadDim);
                if (c.heads_k > 0) {
                  a.k_out = TensorView::bshd(dst + buf.q_bytes, dtype, c.batch, c.seq, c.heads_k, kHeadDim);
                }
              }
              return a;
            };
            // One repetition: ops_per_rep operations cycling through the buffers (at least 64, so
            // that a decode repetition lasts tens of microseconds); time per operation.
            const int64_t ops_per_rep = std::max<int64_t>(buf.count, op_bytes <= kCachedOperationBytes ? 64 : 1);
            auto time_kernel = [&](int threads, Backend backend, const Variant& v) {
              const auto start = Clock::now();
              for (int64_t k = 0; k < ops_per_rep; ++k) apply(*v.schedule, args_for(k % buf.count, threads, backend, v));
              return std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                     static_cast<double>(ops_per_rep);
            };
            auto time_copy = [&](int threads) {
              const auto start = Clock::now();
              for (int64_t k = 0; k < ops_per_rep; ++k) {
                const int64_t b = k % buf.count;
                parallel_copy(buf.out(b), buf.in(b), op_bytes, threads);
              }
              return std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                     static_cast<double>(ops_per_rep);
            };
            auto time_touch = [&](int threads) {
              const auto start = Clock::now();
              for (int64_t k = 0; k < ops_per_rep; ++k) parallel_touch(buf.in(k % buf.count), op_bytes, threads);
              return std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                     static_cast<double>(ops_per_rep);
            };
            // The scalar reference, single-threaded (fewer repetitions for the long cases).
            std::vector<double> reference_ns;
            const int reference_reps = op_bytes >= (int64_t{8} << 20) ? 3 : 5;
            time_kernel(1, Backend::reference, main);
            for (int r = 0; r < reference_reps; ++r) reference_ns.push_back(time_kernel(1, Backend::reference, main));
            const double reference = median(reference_ns);
            for (int threads : thread_counts) {
              const int effective = threads == 0 ? all : threads;
              std::vector<double> kernel_ns, copy_ns, single_ns, touch_ns;
              for (int w = 0; w < 2; ++w) {  // warm-up
                time_kernel(effective, Backend::automatic, main);
                if (c.mrope) time_kernel(effective, Backend::automatic, reference_stream);
                time_copy(effective);
              }
              for (int r = 0; r < o.reps; ++r) {  // interleaved
                kernel_ns.push_back(time_kernel(effective, Backend::automatic, main));
                if (c.mrope) single_ns.push_back(time_kernel(effective, Backend::automatic, reference_stream));
                copy_ns.push_back(time_copy(effective));
                if (inplace) touch_ns.push_back(time_touch(effective));
              }
              Row row{c.name, dtype_name, pairing_name, angles, inplace, effective, median(kernel_ns), 0,
                      median(copy_ns), 0, 0, c.mrope ? median(single_ns) : 0.0,
                      inplace ? median(touch_ns) : 0.0, 0, target_of(c, dtype, use_table, inplace), 0, false};
              const auto key = std::make_tuple(dtype_name, pairing_name, use_table, inplace);
              if (!compute_cost.count(key)) {
                compute_cost[key] = compute_ns_per_element(dtype, parse_pairing(pairing_name), use_table, inplace, o.reps);
              }
              const double case_elements = static_cast<double>(op_bytes / size_of(dtype));
              // The threads apply runs (one below kParallelBytes moved, as memcpy here).
              const int used = 2 * op_bytes < kParallelBytes ? 1 : effective;
              row.compute_floor = compute_cost[key] * case_elements / used / row.memcpy_median_ns;
              row.gbps = 2.0 * static_cast<double>(op_bytes) / row.median_ns;
              row.ratio_to_memcpy = row.median_ns / row.memcpy_median_ns;
              row.speedup_vs_reference = reference / row.median_ns;
              row.ratio = c.mrope ? row.median_ns / row.single_stream_median_ns : row.ratio_to_memcpy;
              row.pass = row.ratio <= row.target.limit;
              rows.push_back(row);
            }
          }
        }
      }
    }
  }

  if (o.json) {
    std::string text = "[\n";
    for (size_t i = 0; i < rows.size(); ++i) text += json_row(rows[i]) + (i + 1 < rows.size() ? ",\n" : "\n");
    out << text << "]\n";
    return 0;
  }
  out << fmt::format("rotary bench — Llama-3.1-8B shapes, head_dim 128 (decode: q and k, 32 + 8 heads; "
                     "mrope: Qwen2-VL 3-stream M-RoPE prefill q against the same call with one stream); "
                     "medians of {} interleaved repetitions; GB/s counts bytes read + written; memcpy of "
                     "the same bytes on the same threads; decode cases rotate among 4-16 cache-resident "
                     "buffers (<= 8 MiB), prefill cases stream from DRAM (> 96 MiB); floor: in place, "
                     "loading and storing every byte back with no arithmetic, against memcpy; compute: the kernel's "
                     "time per element on cache-resident data, scaled to the case, against memcpy\n",
                     o.reps);
  out << fmt::format("{:<15} {:<5} {:<12} {:<10} {:<12} {:>3} {:>11} {:>8} {:>11} {:>9} {:>9} {:>6} {:>7} {:>7} {:>6} {}\n",
                     "case", "dtype", "pairing", "angles", "placement", "thr", "median_us", "GB/s", "memcpy_us",
                     "/memcpy", "x scalar", "floor", "compute", "ratio", "target", "pass");
  int passed = 0;
  for (const Row& r : rows) {
    passed += r.pass ? 1 : 0;
    out << fmt::format(
        "{:<15} {:<5} {:<12} {:<10} {:<12} {:>3} {:>11.3f} {:>8.2f} {:>11.3f} {:>9.3f} {:>9.1f} {:>6} {:>7.3f} {:>7.3f} {:>6.2f} {}\n",
        r.case_name, r.dtype, r.pairing, r.angles, r.inplace ? "in place" : "out of place", r.threads,
        r.median_ns / 1e3, r.gbps, r.memcpy_median_ns / 1e3, r.ratio_to_memcpy, r.speedup_vs_reference,
        r.touch_median_ns > 0 ? fmt::format("{:.3f}", r.touch_median_ns / r.memcpy_median_ns) : "-",
        r.compute_floor, r.ratio,
        r.target.limit, r.pass ? "yes" : "NO");
  }
  out << fmt::format("{} of {} rows meet their targets (ratio: to memcpy; mrope: to the single stream)\n",
                     passed, rows.size());
  return 0;
}

}  // namespace rotary::cli
