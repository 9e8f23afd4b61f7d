#include "bench.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <tuple>

#include "../src/math/half.hpp"
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include "../src/text.hpp"
#include "commands.hpp"
#include "parse.hpp"
#include "rotary/rotary.hpp"

namespace rotary::cli {
namespace {

using Clock = std::chrono::steady_clock;

// What a case times: apply; apply under M-RoPE, against the same call with one stream; or a
// long-context operation on cached keys (include/rotary/rerotate.hpp).
enum class Op { apply, mrope, rerotate, switch_schedule };

// Llama-3.1-8B shapes: 32 query heads, 8 key/value heads, head_dim 128. Decode cases rotate q and
// k in one call (32 + 8 heads). `mrope` is prefill q under Qwen2-VL's 3-stream M-RoPE (half
// pairing only), timed against the same call with a single stream. `rerotate` and `switch` move
// the keys of a 4096-token KV cache, [1, 4096, 8, 128] (held where q's heads are): `rerotate` from
// positions 1024 .. 5119 by delta -1024 (StreamingLLM evicting the first 1024 tokens; Llama 3.1's
// schedule), `switch` from LongRoPE's short factors to its long ones at positions 0 .. 4095 (the
// context passing the original 4096).
struct Case {
  const char* name;
  int64_t batch, seq, heads_q, heads_k;
  Op op;
  bool on_keys() const { return op == Op::rerotate || op == Op::switch_schedule; }
};
constexpr Case kCases[] = {{"prefill_q", 1, 4096, 32, 0, Op::apply},
                           {"prefill_k", 1, 4096, 8, 0, Op::apply},
                           {"decode", 1, 1, 32, 8, Op::apply},
                           {"batched_decode", 64, 1, 32, 8, Op::apply},
                           {"mrope", 1, 4096, 32, 0, Op::mrope},
                           {"rerotate", 1, 4096, 8, 0, Op::rerotate},
                           {"switch", 1, 4096, 8, 0, Op::switch_schedule}};
constexpr int64_t kHeadDim = kBenchHeadDim;
constexpr int64_t kDecodePosition = kBenchDecodePosition;
// Qwen2-VL's mrope_section: pairs [0, 16) read the temporal stream, [16, 40) height, [40, 64) width.
constexpr int64_t kMropeSection[] = {16, 24, 24};
// The M-RoPE sequence: a text prefix (t = h = w = s), then video frames of a square grid.
constexpr int64_t kMropeText = 1024;
constexpr int64_t kMropeGrid = 32;
// rerotate: the cache's first position and the shift (one delta for the one stream).
constexpr int64_t kRerotateFirst = 1024;
constexpr int64_t kRerotateDelta[] = {-1024};
// switch: LongRoPE as Phi-3.5-mini sets it (base 10^4, L = 4096, M = 131072), its factors' ranges
// (short 1 .. 2.84, long 1.08 .. 64.84 over the pairs) spread over head_dim 128's 64 pairs.
constexpr int64_t kLongropeOriginal = 4096;
constexpr int64_t kLongropeMax = 131072;
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

// LongRoPE as kLongropeOriginal's comment says, its factors rising geometrically over the pairs:
// every pair turns slower under the long ones (switch then runs one pass). `long_context`: the long
// factors, a sequence past L.
Schedule longrope(Pairing pairing, bool long_context) {
  constexpr size_t kPairs = kHeadDim / 2;
  std::vector<double> short_factor(kPairs), long_factor(kPairs);
  for (size_t j = 0; j < kPairs; ++j) {
    const double x = static_cast<double>(j) / static_cast<double>(kPairs - 1);
    short_factor[j] = std::pow(2.84, x);
    long_factor[j] = 1.08 * std::pow(64.84 / 1.08, x);
  }
  const Spec spec{.head_dim = kHeadDim, .pairing = pairing, .schedule = ScheduleType::longrope,
                  .original_max_position = kLongropeOriginal, .max_position = kLongropeMax,
                  .short_factor = std::move(short_factor), .long_factor = std::move(long_factor)};
  return make_schedule(spec, long_context ? std::optional<int64_t>(kLongropeOriginal + 1) : std::nullopt);
}

// Qwen2-VL's text rotary, half pairing (bench_mrope_schedule).
Schedule qwen2_vl(int streams) { return bench_mrope_schedule(streams, Pairing::half); }

std::vector<int64_t> mrope_positions(int64_t seq) { return bench_mrope_positions(seq); }

}  // namespace

Schedule bench_mrope_schedule(int streams, Pairing pairing) {
  Schedule schedule = make_schedule(Spec{.head_dim = kHeadDim, .base = 1000000.0, .pairing = pairing});
  if (streams == 3) {
    schedule.streams = 3;
    for (int k = 0; k < 3; ++k) schedule.pair_stream.insert(schedule.pair_stream.end(), kMropeSection[k], k);
    validate(schedule);
  }
  return schedule;
}

// Text tokens at s in every stream, then video frames at (first + frame, first + row, first + column).
std::vector<int64_t> bench_mrope_positions(int64_t seq) {
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

namespace {

// The schedules of a case's call: Llama 3.1's (apply, rerotate), Qwen2-VL's 3 streams (mrope), or
// LongRoPE's short factors, the keys', and `to`, its long ones (switch).
struct CaseSchedules {
  Schedule main, to;
};
CaseSchedules schedules_of(const Case& c, Pairing pairing) {
  if (c.op == Op::mrope) return {qwen2_vl(3), {}};
  if (c.op == Op::switch_schedule) return {longrope(pairing, false), longrope(pairing, true)};
  return {llama31_schedule(pairing), {}};
}

// The first token's position: decode's kDecodePosition, rerotate's kRerotateFirst, else 0.
int64_t first_position(const Case& c) {
  return c.op == Op::rerotate ? kRerotateFirst : c.seq == 1 ? kDecodePosition : 0;
}

// The tokens' positions: batched_decode's drawn below kDecodePosition, the others consecutive from
// the first.
std::vector<int64_t> case_positions(const Case& c, std::mt19937_64& rng) {
  std::vector<int64_t> positions(static_cast<size_t>(c.batch * c.seq));
  if (std::string(c.name) == "batched_decode") {
    std::uniform_int_distribution<int64_t> any(0, kDecodePosition);
    for (auto& p : positions) p = any(rng);
    return positions;
  }
  std::iota(positions.begin(), positions.end(), first_position(c));
  return positions;
}

// The angles a case's rows use: apply's those --angles chooses; rerotate's its own cos/sin of
// delta * inv_freq, one row for every token (apply's CallerAngles: "caller"); switch computes the
// angles of the frequency differences on the fly.
std::vector<std::string> angles_of(const Case& c, const std::vector<std::string>& chosen) {
  if (c.op == Op::rerotate) return {"caller"};
  if (c.op == Op::switch_schedule) return {"on_the_fly"};
  return chosen;
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
// rerotate and switch stream a prefill-sized cache through one apply call (switch under this
// LongRoPE: one pass), so they get prefill's limits: the memory limit apply is held to.
Target target_of(const Case& c, DType dtype, bool table, bool inplace) {
  const std::string name = c.name;
  if (c.op == Op::mrope) return {1.05, "single_stream"};
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
  nlohmann::ordered_json j;
  j["case"] = r.case_name;
  j["dtype"] = r.dtype;
  j["pairing"] = r.pairing;
  j["angles"] = r.angles;
  j["inplace"] = r.inplace;
  j["threads"] = r.threads;
  j["median_ns"] = json_rounded(r.median_ns, 1);
  j["gbps"] = json_rounded(r.gbps, 3);
  j["memcpy_median_ns"] = json_rounded(r.memcpy_median_ns, 1);
  j["ratio_to_memcpy"] = json_rounded(r.ratio_to_memcpy, 4);
  j["speedup_vs_reference"] = json_rounded(r.speedup_vs_reference, 2);
  j["compute_floor_ratio"] = json_rounded(r.compute_floor, 4);
  if (r.touch_median_ns > 0) {
    j["touch_median_ns"] = json_rounded(r.touch_median_ns, 1);
    j["touch_ratio_to_memcpy"] = json_rounded(r.touch_median_ns / r.memcpy_median_ns, 4);
  }
  if (r.single_stream_median_ns > 0) {
    j["single_stream_median_ns"] = json_rounded(r.single_stream_median_ns, 1);
    j["ratio_to_single_stream"] = json_rounded(r.ratio, 4);
  }
  j["target"] = json_rounded(r.target.limit, 2);
  j["target_against"] = r.target.against;
  j["pass"] = r.pass;
  return j.dump();
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

// One way to call the case's operation: its schedule (switch: the keys' schedule, and `to`),
// positions and table.
struct Variant {
  const Schedule* schedule;
  Positions positions;
  const Table* table;
  const Schedule* to = nullptr;
};

// The case's operation on one buffer: apply to the q (and k) at `in`, or rerotate / switch the keys
// there; in place, or into `dst`.
void run_op(const Case& c, DType dtype, unsigned char* in, unsigned char* dst, bool inplace, int threads,
            Backend backend, const Variant& v) {
  auto view = [&](unsigned char* data, int64_t heads) {
    return TensorView::bshd(data, dtype, c.batch, c.seq, heads, kHeadDim);
  };
  if (c.on_keys()) {
    RotatedKeys keys{.k = view(in, c.heads_q), .positions = v.positions, .threads = threads, .backend = backend};
    if (!inplace) keys.k_out = view(dst, c.heads_q);
    if (c.op == Op::rerotate) {
      rerotate(*v.schedule, keys, kRerotateDelta);
    } else {
      switch_schedule(*v.schedule, *v.to, keys);
    }
    return;
  }
  const int64_t q_bytes = c.batch * c.seq * c.heads_q * kHeadDim * size_of(dtype);
  ApplyArgs a{.q = view(in, c.heads_q), .positions = v.positions, .table = v.table, .threads = threads,
              .backend = backend};
  if (c.heads_k > 0) a.k = view(in + q_bytes, c.heads_k);
  if (!inplace) {
    a.q_out = view(dst, c.heads_q);
    if (c.heads_k > 0) a.k_out = view(dst + q_bytes, c.heads_k);
  }
  apply(*v.schedule, a);
}

// The operation's cost per element when memory costs (almost) nothing: apply on q and k of 4 decode
// tokens (80 KiB at f32; M-RoPE's too), or rerotate / switch on the keys of 20 tokens (as many
// elements) at the case's first positions, cache-resident, over and over in one buffer on one
// thread. Scaled to a case's elements and threads and divided by its memcpy time, it is the ratio
// the operation would reach if every byte came from the cache: its compute floor. rerotate and
// switch cost a few microseconds per call whatever the size (rerotate's 64 exact cos/sin, both
// copying and validating schedules), a quarter of 20 tokens' time but nothing beside a case's
// milliseconds: their cost per element is the time of 20 tokens less that of 1, over 19 tokens'
// elements.
double compute_ns_per_element(const Case& c, DType dtype, Pairing pairing, bool use_table, bool inplace, int reps) {
  constexpr int64_t kCalls = 200;
  const Case small = c.on_keys() ? Case{c.name, 1, 20, 8, 0, c.op} : Case{c.name, 1, 4, 32, 8, Op::apply};
  const Case single_token{c.name, 1, 1, small.heads_q, small.heads_k, small.op};
  const CaseSchedules schedules = schedules_of(small, pairing);
  std::vector<int64_t> positions(static_cast<size_t>(small.seq));
  std::iota(positions.begin(), positions.end(), c.on_keys() ? first_position(c) : kDecodePosition);
  const Table table = Table::at(schedules.main, positions);
  const int64_t es = size_of(dtype);
  const int64_t elements = small.seq * (small.heads_q + small.heads_k) * kHeadDim;
  const int64_t token_elements = (small.heads_q + small.heads_k) * kHeadDim;
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
  const Variant v{&schedules.main, Positions::per_token(positions), use_table ? &table : nullptr, &schedules.to};
  const Variant v_one{&schedules.main, Positions::per_token(std::span(positions).first(1)), nullptr, &schedules.to};
  auto time_calls = [&](const Case& shape, const Variant& variant) {
    const auto start = Clock::now();
    for (int64_t k = 0; k < kCalls; ++k) run_op(shape, dtype, in, out, inplace, 1, Backend::automatic, variant);
    return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / static_cast<double>(kCalls);
  };
  std::vector<double> per_element;
  for (int r = 0; r < reps + 2; ++r) {  // the first two warm up
    const double ns = time_calls(small, v);
    if (!c.on_keys()) {
      if (r >= 2) per_element.push_back(ns / static_cast<double>(elements));
      continue;
    }
    const double fixed = time_calls(single_token, v_one);
    if (r >= 2) per_element.push_back((ns - fixed) / static_cast<double>(elements - token_elements));
  }
  return median(per_element);
}

// Compute floors by operation (apply for mrope too), dtype, pairing, angles and placement: measured
// once, at the first row that needs one.
using FloorCache = std::map<std::tuple<Op, std::string, std::string, std::string, bool>, double>;

// What the rows of one case, dtype, pairing, angles and placement share.
struct RowSetup {
  const Case& c;
  DType dtype;
  const std::string &dtype_name, &pairing_name, &angles;
  bool inplace;
  Buffers& buf;
  Variant main, single;  // single: for mrope, the same call with one stream
};

// Times the setup's call against a memcpy of the same bytes (in place also the touch floor; mrope
// also the single-stream call), interleaved, on each thread count: one row each.
void bench_rows(const RowSetup& s, const BenchOptions& o, const std::vector<int>& thread_counts, FloorCache& floors,
                std::vector<Row>& rows) {
  const Case& c = s.c;
  Buffers& buf = s.buf;
  const int64_t op_bytes = buf.op_bytes;
  const bool mrope = c.op == Op::mrope;
  // One repetition: ops_per_rep operations cycling through the buffers (at least 64, so that a
  // decode repetition lasts tens of microseconds); time per operation.
  const int64_t ops_per_rep = std::max<int64_t>(buf.count, op_bytes <= kCachedOperationBytes ? 64 : 1);
  auto time_kernel = [&](int threads, Backend backend, const Variant& v) {
    const auto start = Clock::now();
    for (int64_t k = 0; k < ops_per_rep; ++k) {
      run_op(c, s.dtype, buf.in(k % buf.count), buf.out(k % buf.count), s.inplace, threads, backend, v);
    }
    return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / static_cast<double>(ops_per_rep);
  };
  auto time_copy = [&](int threads) {
    const auto start = Clock::now();
    for (int64_t k = 0; k < ops_per_rep; ++k) {
      const int64_t b = k % buf.count;
      parallel_copy(buf.out(b), buf.in(b), op_bytes, threads);
    }
    return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / static_cast<double>(ops_per_rep);
  };
  auto time_touch = [&](int threads) {
    const auto start = Clock::now();
    for (int64_t k = 0; k < ops_per_rep; ++k) parallel_touch(buf.in(k % buf.count), op_bytes, threads);
    return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / static_cast<double>(ops_per_rep);
  };
  // The scalar reference, single-threaded (fewer repetitions for the long cases).
  std::vector<double> reference_ns;
  const int reference_reps = op_bytes >= (int64_t{8} << 20) ? 3 : 5;
  time_kernel(1, Backend::reference, s.main);
  for (int r = 0; r < reference_reps; ++r) reference_ns.push_back(time_kernel(1, Backend::reference, s.main));
  const double reference = median(reference_ns);
  const bool use_table = s.angles == "table";
  const Pairing pairing = parse_pairing(s.pairing_name);
  for (int threads : thread_counts) {
    const int effective = threads == 0 ? omp_get_max_threads() : threads;
    std::vector<double> kernel_ns, copy_ns, single_ns, touch_ns;
    for (int w = 0; w < 2; ++w) {  // warm-up
      time_kernel(effective, Backend::automatic, s.main);
      if (mrope) time_kernel(effective, Backend::automatic, s.single);
      time_copy(effective);
    }
    for (int r = 0; r < o.reps; ++r) {  // interleaved
      kernel_ns.push_back(time_kernel(effective, Backend::automatic, s.main));
      if (mrope) single_ns.push_back(time_kernel(effective, Backend::automatic, s.single));
      copy_ns.push_back(time_copy(effective));
      if (s.inplace) touch_ns.push_back(time_touch(effective));
    }
    Row row{c.name, s.dtype_name, s.pairing_name, s.angles, s.inplace, effective, median(kernel_ns), 0,
            median(copy_ns), 0, 0, mrope ? median(single_ns) : 0.0,
            s.inplace ? median(touch_ns) : 0.0, 0, target_of(c, s.dtype, use_table, s.inplace), 0, false};
    const auto key = std::make_tuple(c.on_keys() ? c.op : Op::apply, s.dtype_name, s.pairing_name, s.angles, s.inplace);
    if (!floors.count(key)) floors[key] = compute_ns_per_element(c, s.dtype, pairing, use_table, s.inplace, o.reps);
    const double case_elements = static_cast<double>(op_bytes / size_of(s.dtype));
    // The threads apply runs (one below kParallelBytes moved, as memcpy here).
    const int used = 2 * op_bytes < kParallelBytes ? 1 : effective;
    row.compute_floor = floors[key] * case_elements / used / row.memcpy_median_ns;
    row.gbps = 2.0 * static_cast<double>(op_bytes) / row.median_ns;
    row.ratio_to_memcpy = row.median_ns / row.memcpy_median_ns;
    row.speedup_vs_reference = reference / row.median_ns;
    row.ratio = mrope ? row.median_ns / row.single_stream_median_ns : row.ratio_to_memcpy;
    row.pass = row.ratio <= row.target.limit;
    rows.push_back(row);
  }
}

// Every row of one case: its dtypes, pairings, angles and placements.
void bench_case(const Case& c, const BenchOptions& o, const std::vector<int>& thread_counts, std::mt19937_64& rng,
                FloorCache& floors, std::vector<Row>& rows) {
  const bool mrope = c.op == Op::mrope;
  const std::vector<int64_t> positions = case_positions(c, rng);
  const std::vector<int64_t> stream_positions = mrope ? mrope_positions(c.seq) : std::vector<int64_t>{};
  for (const std::string& dtype_name : o.dtypes) {
    const DType dtype = dtype_name == "f32" ? DType::f32 : dtype_name == "bf16" ? DType::bf16 : DType::f16;
    Buffers buf = make_buffers(c, dtype, rng);
    for (const std::string& pairing_name : o.pairings) {
      if (mrope && pairing_name != "half") continue;
      // The measured call, and (M-RoPE) the single-stream call it is compared with. M-RoPE
      // tables cover the sequence's positions, 0 .. seq-1, as the single-stream one does.
      const CaseSchedules schedules = schedules_of(c, parse_pairing(pairing_name));
      const Schedule single = qwen2_vl(1);
      const Table table = mrope ? Table::range(schedules.main, 0, c.seq) : Table::at(schedules.main, positions);
      const Table single_table = Table::range(single, 0, mrope ? c.seq : 1);
      for (const std::string& angles : angles_of(c, o.angles)) {
        const bool use_table = angles == "table";
        const Variant main{&schedules.main,
                           mrope ? Positions::per_token(stream_positions, 3) : Positions::per_token(positions),
                           use_table ? &table : nullptr, &schedules.to};
        const Variant single_stream{&single, Positions::per_token(positions), use_table ? &single_table : nullptr};
        for (const std::string& placement : o.placement) {
          const RowSetup setup{c, dtype, dtype_name, pairing_name, angles, placement == "inplace", buf, main,
                               single_stream};
          bench_rows(setup, o, thread_counts, floors, rows);
        }
      }
    }
  }
}

void print_table(const std::vector<Row>& rows, const BenchOptions& o, std::ostream& out) {
  out << fmt::format("rotary-dev bench — Llama-3.1-8B shapes, head_dim 128 (decode: q and k, 32 + 8 heads; "
                     "mrope: Qwen2-VL 3-stream M-RoPE prefill q against the same call with one stream); "
                     "medians of {} interleaved repetitions; GB/s counts bytes read + written; memcpy of "
                     "the same bytes on the same threads; decode cases rotate among 4-16 cache-resident "
                     "buffers (<= 8 MiB), prefill cases stream from DRAM (> 96 MiB); floor: in place, "
                     "loading and storing every byte back with no arithmetic, against memcpy; compute: the kernel's "
                     "time per element on cache-resident data, scaled to the case, against memcpy\n",
                     o.reps);
  const bool on_keys = std::any_of(rows.begin(), rows.end(), [](const Row& r) {
    return r.case_name == "rerotate" || r.case_name == "switch";
  });
  if (on_keys) {
    out << fmt::format("rerotate: keys [1, 4096, 8, 128] at positions {}-{} moved by delta {} (Llama 3.1; angles: its "
                       "own cos/sin of delta * inv_freq); switch: the same keys at 0-4095 from LongRoPE's short "
                       "factors to its long ones (L {}, M {}; angles on the fly); both stream from DRAM, with "
                       "prefill's targets\n",
                       kRerotateFirst, kRerotateFirst + 4095, kRerotateDelta[0], kLongropeOriginal, kLongropeMax);
  }
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
}

// ---- fused operations (rotary/fused.hpp): rope_store and qk_norm_rope ----
//
// Llama-3.1-8B (32 q heads, 8 kv heads, head_dim 128), a paged NHD cache of blocks of 16 slots with
// a shuffled block table (twice the blocks the tokens need), prefill (4096 tokens, one buffer set:
// q, k, v and the caches, 80 MiB at bf16, stream from DRAM) and decode (1 token at
// kDecodePosition, cache-resident). Each fused call is timed, interleaved, against
//   unfused: what an engine runs without the fusion, from the same primitives:
//            rope_store:   apply(q, k in place), then a scatter loop copying each token's k and v
//                          rows (8 x 128) to its slot (vLLM's reshape_and_cache)
//            qk_norm_rope: an RMSNorm loop as a compiler vectorises it (float32 sums in vector
//                          order, rounded to the dtype, times the weight; rmsnorm_loop) over q's
//                          and k's heads in place, then apply(q, k in place)
//            rerotate_cache: an eviction moving every cached key (prefill: the 4096 tokens' k rows,
//                          in the cache) by one delta: gather the slots' rows, rerotate, scatter
//                          back (what an engine without the in-place kernel runs); no decode row
//   copy:    memcpy of the bytes the fused op must move: rope_store q, k and v (read q, k, v; write
//            q, k rows, v rows), qk_norm_rope q and k (read and write both), rerotate_cache the k
//            rows (read and written)
//   apply:   decode only, the plain rotary call on the same q and k (the 1.5x target)
constexpr const char* kFusedCases[] = {"rope_store", "qk_norm_rope", "rerotate_cache"};
constexpr int64_t kEvictionDelta = -512;
constexpr int64_t kFusedBlock = 16;

struct FusedRow {
  std::string op, shape, dtype, angles;
  int threads;
  int64_t tokens, bytes;
  double fused_ns, unfused_ns, copy_ns, apply_ns;  // apply_ns: decode only, else 0
};

float load_value(const unsigned char* p, DType dtype) {
  if (dtype == DType::f32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == DType::bf16 ? detail::bf16_to_f32(h) : detail::f16_to_f32(h);
}

void store_value(unsigned char* p, DType dtype, float v) {
  if (dtype == DType::f32) {
    std::memcpy(p, &v, 4);
    return;
  }
  const uint16_t h = dtype == DType::bf16 ? detail::f32_to_bf16(v) : detail::f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// The unfused composition's norm: per-head RMSNorm in place over every row of `rows` heads, as a
// compiler vectorises it (a fair first call, not a scalar strawman): float32 sum of squares in
// vector order, 1/sqrt(mean + eps), the product rounded to the dtype, times the weight, rounded
// again. x86: one clone per instruction set (f16 through F16C); elsewhere what the compiler makes.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ROTARY_BENCH_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ROTARY_BENCH_CLONES
#endif

template <class Bits, float (*kLoad)(Bits), Bits (*kStore)(float)>
ROTARY_BENCH_CLONES void rmsnorm_rows(unsigned char* x, int64_t rows, const std::vector<float>& weight, int threads) {
#pragma omp parallel for num_threads(threads) if (rows >= 64)
  for (int64_t r = 0; r < rows; ++r) {
    Bits* row = reinterpret_cast<Bits*>(x) + r * kHeadDim;
    float values[kHeadDim];
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t d = 0; d < kHeadDim; ++d) {
      values[d] = kLoad(row[d]);
      sum += values[d] * values[d];
    }
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(kHeadDim) + 1e-6f);
#pragma omp simd
    for (int64_t d = 0; d < kHeadDim; ++d) {
      row[d] = kStore(kLoad(kStore(values[d] * inv)) * weight[static_cast<size_t>(d)]);
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// f16 rows through F16C, eight values a step (compilers leave scalar f16 conversions unvectorised).
__attribute__((target("avx2,fma,f16c"))) void rmsnorm_rows_f16c(unsigned char* x, int64_t rows,
                                                                const std::vector<float>& weight, int threads) {
#pragma omp parallel for num_threads(threads) if (rows >= 64)
  for (int64_t r = 0; r < rows; ++r) {
    auto* row = reinterpret_cast<__m128i*>(x + r * kHeadDim * 2);
    __m256 values[kHeadDim / 8];
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < kHeadDim / 8; ++i) {
      values[i] = _mm256_cvtph_ps(_mm_loadu_si128(row + i));
      sum = _mm256_fmadd_ps(values[i], values[i], sum);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, sum);
    const float total =
        ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(total / static_cast<float>(kHeadDim) + 1e-6f));
    for (int64_t i = 0; i < kHeadDim / 8; ++i) {
      const __m256 y = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(values[i], inv), _MM_FROUND_TO_NEAREST_INT));
      const __m256 out = _mm256_mul_ps(y, _mm256_loadu_ps(weight.data() + 8 * i));
      _mm_storeu_si128(row + i, _mm256_cvtps_ph(out, _MM_FROUND_TO_NEAREST_INT));
    }
  }
}
#endif

float f32_load(float v) { return v; }
float f32_store(float v) { return v; }

void rmsnorm_loop(unsigned char* x, DType dtype, int64_t tokens, int64_t heads, const std::vector<float>& weight,
                  int threads) {
  const int64_t rows = tokens * heads;
  if (dtype == DType::f32) {
    rmsnorm_rows<float, f32_load, f32_store>(x, rows, weight, threads);
  } else if (dtype == DType::bf16) {
    rmsnorm_rows<uint16_t, detail::bf16_to_f32, detail::f32_to_bf16>(x, rows, weight, threads);
  } else {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if (__builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      rmsnorm_rows_f16c(x, rows, weight, threads);
      return;
    }
#endif
    rmsnorm_rows<uint16_t, detail::f16_to_f32, detail::f32_to_f16>(x, rows, weight, threads);
  }
}

void fused_rows(const std::string& op, const std::string& shape, const std::string& dtype_name,
                const std::string& angles, const BenchOptions& o,
                const std::vector<int>& thread_counts, std::mt19937_64& rng, std::vector<FusedRow>& rows) {
  const DType dtype = dtype_name == "f32" ? DType::f32 : dtype_name == "bf16" ? DType::bf16 : DType::f16;
  const int64_t es = size_of(dtype);
  const bool decode = shape == "decode";
  const int64_t tokens = decode ? 1 : 4096, hq = 32, hk = 8;
  const int64_t q_bytes = tokens * hq * kHeadDim * es, kv_bytes = tokens * hk * kHeadDim * es;
  const int64_t blocks = 2 * ((tokens + kFusedBlock - 1) / kFusedBlock);
  const int64_t cache_bytes = blocks * kFusedBlock * hk * kHeadDim * es;
  const bool store = op == "rope_store";
  const bool evict = op == "rerotate_cache";
  if (evict && decode) return;
  // bytes read (= bytes written)
  const int64_t moved = store ? q_bytes + 2 * kv_bytes : evict ? kv_bytes : q_bytes + kv_bytes;
  std::vector<unsigned char> in_storage(static_cast<size_t>(q_bytes + 2 * kv_bytes) + kBufferAlignment);
  std::vector<unsigned char> out_storage(static_cast<size_t>(q_bytes + 2 * kv_bytes + kOutputSkew) + kBufferAlignment);
  std::vector<unsigned char> k_cache_storage(static_cast<size_t>(cache_bytes) + kBufferAlignment);
  std::vector<unsigned char> v_cache_storage(static_cast<size_t>(cache_bytes) + kBufferAlignment);
  unsigned char* q = Buffers::aligned(in_storage);
  unsigned char* k = q + q_bytes;
  unsigned char* v = k + kv_bytes;
  unsigned char* copy_dst = Buffers::aligned(out_storage) + kOutputSkew;
  unsigned char* k_cache = Buffers::aligned(k_cache_storage);
  unsigned char* v_cache = Buffers::aligned(v_cache_storage);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < (q_bytes + 2 * kv_bytes) / es; ++i) store_value(q + i * es, dtype, normal(rng));
  std::vector<int64_t> block_table(static_cast<size_t>(blocks));
  std::iota(block_table.begin(), block_table.end(), 0);
  std::shuffle(block_table.begin(), block_table.end(), rng);
  std::vector<int64_t> slots(static_cast<size_t>(tokens)), positions(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) {
    slots[static_cast<size_t>(t)] = block_table[static_cast<size_t>(t / kFusedBlock)] * kFusedBlock + t % kFusedBlock;
    positions[static_cast<size_t>(t)] = decode ? kDecodePosition : t;
  }
  std::vector<float> weight(static_cast<size_t>(kHeadDim));
  // Weights of 1: repeated in-place norms then keep the values as they are (a weight != 1 applied
  // call after call would shrink all but the largest channel into subnormals).
  for (auto& w : weight) w = 1.0f;
  std::vector<unsigned char> weight_storage(static_cast<size_t>(kHeadDim * es));
  for (int64_t d = 0; d < kHeadDim; ++d) store_value(weight_storage.data() + d * es, dtype, weight[static_cast<size_t>(d)]);
  for (int64_t d = 0; d < kHeadDim; ++d) weight[static_cast<size_t>(d)] = load_value(weight_storage.data() + d * es, dtype);

  const Schedule schedule = llama31_schedule(Pairing::half);
  const Table table = Table::at(schedule, positions);
  const Table* angle_table = angles == "table" ? &table : nullptr;
  auto view = [&](unsigned char* data, int64_t heads) { return TensorView::bshd(data, dtype, 1, tokens, heads, kHeadDim); };
  auto rope_args = [&](int threads) {
    return ApplyArgs{.q = view(q, hq), .k = view(k, hk), .positions = Positions::per_token(positions),
                     .table = angle_table, .threads = threads};
  };
  const CacheView k_view = CacheView::nhd(k_cache, dtype, blocks, kFusedBlock, hk, kHeadDim);
  const CacheView v_view = CacheView::nhd(v_cache, dtype, blocks, kFusedBlock, hk, kHeadDim);
  const int64_t row_bytes = hk * kHeadDim * es;
  // rerotate_cache: the k rows start in the cache (rope_store's scatter of k), then move by one delta.
  std::vector<int64_t> deltas(static_cast<size_t>(tokens), kEvictionDelta);
  std::vector<unsigned char> gathered(evict ? static_cast<size_t>(kv_bytes) : 0);
  if (evict) {
    for (int64_t t = 0; t < tokens; ++t) {
      std::memcpy(k_cache + slots[static_cast<size_t>(t)] * row_bytes, k + t * row_bytes, static_cast<size_t>(row_bytes));
    }
  }
  auto fused = [&](int threads) {
    if (evict) {
      rerotate_cache(schedule, RerotateCacheArgs{.cache = k_view, .slots = Slots::of(std::span<const int64_t>(slots)),
                                                 .mode = RerotateMode::delta, .delta = deltas.data(),
                                                 .threads = threads});
    } else if (store) {
      RopeStoreArgs a{.rope = rope_args(threads)};
      a.cache.slots = Slots::of(std::span<const int64_t>(slots));
      a.cache.k_cache = k_view;
      a.cache.v_cache = v_view;
      a.cache.v = view(v, hk);
      rope_store(schedule, a);
    } else {
      QkNormRopeArgs a{.rope = rope_args(threads)};
      a.q_weight = NormWeight{weight_storage.data(), dtype, kHeadDim};
      a.k_weight = a.q_weight;
      qk_norm_rope(schedule, a);
    }
  };
  auto unfused = [&](int threads) {
    if (evict) {
#pragma omp parallel for num_threads(threads) if (tokens >= 64)
      for (int64_t t = 0; t < tokens; ++t) {
        std::memcpy(gathered.data() + t * row_bytes, k_cache + slots[static_cast<size_t>(t)] * row_bytes,
                    static_cast<size_t>(row_bytes));
      }
      rerotate(schedule, RotatedKeys{.k = view(gathered.data(), hk), .positions = Positions::sequential(kDecodePosition),
                                     .threads = threads},
               std::span<const int64_t>(&deltas[0], 1));
#pragma omp parallel for num_threads(threads) if (tokens >= 64)
      for (int64_t t = 0; t < tokens; ++t) {
        std::memcpy(k_cache + slots[static_cast<size_t>(t)] * row_bytes, gathered.data() + t * row_bytes,
                    static_cast<size_t>(row_bytes));
      }
    } else if (store) {
      apply(schedule, rope_args(threads));
#pragma omp parallel for num_threads(threads) if (tokens >= 64)
      for (int64_t t = 0; t < tokens; ++t) {
        const int64_t at = slots[static_cast<size_t>(t)] * row_bytes;
        std::memcpy(k_cache + at, k + t * row_bytes, static_cast<size_t>(row_bytes));
        std::memcpy(v_cache + at, v + t * row_bytes, static_cast<size_t>(row_bytes));
      }
    } else {
      rmsnorm_loop(q, dtype, tokens, hq, weight, threads);
      rmsnorm_loop(k, dtype, tokens, hk, weight, threads);
      apply(schedule, rope_args(threads));
    }
  };
  auto plain_apply = [&](int threads) { apply(schedule, rope_args(threads)); };
  auto copy = [&](int threads) { parallel_copy(copy_dst, q, moved, threads); };
  const int64_t calls = decode ? 256 : 1;
  auto time = [&](const auto& fn, int threads) {
    const auto start = Clock::now();
    for (int64_t i = 0; i < calls; ++i) fn(threads);
    return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / static_cast<double>(calls);
  };
  for (int threads : thread_counts) {
    const int effective = threads == 0 ? omp_get_max_threads() : threads;
    std::vector<double> fused_ns, unfused_ns, copy_ns, apply_ns;
    for (int w = 0; w < 2; ++w) {
      time(fused, effective);
      time(unfused, effective);
      time(copy, effective);
    }
    for (int r = 0; r < o.reps; ++r) {
      fused_ns.push_back(time(fused, effective));
      unfused_ns.push_back(time(unfused, effective));
      copy_ns.push_back(time(copy, effective));
      if (decode) apply_ns.push_back(time(plain_apply, effective));
    }
    rows.push_back(FusedRow{op, shape, dtype_name, angles, effective, tokens, 2 * moved, median(fused_ns), median(unfused_ns),
                            median(copy_ns), decode ? median(apply_ns) : 0.0});
  }
}

std::string json_fused_row(const FusedRow& r) {
  for (const auto& [value, name] : {std::pair{r.fused_ns, "median_ns"}, std::pair{r.unfused_ns, "unfused_median_ns"},
                                    std::pair{r.copy_ns, "memcpy_median_ns"}}) {
    require_finite_for_json(value, fmt::format("{} of {}", name, r.op));
  }
  nlohmann::ordered_json j;
  j["case"] = r.op;
  j["shape"] = r.shape;
  j["dtype"] = r.dtype;
  j["angles"] = r.angles;
  j["threads"] = r.threads;
  j["tokens"] = r.tokens;
  j["bytes"] = r.bytes;
  j["median_ns"] = json_rounded(r.fused_ns, 1);
  j["gbps"] = json_rounded(static_cast<double>(r.bytes) / r.fused_ns, 3);
  j["unfused_median_ns"] = json_rounded(r.unfused_ns, 1);
  j["ratio_to_unfused"] = json_rounded(r.fused_ns / r.unfused_ns, 4);
  j["memcpy_median_ns"] = json_rounded(r.copy_ns, 1);
  j["ratio_to_memcpy"] = json_rounded(r.fused_ns / r.copy_ns, 4);
  if (r.apply_ns > 0) {
    j["apply_median_ns"] = json_rounded(r.apply_ns, 1);
    j["ratio_to_apply"] = json_rounded(r.fused_ns / r.apply_ns, 4);
  }
  return j.dump();
}

void print_fused_table(const std::vector<FusedRow>& rows, const BenchOptions& o, std::ostream& out) {
  out << fmt::format("rotary-dev bench — fused operations, Llama-3.1-8B (32 q / 8 kv heads, head_dim 128), paged NHD "
                     "cache of 16-slot blocks, shuffled block table; medians of {} interleaved repetitions; unfused: "
                     "apply + a scatter loop (rope_store), a vectorised RMSNorm loop + apply (qk_norm_rope), gather + "
                     "rerotate + scatter of every cached key by one delta (rerotate_cache); memcpy: the bytes the "
                     "fused op must move; apply: decode's plain rotary call on the same q and k\n",
                     o.reps);
  out << fmt::format("{:<14} {:<8} {:<5} {:<10} {:>3} {:>7} {:>10} {:>8} {:>11} {:>9} {:>10} {:>8} {:>9} {:>7}\n", "case",
                     "shape", "dtype", "angles", "thr", "tokens", "median_us", "GB/s", "unfused_us", "/unfused", "memcpy_us",
                     "/memcpy", "apply_us", "/apply");
  for (const FusedRow& r : rows) {
    out << fmt::format("{:<14} {:<8} {:<5} {:<10} {:>3} {:>7} {:>10.3f} {:>8.2f} {:>11.3f} {:>9.3f} {:>10.3f} {:>8.3f} {:>9} {:>7}\n",
                       r.op, r.shape, r.dtype, r.angles, r.threads, r.tokens, r.fused_ns / 1e3,
                       static_cast<double>(r.bytes) / r.fused_ns, r.unfused_ns / 1e3, r.fused_ns / r.unfused_ns,
                       r.copy_ns / 1e3, r.fused_ns / r.copy_ns,
                       r.apply_ns > 0 ? fmt::format("{:.3f}", r.apply_ns / 1e3) : "-",
                       r.apply_ns > 0 ? fmt::format("{:.3f}", r.fused_ns / r.apply_ns) : "-");
  }
}

// The options --device cuda takes: kCudaBenchCases and kCudaFusedCases, the caller's angles too, and no --threads.
void check_cuda_options(const BenchOptions& o) {
  std::vector<std::string> case_names;
  for (const CudaBenchCase& c : kCudaBenchCases) case_names.emplace_back(c.name);
  for (const char* name : kCudaFusedCases) case_names.emplace_back(name);
  check_list(o.cases, case_names, "--cases");
  check_list(o.angles, {"table", "on_the_fly", "caller"}, "--angles");
  if (!o.threads.empty()) throw Error("--threads applies to --device cpu only");
}

void check_options(const BenchOptions& o) {
  if (o.device != "cpu" && o.device != "cuda") {
    throw Error(fmt::format("--device='{}' must be cpu or cuda", detail::excerpt(o.device)));
  }
  if (o.device == "cuda") {
    check_cuda_options(o);
  } else {
    std::vector<std::string> case_names;
    for (const Case& c : kCases) case_names.emplace_back(c.name);
    for (const char* name : kFusedCases) case_names.emplace_back(name);
    check_list(o.cases, case_names, "--cases");
    check_list(o.angles, {"table", "on_the_fly"}, "--angles");
  }
  check_list(o.dtypes, {"f32", "bf16", "f16"}, "--dtypes");
  check_list(o.pairings, {"half", "interleaved"}, "--pairings");
  check_list(o.placement, {"inplace", "outofplace"}, "--placement");
  if (o.reps < 3 || o.reps > 1000) throw Error(fmt::format("--reps={} must be in [3, 1000]", o.reps));
  for (int t : o.threads) check_threads(t, "--threads");
}

}  // namespace

Schedule llama31_schedule(Pairing pairing) {
  return make_schedule(Spec{.head_dim = kHeadDim, .base = 500000.0, .pairing = pairing,
                            .schedule = ScheduleType::llama3, .factor = 8.0,
                            .original_max_position = 8192, .low_freq_factor = 1.0,
                            .high_freq_factor = 4.0});
}

#ifndef ROTARY_CLI_CUDA
std::string cuda_bench_unavailable() { return "this rotary was built without CUDA"; }

int run_cuda_bench(const BenchOptions&, std::ostream&) {
  throw Error("--device cuda: this rotary was built without CUDA");
}
#endif

int run_bench(const BenchOptions& options, std::ostream& out) {
  BenchOptions o = options;
  if (o.cases.empty()) {
    if (o.device == "cuda") {
      for (const CudaBenchCase& c : kCudaBenchCases) {
        if (c.by_default) o.cases.emplace_back(c.name);
      }
    } else {
      o.cases = {"prefill_q", "prefill_k", "decode", "batched_decode", "mrope"};
    }
  }
  check_options(o);
  if (o.device == "cuda") {
    // Every option is checked first: the same error for the same command line on any machine.
    if (const std::string why = cuda_bench_unavailable(); !why.empty()) throw Error("--device cuda: " + why);
    return run_cuda_bench(o, out);
  }
  std::vector<int> thread_counts = o.threads;
  if (thread_counts.empty()) {
    thread_counts = {1};
    if (omp_get_max_threads() > 1) thread_counts.push_back(omp_get_max_threads());
  }

  std::vector<Row> rows;
  FloorCache floors;
  std::mt19937_64 rng(o.seed);
  for (const Case& c : kCases) {
    if (!contains(o.cases, std::string(c.name))) continue;
    if (c.op == Op::mrope && !contains(o.pairings, std::string("half"))) continue;
    bench_case(c, o, thread_counts, rng, floors, rows);
  }
  std::vector<FusedRow> fused;
  for (const char* op : kFusedCases) {
    if (!contains(o.cases, std::string(op))) continue;
    for (const char* shape : {"prefill", "decode"}) {
      for (const std::string& dtype_name : o.dtypes) {
        for (const std::string& angles : o.angles) fused_rows(op, shape, dtype_name, angles, o, thread_counts, rng, fused);
      }
    }
  }
  if (o.json) {
    std::vector<std::string> lines;
    for (const Row& r : rows) lines.push_back(json_row(r));
    for (const FusedRow& r : fused) lines.push_back(json_fused_row(r));
    std::string text = "[\n";
    for (size_t i = 0; i < lines.size(); ++i) text += lines[i] + (i + 1 < lines.size() ? ",\n" : "\n");
    out << text << "]\n";
    return 0;
  }
  if (!rows.empty()) print_table(rows, o, out);
  if (!fused.empty()) print_fused_table(fused, o, out);
  return 0;
}

}  // namespace rotary::cli
