// `rotary-dev bench --device cuda`: rotary::cuda::apply against a device-to-device copy of the same bytes
// (cudaMemcpyAsync on the same stream), timed with CUDA events in one process. Built only with the
// CUDA backend (ROTARY_CLI_CUDA).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <span>

#include "../src/cuda/launch.hpp"
#include "bench.hpp"
#include "bench_cuda_kernels.hpp"
#include "parse.hpp"
#include "rotary/cuda.hpp"
#include "rotary/rotary.hpp"

namespace rotary::cli {
namespace {

using detail::cuda::check;

// Prefill: every call reads a buffer that at least this many L2s of traffic have passed since its
// last use (a pool of buffers whose inputs together hold this many L2s), so both the kernel and the
// copy stream from device memory, as a prefill's q and k, fresh from the projection's output
// spilling out of L2, do. Two passes over the pool per timed repetition.
constexpr int64_t kStreamingL2Multiple = 4;
constexpr int64_t kStreamingMinBuffers = 3;
constexpr int64_t kStreamingPasses = 2;
// Decode-sized calls rotate among 4 to 16 buffers of at most 8 MiB in all: resident in L2, as q and
// k are when the projection that wrote them has just finished, and never the same buffer twice in
// a row. A graph holds kGraphCalls calls (or copies); per-call time = replay time / kGraphCalls.
constexpr int64_t kCachedWorkingSetBytes = int64_t{8} << 20;
constexpr int64_t kGraphCalls = 256;
// Targets: prefill within 1.15x of the copy with a table, 1.20x with exact angles on the
// fly; one decode-sized call within 3 us under graph replay.
constexpr double kPrefillTableTarget = 1.15;
constexpr double kPrefillOnTheFlyTarget = 1.20;
constexpr double kDecodeTargetUs = 3.0;

struct DeviceFree {
  void operator()(void* p) const { static_cast<void>(cudaFree(p)); }
};
using DeviceMemory = std::unique_ptr<unsigned char, DeviceFree>;

DeviceMemory device_alloc(int64_t bytes, const char* what) {
  void* p = nullptr;
  check(cudaMalloc(&p, static_cast<size_t>(bytes)), what);
  return DeviceMemory(static_cast<unsigned char*>(p));
}

// A stream, two events and the gate that holds the stream while the host queues a repetition.
class Timer {
 public:
  Timer() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~Timer() {
    static_cast<void>(cudaEventDestroy(start_));
    static_cast<void>(cudaEventDestroy(stop_));
    static_cast<void>(cudaStreamDestroy(stream_));
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  cudaStream_t stream() const { return stream_; }

  // Device nanoseconds per call of `queue(stream)`, which queues `calls` calls. The stream waits on
  // a host function until everything is queued, so the time between the events is the device's
  // alone: no gap while it waits for the host's next launch.
  template <class Queue>
  double per_call_ns(int64_t calls, Queue queue) {
    open_.store(false, std::memory_order_relaxed);
    check(cudaLaunchHostFunc(stream_, &Timer::wait_until_open, &open_), "cudaLaunchHostFunc");
    {
      const OpenOnExit opener{open_};  // also when queueing throws: never leave the stream held
      check(cudaEventRecord(start_, stream_), "cudaEventRecord");
      queue(stream_);
      check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
    }
    return elapsed_per_call_ns(calls);
  }

  // Host and device nanoseconds per call with no gate: the host queues as the device runs, so a
  // call costs whichever is slower (a decode step's eager cost).
  template <class Queue>
  double eager_per_call_ns(int64_t calls, Queue queue) {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    check(cudaEventRecord(start_, stream_), "cudaEventRecord");
    queue(stream_);
    check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
    return elapsed_per_call_ns(calls);
  }

  // Nanoseconds per call between the start and stop events, once stop has happened.
  double elapsed_per_call_ns(int64_t calls) {
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return static_cast<double>(ms) * 1e6 / static_cast<double>(calls);
  }

 private:
  struct OpenOnExit {
    std::atomic<bool>& open;
    ~OpenOnExit() { open.store(true, std::memory_order_release); }
  };
  static void CUDART_CB wait_until_open(void* flag) {
    const auto* open = static_cast<const std::atomic<bool>*>(flag);
    while (!open->load(std::memory_order_acquire)) {
    }
  }

  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  std::atomic<bool> open_{true};
};

// A CUDA graph of what `queue(stream)` queues, instantiated and uploaded.
class Graph {
 public:
  template <class Queue>
  Graph(cudaStream_t stream, Queue queue) {
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    cudaGraph_t graph = nullptr;
    try {
      queue(stream);
    } catch (...) {
      if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph != nullptr) {
        static_cast<void>(cudaGraphDestroy(graph));
      }
      throw;
    }
    check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    const cudaError_t status = cudaGraphInstantiate(&exec_, graph, 0);
    static_cast<void>(cudaGraphDestroy(graph));
    check(status, "cudaGraphInstantiate");
    check(cudaGraphUpload(exec_, stream), "cudaGraphUpload");
  }
  ~Graph() { static_cast<void>(cudaGraphExecDestroy(exec_)); }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void launch(cudaStream_t stream) const { check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch"); }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

DType dtype_of(const std::string& name) {
  return name == "f32" ? DType::f32 : name == "bf16" ? DType::bf16 : DType::f16;
}

// The schedules of a case in one pairing: the case's own, and the plain variant its rows are held
// against (none for the Llama cases): M-RoPE's frequencies with one stream, or the whole head
// rotated.
struct CaseSchedules {
  Schedule main;
  std::optional<Schedule> plain;
};
CaseSchedules schedules_of(const CudaBenchCase& c, Pairing pairing) {
  switch (c.kind) {
    case CudaCaseKind::mrope: return {bench_mrope_schedule(3, pairing), bench_mrope_schedule(1, pairing)};
    case CudaCaseKind::partial:
      return {make_schedule(Spec{.head_dim = c.head_dim, .rotary_dim = c.rotary_dim, .pairing = pairing,
                                 .rotary_offset = c.rotary_offset}),
              make_schedule(Spec{.head_dim = c.head_dim, .pairing = pairing})};
    case CudaCaseKind::llama: break;
  }
  return {llama31_schedule(pairing), std::nullopt};
}

// One case in one dtype: the tokens' positions (host and device; `streams` rows of `tokens` each),
// a pool of input and output buffers (q then k in each), one buffer's input on the host, and a pair
// of buffers for the bitwise check. Inputs are random normals (the top half of a float's bits for
// f16/bf16: finite values within a few units), the same in every buffer of the pool.
struct CaseData {
  const CudaBenchCase& c;
  DType dtype;
  int64_t tokens, op_bytes, q_bytes, count;
  int streams;
  std::vector<int64_t> positions;
  std::vector<unsigned char> host_in;
  DeviceMemory device_positions, in, out, check_in, check_out, error;

  unsigned char* in_at(int64_t k) const { return in.get() + k % count * op_bytes; }
  unsigned char* out_at(int64_t k) const { return out.get() + k % count * op_bytes; }
};

// Prefill's tokens at 0 .. seq-1 (M-RoPE: Qwen2-VL's three streams); decode's at
// kBenchDecodePosition; batched_decode's drawn up to it.
std::vector<int64_t> case_positions(const CudaBenchCase& c, std::mt19937_64& rng) {
  if (c.kind == CudaCaseKind::mrope) return bench_mrope_positions(c.batch * c.seq);
  std::vector<int64_t> positions(static_cast<size_t>(c.batch * c.seq));
  if (c.seq > 1) {
    std::iota(positions.begin(), positions.end(), int64_t{0});
  } else {
    std::uniform_int_distribution<int64_t> any(0, kBenchDecodePosition);
    for (auto& p : positions) p = c.batch == 1 ? kBenchDecodePosition : any(rng);
  }
  return positions;
}

std::vector<unsigned char> random_input(int64_t elements, DType dtype, std::mt19937_64& rng) {
  const int64_t es = size_of(dtype);
  std::vector<unsigned char> bytes(static_cast<size_t>(elements * es));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < elements; ++i) {
    const float v = normal(rng);
    if (dtype == DType::f32) {
      std::memcpy(bytes.data() + i * 4, &v, 4);
    } else {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const auto h = static_cast<uint16_t>(bits >> 16);
      std::memcpy(bytes.data() + i * 2, &h, 2);
    }
  }
  return bytes;
}

CaseData make_case_data(const CudaBenchCase& c, DType dtype, int64_t l2_bytes, std::mt19937_64& rng) {
  const int64_t tokens = c.batch * c.seq;
  const int64_t op_bytes = tokens * (c.heads_q + c.heads_k) * c.head_dim * size_of(dtype);
  const int64_t count =
      c.graph ? std::clamp<int64_t>(kCachedWorkingSetBytes / (2 * op_bytes), 4, 16)
              : std::max(kStreamingMinBuffers, (kStreamingL2Multiple * l2_bytes + op_bytes - 1) / op_bytes);
  std::vector<int64_t> positions = case_positions(c, rng);
  const int streams = static_cast<int>(static_cast<int64_t>(positions.size()) / tokens);
  CaseData d{c, dtype, tokens, op_bytes, tokens * c.heads_q * c.head_dim * size_of(dtype), count, streams,
             std::move(positions), random_input(op_bytes / size_of(dtype), dtype, rng), {}, {}, {}, {}, {}, {}};
  const auto position_bytes = static_cast<int64_t>(d.positions.size() * sizeof(int64_t));
  d.device_positions = device_alloc(position_bytes, "cudaMalloc (positions)");
  d.in = device_alloc(count * op_bytes, "cudaMalloc (inputs)");
  d.out = device_alloc(count * op_bytes, "cudaMalloc (outputs)");
  d.check_in = device_alloc(op_bytes, "cudaMalloc (check input)");
  d.check_out = device_alloc(op_bytes, "cudaMalloc (check output)");
  d.error = device_alloc(sizeof(uint32_t), "cudaMalloc (error word)");
  check(cudaMemcpy(d.device_positions.get(), d.positions.data(), static_cast<size_t>(position_bytes),
                   cudaMemcpyHostToDevice), "cudaMemcpy (positions)");
  check(cudaMemset(d.error.get(), 0, sizeof(uint32_t)), "cudaMemset (error word)");
  check(cudaMemset(d.out.get(), 0, static_cast<size_t>(count * op_bytes)), "cudaMemset (outputs)");
  for (int64_t k = 0; k < count; ++k) {
    check(cudaMemcpy(d.in_at(k), d.host_in.data(), static_cast<size_t>(op_bytes), cudaMemcpyHostToDevice),
          "cudaMemcpy (inputs)");
  }
  // The memsets ran on the legacy stream, which the timer's non-blocking stream does not wait for.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return d;
}

// The call on the q and k at `in` (k after q), in place or into `out`.
ApplyArgs call_args(const CaseData& d, unsigned char* in, unsigned char* out, bool inplace,
                    const Positions& positions) {
  auto view = [&](unsigned char* data, int64_t heads) {
    return TensorView::bshd(data, d.dtype, d.c.batch, d.c.seq, heads, d.c.head_dim);
  };
  ApplyArgs a{.q = view(in, d.c.heads_q), .positions = positions};
  if (d.c.heads_k > 0) a.k = view(in + d.q_bytes, d.c.heads_k);
  if (!inplace) {
    a.q_out = view(out, d.c.heads_q);
    if (d.c.heads_k > 0) a.k_out = view(out + d.q_bytes, d.c.heads_k);
  }
  return a;
}

// The caller's angles of a schedule ("caller"): a float32 cache of rows [cos | sin] by position,
// rotary_dim columns each (halves: the second half repeats the first), as vLLM and FlashInfer keep
// it; row p holds the table's values at p, so the result is the table's, bit for bit. Rows up to
// the largest position of any stream.
struct CallerCache {
  std::vector<float> host;
  DeviceMemory device;
  int64_t rows = 0, width = 0;

  CallerCache(const Schedule& schedule, int64_t max_position) : rows(max_position + 1), width(schedule.rotary_dim) {
    const Table table = Table::range(schedule, 0, rows);
    const int64_t pairs = schedule.pairs();
    host.resize(static_cast<size_t>(rows * 2 * width));
    for (int64_t p = 0; p < rows; ++p) {
      float* row = host.data() + p * 2 * width;
      for (int64_t j = 0; j < pairs; ++j) {
        row[j] = row[pairs + j] = table.cos()[static_cast<size_t>(p * pairs + j)];
        row[width + j] = row[width + pairs + j] = table.sin()[static_cast<size_t>(p * pairs + j)];
      }
    }
    const auto bytes = static_cast<int64_t>(host.size() * sizeof(float));
    device = device_alloc(bytes, "cudaMalloc (cos/sin cache)");
    check(cudaMemcpy(device.get(), host.data(), static_cast<size_t>(bytes), cudaMemcpyHostToDevice),
          "cudaMemcpy (cos/sin cache)");
  }
  CallerAngles at(const float* base) const {
    return CallerAngles{.index = CallerAngles::Index::per_position, .columns = CallerAngles::Columns::halves,
                        .cos = base, .sin = base + width, .dtype = DType::f32, .shape = {1, rows, width},
                        .cos_strides = {0, 2 * width, 1}, .sin_strides = {0, 2 * width, 1}};
  }
  CallerAngles on_device() const { return at(reinterpret_cast<const float*>(device.get())); }
  CallerAngles on_host() const { return at(host.data()); }
};

// One variant's call (the case's own, or its plain variant): schedule, angles (a DeviceTable, the
// caller's cos/sin, or exact on the fly), the streams of positions it reads, and placement.
struct RowCall {
  const CaseData& d;
  const Schedule& schedule;
  const cuda::DeviceTable* table;
  const CallerAngles* angles;  // device memory
  int streams;
  bool inplace;

  Positions device_positions() const {
    return Positions::per_token(std::span<const int64_t>(reinterpret_cast<const int64_t*>(d.device_positions.get()),
                                                         static_cast<size_t>(d.tokens * streams)),
                                streams);
  }
  ApplyArgs args_at(unsigned char* in, unsigned char* out) const {
    ApplyArgs a = call_args(d, in, out, inplace, device_positions());
    a.caller_angles = angles;
    return a;
  }
  void call(int64_t k, cudaStream_t stream) const {
    const cuda::Options options{.table = table, .error = reinterpret_cast<uint32_t*>(d.error.get())};
    cuda::apply(schedule, args_at(d.in_at(k), d.out_at(k)), stream, options);
  }
  void copy(int64_t k, cudaStream_t stream) const {
    check(cudaMemcpyAsync(d.out_at(k), d.in_at(k), static_cast<size_t>(d.op_bytes), cudaMemcpyDeviceToDevice,
                          stream), "cudaMemcpyAsync");
  }
};

// Whether the device's output of the call on the check input equals `expected` (rotary::apply's on
// the CPU) byte for byte: out of place into a poisoned output (0xff bytes, NaN in every dtype, so a
// skipped element shows), or in place on a copy of the input. The error word is checked too.
bool device_matches(const RowCall& r, const std::vector<unsigned char>& expected, cudaStream_t stream) {
  const CaseData& d = r.d;
  const auto bytes = static_cast<size_t>(d.op_bytes);
  check(cudaMemcpyAsync(d.check_in.get(), d.host_in.data(), bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  if (r.inplace) {
    check(cudaMemcpyAsync(d.check_out.get(), d.host_in.data(), bytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
  } else {
    check(cudaMemsetAsync(d.check_out.get(), 0xff, bytes, stream), "cudaMemsetAsync");
  }
  const cuda::Options options{.table = r.table, .error = reinterpret_cast<uint32_t*>(d.error.get())};
  unsigned char* in = r.inplace ? d.check_out.get() : d.check_in.get();
  cuda::apply(r.schedule, r.args_at(in, d.check_out.get()), stream, options);
  cuda::check_positions(options.error, stream);
  std::vector<unsigned char> got(bytes);
  check(cudaMemcpyAsync(got.data(), d.check_out.get(), bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return got == expected;  // no NaN arises from these inputs: bytes compare as values
}

// rotary::apply on the CPU, out of place, on the host input: what every device row must equal.
std::vector<unsigned char> cpu_result(const CaseData& d, const Schedule& schedule, int streams, const Table* table,
                                      const CallerAngles* angles) {
  std::vector<unsigned char> in = d.host_in, out(in.size());
  ApplyArgs a = call_args(d, in.data(), out.data(), false,
                          Positions::per_token(std::span<const int64_t>(d.positions.data(),
                                                                        static_cast<size_t>(d.tokens * streams)),
                                               streams));
  a.table = table;
  a.caller_angles = angles;
  apply(schedule, a);
  return out;
}

struct CudaRow {
  std::string case_name, dtype, pairing, angles;
  bool inplace, graph;
  int64_t calls, buffers;
  double median_ns, copy_median_ns, eager_median_ns;  // eager: decode-sized only, else 0
  double plain_median_ns;                             // cases with a plain variant, else 0
  double gbps, ratio_to_copy, target;
  bool bitwise, pass;
};

// Kernel and copy medians per call (and the plain variant's, when the case has one): `calls` per
// repetition, the sides interleaved, after two warm-up repetitions of each; decode-sized cases by
// graph replay, also eager calls (no graph).
void time_row(const RowCall& r, const RowCall* plain, const BenchOptions& o, Timer& timer, CudaRow& row) {
  const auto calls = [&](const RowCall& call, auto one) {
    return [&call, one, n = row.calls](cudaStream_t stream) {
      for (int64_t k = 0; k < n; ++k) (call.*one)(k, stream);
    };
  };
  std::vector<double> kernel_ns, copy_ns, eager_ns, plain_ns;
  if (row.graph) {
    const Graph kernel_graph(timer.stream(), calls(r, &RowCall::call));
    const Graph copy_graph(timer.stream(), calls(r, &RowCall::copy));
    for (int rep = -2; rep < o.reps; ++rep) {
      const double k = timer.per_call_ns(row.calls, [&](cudaStream_t s) { kernel_graph.launch(s); });
      const double c = timer.per_call_ns(row.calls, [&](cudaStream_t s) { copy_graph.launch(s); });
      const double e = timer.eager_per_call_ns(row.calls, calls(r, &RowCall::call));
      if (rep < 0) continue;
      kernel_ns.push_back(k);
      copy_ns.push_back(c);
      eager_ns.push_back(e);
    }
  } else {
    for (int rep = -2; rep < o.reps; ++rep) {
      const double k = timer.per_call_ns(row.calls, calls(r, &RowCall::call));
      const double c = timer.per_call_ns(row.calls, calls(r, &RowCall::copy));
      const double p = plain != nullptr ? timer.per_call_ns(row.calls, calls(*plain, &RowCall::call)) : 0.0;
      if (rep < 0) continue;
      kernel_ns.push_back(k);
      copy_ns.push_back(c);
      plain_ns.push_back(p);
    }
  }
  row.median_ns = median(kernel_ns);
  row.copy_median_ns = median(copy_ns);
  row.eager_median_ns = eager_ns.empty() ? 0.0 : median(eager_ns);
  row.plain_median_ns = plain != nullptr ? median(plain_ns) : 0.0;
}

// A variant's angles: a DeviceTable (its own), the caller's cos/sin cache, or none (exact).
struct VariantAngles {
  std::optional<Table> host_table;
  std::optional<cuda::DeviceTable> table;
  std::optional<CallerCache> cache;
  CallerAngles device_angles, host_angles;

  VariantAngles(const Schedule& schedule, const std::string& angles, int64_t lowest, int64_t highest) {
    if (angles == "table") {
      host_table.emplace(Table::range(schedule, lowest, highest - lowest + 1));
      table.emplace(*host_table);
    } else if (angles == "caller") {
      cache.emplace(schedule, highest);
      device_angles = cache->on_device();
      host_angles = cache->on_host();
    }
  }
  const cuda::DeviceTable* device_table() const { return table ? &*table : nullptr; }
  const CallerAngles* device_caller() const { return cache ? &device_angles : nullptr; }
  const Table* cpu_table() const { return host_table ? &*host_table : nullptr; }
  const CallerAngles* cpu_caller() const { return cache ? &host_angles : nullptr; }
};

struct RowSetup {
  const CaseData& d;
  const std::string &dtype_name, &pairing_name, &angles;
  const Schedule& schedule;
  const VariantAngles& main;
  const std::vector<unsigned char>& expected;
  const Schedule* plain_schedule;  // null: no plain variant
  const VariantAngles* plain;
};

// Targets: Llama prefill within kPrefillTableTarget (table, caller) or kPrefillOnTheFlyTarget of the
// copy; decode-sized cases kDecodeTargetUs per call in a graph; the named cases within
// kPlainTarget of their plain variant.
constexpr double kPlainTarget = 1.05;

CudaRow bench_row(const RowSetup& s, bool inplace, const BenchOptions& o, Timer& timer) {
  const RowCall r{s.d, s.schedule, s.main.device_table(), s.main.device_caller(), s.d.streams, inplace};
  std::optional<RowCall> plain;
  if (s.plain_schedule != nullptr) {
    plain.emplace(RowCall{s.d, *s.plain_schedule, s.plain->device_table(), s.plain->device_caller(), 1, inplace});
  }
  const bool graph = s.d.c.graph;
  CudaRow row{s.d.c.name, s.dtype_name, s.pairing_name, s.angles, inplace, graph,
              graph ? kGraphCalls : kStreamingPasses * s.d.count, s.d.count, 0, 0, 0, 0, 0, 0, 0, false, false};
  row.bitwise = device_matches(r, s.expected, timer.stream());
  time_row(r, plain ? &*plain : nullptr, o, timer, row);
  row.gbps = 2.0 * static_cast<double>(s.d.op_bytes) / row.median_ns;
  row.ratio_to_copy = row.median_ns / row.copy_median_ns;
  double measured = row.ratio_to_copy;
  if (plain) {
    row.target = kPlainTarget;
    measured = row.median_ns / row.plain_median_ns;
  } else if (graph) {
    row.target = kDecodeTargetUs;
    measured = row.median_ns / 1e3;
  } else {
    row.target = s.angles == "on_the_fly" ? kPrefillOnTheFlyTarget : kPrefillTableTarget;
  }
  row.pass = row.bitwise && measured <= row.target;
  return row;
}

// Every row of one case in one dtype: its pairings, angles and placements.
void bench_case(const CaseData& d, const std::string& dtype_name, const BenchOptions& o, Timer& timer,
                std::vector<CudaRow>& rows) {
  const auto [lowest, highest] = std::minmax_element(d.positions.begin(), d.positions.end());
  for (const std::string& pairing_name : o.pairings) {
    const CaseSchedules schedules = schedules_of(d.c, parse_pairing(pairing_name));
    for (const std::string& angles : o.angles) {
      const VariantAngles main(schedules.main, angles, *lowest, *highest);
      std::optional<VariantAngles> plain;
      // The plain variant reads stream 0 (the first d.tokens positions).
      const auto [plain_low, plain_high] = std::minmax_element(d.positions.begin(), d.positions.begin() + d.tokens);
      if (schedules.plain) plain.emplace(*schedules.plain, angles, *plain_low, *plain_high);
      const std::vector<unsigned char> expected =
          cpu_result(d, schedules.main, d.streams, main.cpu_table(), main.cpu_caller());
      const RowSetup setup{d, dtype_name, pairing_name, angles, schedules.main, main, expected,
                           schedules.plain ? &*schedules.plain : nullptr, plain ? &*plain : nullptr};
      for (const std::string& placement : o.placement) {
        rows.push_back(bench_row(setup, placement == "inplace", o, timer));
      }
    }
  }
}

std::string json_row(const CudaRow& r) {
  const std::pair<double, const char*> numbers[] = {{r.median_ns, "median_ns"}, {r.gbps, "gbps"},
                                                    {r.copy_median_ns, "memcpy_median_ns"},
                                                    {r.ratio_to_copy, "ratio_to_memcpy"},
                                                    {r.eager_median_ns, "eager_median_ns"}};
  for (const auto& [value, name] : numbers) require_finite_for_json(value, fmt::format("{} of {}", name, r.case_name));
  nlohmann::ordered_json j;
  j["device"] = "cuda";
  j["case"] = r.case_name;
  j["dtype"] = r.dtype;
  j["pairing"] = r.pairing;
  j["angles"] = r.angles;
  j["inplace"] = r.inplace;
  j["timing"] = r.graph ? "graph" : "events";
  j["calls_per_rep"] = r.calls;
  j["buffers"] = r.buffers;
  j["median_ns"] = json_rounded(r.median_ns, 1);
  j["gbps"] = json_rounded(r.gbps, 3);
  j["memcpy_median_ns"] = json_rounded(r.copy_median_ns, 1);
  j["ratio_to_memcpy"] = json_rounded(r.ratio_to_copy, 4);
  if (r.graph) j["eager_median_ns"] = json_rounded(r.eager_median_ns, 1);
  if (r.plain_median_ns > 0) {
    j["plain_median_ns"] = json_rounded(r.plain_median_ns, 1);
    j["ratio_to_plain"] = json_rounded(r.median_ns / r.plain_median_ns, 4);
  }
  j["target"] = json_rounded(r.target, 2);
  j["target_against"] = r.plain_median_ns > 0 ? "plain" : r.graph ? "us" : "memcpy";
  j["bitwise"] = r.bitwise;
  j["pass"] = r.pass;
  return j.dump();
}

struct DeviceInfo {
  std::string name;
  int multiprocessors = 0;
  int64_t l2_bytes = 0;
};

DeviceInfo device_info() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp props{};
  check(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties");
  int l2 = 0;
  check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute (L2)");
  return {props.name, props.multiProcessorCount, l2};
}

void print_table(const std::vector<CudaRow>& rows, const DeviceInfo& info, const BenchOptions& o, std::ostream& out) {
  out << fmt::format(
      "rotary-dev bench --device cuda — {} ({} SMs, L2 {} MiB); Llama-3.1-8B q and k in one call (32 + 8 heads, "
      "head_dim 128) unless the case says otherwise (bench.hpp), int64 positions in device memory; medians of {} "
      "interleaved repetitions timed with CUDA events; copy: cudaMemcpyAsync device to device of the same bytes on "
      "the same stream; prefill-sized cases: 4096 tokens at 0-4095, events around {} passes over a pool of buffers "
      "holding >= {}x the L2; decode (1 token at {}) and batched_decode (64 tokens): a CUDA graph of {} calls "
      "replayed, per-call time, eager: the same calls launched one by one; plain: mrope's and the partial cases' "
      "plain variant (one stream; the whole head rotated) timed in the same row; caller: a float32 cos|sin cache "
      "by position; GB/s counts bytes read + written; bitwise: the output equals rotary::apply's on the CPU\n",
      info.name, info.multiprocessors, info.l2_bytes >> 20, o.reps, kStreamingPasses, kStreamingL2Multiple,
      kBenchDecodePosition, kGraphCalls);
  out << fmt::format("{:<19} {:<5} {:<12} {:<10} {:<12} {:<6} {:>10} {:>8} {:>9} {:>7} {:>9} {:>8} {:>10} {:<4} {}\n",
                     "case", "dtype", "pairing", "angles", "placement", "timing", "median_us", "GB/s", "copy_us",
                     "/copy", "eager_us", "/plain", "target", "pass", "bitwise");
  int passed = 0;
  for (const CudaRow& r : rows) {
    passed += r.pass ? 1 : 0;
    const bool plain = r.plain_median_ns > 0;
    out << fmt::format("{:<19} {:<5} {:<12} {:<10} {:<12} {:<6} {:>10.3f} {:>8.1f} {:>9.3f} {:>7.3f} {:>9} {:>8} "
                       "{:>10} {:<4} {}\n",
                       r.case_name, r.dtype, r.pairing, r.angles, r.inplace ? "in place" : "out of place",
                       r.graph ? "graph" : "events", r.median_ns / 1e3, r.gbps, r.copy_median_ns / 1e3, r.ratio_to_copy,
                       r.graph ? fmt::format("{:.3f}", r.eager_median_ns / 1e3) : "-",
                       plain ? fmt::format("{:.3f}", r.median_ns / r.plain_median_ns) : "-",
                       r.graph && !plain ? fmt::format("<={:.2f}us", r.target)
                                         : fmt::format("<={:.2f}x{}", r.target, plain ? " plain" : ""),
                       r.pass ? "yes" : "NO", r.bitwise ? "yes" : "NO");
  }
  out << fmt::format("{} of {} rows meet their targets (prefill: a ratio to the copy; decode: microseconds per "
                     "call under graph replay; mrope and partial: a ratio to the plain variant; every row: bitwise)\n",
                     passed, rows.size());
}


// ---- fused operations on the device (rotary/fused.hpp): rope_store and qk_norm_rope ----
//
// The CPU bench's fused rows (tools/bench.cpp) on the device: Llama-3.1-8B (32 q heads, 8 kv heads,
// head_dim 128), a paged NHD cache of 16-slot blocks through a shuffled block table (twice the
// blocks the tokens need), per-token int64 positions and slots in device memory (no host copy of
// the slots: the form a CUDA graph captures). prefill: 4096 tokens at 0 .. 4095, each side timed
// with events over kStreamingPasses passes through a pool of buffer sets (q|k|v, both caches, a
// copy's destination) holding >= kStreamingL2Multiple L2s; decode: 1 token at kBenchDecodePosition,
// a CUDA graph of kGraphCalls calls replayed over 8 resident sets. Each fused call against
//   unfused: what an engine queues without the fusion: rope_store = cuda::apply(q, k in place) then
//            a scatter kernel copying each token's k and v rows to its slot (reshape_and_cache);
//            qk_norm_rope = an RMSNorm kernel on q's heads, one on k's (transformers' rounding), then
//            cuda::apply (tools/bench_cuda_kernels.cu)
//   copy:    cudaMemcpyAsync of the bytes the fused call must move (rope_store: q, k and v; its
//            writes are q and the k and v rows; qk_norm_rope: q and k), device to device
//   plain:   decode only, cuda::apply of the same q and k (the 1.5x target)
// bitwise: the device's q, k and both caches after one call on the check inputs (caches poisoned
// with 0xff bytes) equal rotary::rope_store's / qk_norm_rope's on the CPU byte for byte.
constexpr int64_t kFusedBlockSize = 16;
constexpr int64_t kFusedDecodeSets = 8;
constexpr float kFusedEps = 1e-6f;
// Targets (issue 25, GPU): prefill faster than unfused and within 1.15x of the copy; decode within
// 1.5x of a plain rotary call.
constexpr double kFusedPrefillCopyTarget = 1.15;
constexpr double kFusedDecodePlainTarget = 1.5;

BenchElement element_of(DType dtype) {
  return dtype == DType::f32 ? BenchElement::f32 : dtype == DType::bf16 ? BenchElement::bf16 : BenchElement::f16;
}

// One op, shape and dtype: host inputs and positions/slots/weights, and the device's pool of sets.
struct FusedData {
  bool store = false, decode = false;
  DType dtype = DType::bf16;
  int64_t tokens = 0, q_bytes = 0, kv_bytes = 0, in_bytes = 0, blocks = 0, cache_bytes = 0, moved = 0, count = 0;
  std::vector<int64_t> positions, slots;
  std::vector<unsigned char> host_in, host_weight;
  DeviceMemory device_positions, device_slots, weight, error, in, k_cache, v_cache, copy_dst;
  DeviceMemory check_in, check_k_cache, check_v_cache;

  unsigned char* in_at(int64_t k) const { return in.get() + k % count * in_bytes; }
  unsigned char* k_cache_at(int64_t k) const { return k_cache.get() + k % count * cache_bytes; }
  unsigned char* v_cache_at(int64_t k) const { return v_cache.get() + k % count * cache_bytes; }
  unsigned char* copy_dst_at(int64_t k) const { return copy_dst.get() + k % count * moved; }
};

template <class T>
DeviceMemory device_copy(const std::vector<T>& host, const char* what) {
  const auto bytes = static_cast<int64_t>(host.size() * sizeof(T));
  DeviceMemory m = device_alloc(std::max<int64_t>(bytes, 1), what);
  check(cudaMemcpy(m.get(), host.data(), static_cast<size_t>(bytes), cudaMemcpyHostToDevice), what);
  return m;
}

FusedData make_fused_data(const std::string& op, bool decode, DType dtype, int64_t l2_bytes, std::mt19937_64& rng) {
  FusedData d;
  d.store = op == "rope_store";
  d.decode = decode;
  d.dtype = dtype;
  const int64_t es = size_of(dtype);
  d.tokens = decode ? 1 : 4096;
  d.q_bytes = d.tokens * kBenchHeadsQ * kBenchHeadDim * es;
  d.kv_bytes = d.tokens * kBenchHeadsK * kBenchHeadDim * es;
  d.in_bytes = d.q_bytes + (d.store ? 2 : 1) * d.kv_bytes;  // qk_norm_rope: q|k, no v
  d.blocks = 2 * ((d.tokens + kFusedBlockSize - 1) / kFusedBlockSize);
  d.cache_bytes = d.store ? d.blocks * kFusedBlockSize * kBenchHeadsK * kBenchHeadDim * es : 0;
  d.moved = d.store ? d.in_bytes : d.q_bytes + d.kv_bytes;
  // The pool holds >= kStreamingL2Multiple L2s of what one call reads (the apply cases' rule), so
  // the fused call's buffers are no more L2-resident than the copy's.
  d.count = decode ? kFusedDecodeSets
                   : std::max(kStreamingMinBuffers, (kStreamingL2Multiple * l2_bytes + d.moved - 1) / d.moved);
  d.host_in = random_input(d.in_bytes / es, dtype, rng);
  std::vector<int64_t> block_table(static_cast<size_t>(d.blocks));
  std::iota(block_table.begin(), block_table.end(), int64_t{0});
  std::shuffle(block_table.begin(), block_table.end(), rng);
  d.slots.resize(static_cast<size_t>(d.tokens));
  d.positions.resize(static_cast<size_t>(d.tokens));
  for (int64_t t = 0; t < d.tokens; ++t) {
    d.slots[static_cast<size_t>(t)] =
        block_table[static_cast<size_t>(t / kFusedBlockSize)] * kFusedBlockSize + t % kFusedBlockSize;
    d.positions[static_cast<size_t>(t)] = decode ? kBenchDecodePosition : t;
  }
  // Weights of 1 in the data's dtype: the calls run in place one after another, and a weight != 1
  // would shrink or grow q and k call after call (the kernels' work does not depend on the values).
  d.host_weight.resize(static_cast<size_t>(kBenchHeadDim * es));
  for (int64_t i = 0; i < kBenchHeadDim; ++i) {
    const uint32_t one = dtype == DType::f32 ? 0x3f800000u : dtype == DType::bf16 ? 0x3f80u : 0x3c00u;
    std::memcpy(d.host_weight.data() + i * es, &one, static_cast<size_t>(es));  // little-endian
  }
  d.device_positions = device_copy(d.positions, "cudaMalloc (positions)");
  d.device_slots = device_copy(d.slots, "cudaMalloc (slots)");
  d.weight = device_copy(d.host_weight, "cudaMalloc (norm weight)");
  d.error = device_alloc(sizeof(uint32_t), "cudaMalloc (error word)");
  check(cudaMemset(d.error.get(), 0, sizeof(uint32_t)), "cudaMemset (error word)");
  d.in = device_alloc(d.count * d.in_bytes, "cudaMalloc (inputs)");
  d.copy_dst = device_alloc(d.count * d.moved, "cudaMalloc (copy destinations)");
  d.check_in = device_alloc(d.in_bytes, "cudaMalloc (check input)");
  for (int64_t k = 0; k < d.count; ++k) {
    check(cudaMemcpy(d.in_at(k), d.host_in.data(), static_cast<size_t>(d.in_bytes), cudaMemcpyHostToDevice),
          "cudaMemcpy (inputs)");
  }
  if (d.store) {
    d.k_cache = device_alloc(d.count * d.cache_bytes, "cudaMalloc (k caches)");
    d.v_cache = device_alloc(d.count * d.cache_bytes, "cudaMalloc (v caches)");
    d.check_k_cache = device_alloc(d.cache_bytes, "cudaMalloc (check k cache)");
    d.check_v_cache = device_alloc(d.cache_bytes, "cudaMalloc (check v cache)");
    check(cudaMemset(d.k_cache.get(), 0, static_cast<size_t>(d.count * d.cache_bytes)), "cudaMemset (k caches)");
    check(cudaMemset(d.v_cache.get(), 0, static_cast<size_t>(d.count * d.cache_bytes)), "cudaMemset (v caches)");
  }
  check(cudaMemset(d.copy_dst.get(), 0, static_cast<size_t>(d.count * d.moved)), "cudaMemset (copy destinations)");
  // The memsets ran on the legacy stream, which the timer's non-blocking stream does not wait for.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return d;
}

// The calls of one row (a schedule and its angles) on buffer set k of the pool, or on given buffers.
struct FusedCall {
  const FusedData& d;
  const Schedule& schedule;
  const VariantAngles& angles;

  TensorView view(unsigned char* data, int64_t heads) const {
    return TensorView::bshd(data, d.dtype, 1, d.tokens, heads, kBenchHeadDim);
  }
  // apply's arguments for q and k (in place) of the set at `in`, positions and angles on the device
  // or (host) the CPU's.
  ApplyArgs rope(unsigned char* in, bool host) const {
    const int64_t* p = host ? d.positions.data() : reinterpret_cast<const int64_t*>(d.device_positions.get());
    ApplyArgs a{.q = view(in, kBenchHeadsQ), .k = view(in + d.q_bytes, kBenchHeadsK),
                .positions = Positions::per_token(std::span<const int64_t>(p, static_cast<size_t>(d.tokens)))};
    a.caller_angles = host ? angles.cpu_caller() : angles.device_caller();
    if (host) a.table = angles.cpu_table();
    return a;
  }
  RopeStoreArgs store_args(unsigned char* in, unsigned char* k_cache, unsigned char* v_cache, bool host) const {
    RopeStoreArgs a{.rope = rope(in, host)};
    const int64_t* s = host ? d.slots.data() : reinterpret_cast<const int64_t*>(d.device_slots.get());
    a.cache.slots = Slots::of(std::span<const int64_t>(s, static_cast<size_t>(d.tokens)));
    a.cache.k_cache = CacheView::nhd(k_cache, d.dtype, d.blocks, kFusedBlockSize, kBenchHeadsK, kBenchHeadDim);
    a.cache.v_cache = CacheView::nhd(v_cache, d.dtype, d.blocks, kFusedBlockSize, kBenchHeadsK, kBenchHeadDim);
    a.cache.v = view(in + d.q_bytes + d.kv_bytes, kBenchHeadsK);
    return a;
  }
  QkNormRopeArgs norm_args(unsigned char* in, bool host) const {
    QkNormRopeArgs a{.rope = rope(in, host)};
    a.q_weight = NormWeight{host ? d.host_weight.data() : d.weight.get(), d.dtype, kBenchHeadDim};
    a.k_weight = a.q_weight;
    a.eps = kFusedEps;
    return a;
  }
  cuda::FusedOptions fused_options() const {
    return cuda::FusedOptions{.table = angles.device_table(), .error = reinterpret_cast<uint32_t*>(d.error.get())};
  }
  void fused_on(unsigned char* in, unsigned char* k_cache, unsigned char* v_cache, cudaStream_t stream) const {
    if (d.store) {
      cuda::rope_store(schedule, store_args(in, k_cache, v_cache, false), stream, fused_options());
    } else {
      cuda::qk_norm_rope(schedule, norm_args(in, false), stream, fused_options());
    }
  }
  void plain_on(unsigned char* in, cudaStream_t stream) const {
    const cuda::Options options{.table = angles.device_table(), .error = reinterpret_cast<uint32_t*>(d.error.get())};
    cuda::apply(schedule, rope(in, false), stream, options);
  }

  void fused(int64_t k, cudaStream_t stream) const { fused_on(d.in_at(k), d.k_cache_at(k), d.v_cache_at(k), stream); }
  void plain(int64_t k, cudaStream_t stream) const { plain_on(d.in_at(k), stream); }
  void unfused(int64_t k, cudaStream_t stream) const {
    unsigned char* in = d.in_at(k);
    if (d.store) {
      plain_on(in, stream);
      check(bench_scatter_rows(in + d.q_bytes, in + d.q_bytes + d.kv_bytes, d.k_cache_at(k), d.v_cache_at(k),
                               reinterpret_cast<const int64_t*>(d.device_slots.get()), d.tokens,
                               kBenchHeadsK * kBenchHeadDim * size_of(d.dtype), stream),
            "the scatter kernel's launch");
    } else {
      const BenchElement e = element_of(d.dtype);
      check(bench_rms_norm(in, e, d.weight.get(), d.tokens * kBenchHeadsQ, kBenchHeadDim, kFusedEps, stream),
            "the RMSNorm kernel's launch (q)");
      check(bench_rms_norm(in + d.q_bytes, e, d.weight.get(), d.tokens * kBenchHeadsK, kBenchHeadDim, kFusedEps,
                           stream),
            "the RMSNorm kernel's launch (k)");
      plain_on(in, stream);
    }
  }
  void copy(int64_t k, cudaStream_t stream) const {
    check(cudaMemcpyAsync(d.copy_dst_at(k), d.in_at(k), static_cast<size_t>(d.moved), cudaMemcpyDeviceToDevice,
                          stream), "cudaMemcpyAsync");
  }
};

// Whether one fused call on the device, on the check input with caches of 0xff bytes, leaves q, k,
// v and both caches byte for byte as the same call on the CPU does; the error word must stay clear.
bool fused_device_matches(const FusedCall& call, cudaStream_t stream) {
  const FusedData& d = call.d;
  std::vector<unsigned char> in = d.host_in, k_cache(static_cast<size_t>(d.cache_bytes), 0xff), v_cache = k_cache;
  if (d.store) {
    rope_store(call.schedule, call.store_args(in.data(), k_cache.data(), v_cache.data(), true));
  } else {
    qk_norm_rope(call.schedule, call.norm_args(in.data(), true));
  }
  check(cudaMemcpyAsync(d.check_in.get(), d.host_in.data(), static_cast<size_t>(d.in_bytes), cudaMemcpyHostToDevice,
                        stream), "cudaMemcpyAsync");
  if (d.store) {
    check(cudaMemsetAsync(d.check_k_cache.get(), 0xff, static_cast<size_t>(d.cache_bytes), stream), "cudaMemsetAsync");
    check(cudaMemsetAsync(d.check_v_cache.get(), 0xff, static_cast<size_t>(d.cache_bytes), stream), "cudaMemsetAsync");
  }
  call.fused_on(d.check_in.get(), d.check_k_cache.get(), d.check_v_cache.get(), stream);
  cuda::check_positions(reinterpret_cast<uint32_t*>(d.error.get()), stream);
  std::vector<unsigned char> got_in(in.size()), got_k(k_cache.size()), got_v(v_cache.size());
  check(cudaMemcpyAsync(got_in.data(), d.check_in.get(), got_in.size(), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  if (d.store) {
    check(cudaMemcpyAsync(got_k.data(), d.check_k_cache.get(), got_k.size(), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
    check(cudaMemcpyAsync(got_v.data(), d.check_v_cache.get(), got_v.size(), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return got_in == in && got_k == k_cache && got_v == v_cache;
}

struct FusedCudaRow {
  std::string op, shape, dtype, pairing, angles;
  int64_t tokens = 0, calls = 0, buffers = 0, bytes = 0;
  double fused_ns = 0, unfused_ns = 0, copy_ns = 0, plain_ns = 0;  // plain: decode only
  bool bitwise = false, pass = false;
};

// The medians per call of every side, interleaved repetition by repetition after two warm-up
// repetitions: prefill by events around a queue of calls, decode by graph replay.
void time_fused_row(const FusedCall& call, const BenchOptions& o, Timer& timer, FusedCudaRow& row) {
  using Side = void (FusedCall::*)(int64_t, cudaStream_t) const;
  std::vector<Side> sides = {&FusedCall::fused, &FusedCall::unfused, &FusedCall::copy};
  if (call.d.decode) sides.push_back(&FusedCall::plain);
  const auto queue_of = [&](Side side) {
    return [&call, side, n = row.calls](cudaStream_t stream) {
      for (int64_t k = 0; k < n; ++k) (call.*side)(k, stream);
    };
  };
  std::vector<std::vector<double>> ns(sides.size());
  // Each side once outside the timer's gate first: a kernel's first launch may load it (lazy
  // loading), which may synchronise the context, and the gate holds the stream until all is queued.
  for (Side side : sides) (call.*side)(0, timer.stream());
  check(cudaStreamSynchronize(timer.stream()), "cudaStreamSynchronize");
  std::vector<std::unique_ptr<Graph>> graphs;
  if (call.d.decode) {
    for (Side side : sides) graphs.push_back(std::make_unique<Graph>(timer.stream(), queue_of(side)));
  }
  for (int rep = -2; rep < o.reps; ++rep) {
    for (size_t i = 0; i < sides.size(); ++i) {
      const double t = call.d.decode
                           ? timer.per_call_ns(row.calls, [&](cudaStream_t s) { graphs[i]->launch(s); })
                           : timer.per_call_ns(row.calls, queue_of(sides[i]));
      if (rep >= 0) ns[i].push_back(t);
    }
  }
  // No call flagged a position or a slot (the bench's are all valid: a flag is a defect).
  cuda::check_positions(reinterpret_cast<uint32_t*>(call.d.error.get()), timer.stream());
  row.fused_ns = median(ns[0]);
  row.unfused_ns = median(ns[1]);
  row.copy_ns = median(ns[2]);
  row.plain_ns = call.d.decode ? median(ns[3]) : 0.0;
}

void bench_fused(const FusedData& d, const std::string& op, const std::string& dtype_name, const BenchOptions& o,
                 Timer& timer, std::vector<FusedCudaRow>& rows) {
  const auto [lowest, highest] = std::minmax_element(d.positions.begin(), d.positions.end());
  for (const std::string& pairing_name : o.pairings) {
    const Schedule schedule = llama31_schedule(parse_pairing(pairing_name));
    for (const std::string& angles_name : o.angles) {
      const VariantAngles angles(schedule, angles_name, *lowest, *highest);
      // The tables' copies from pageable memory ran on the legacy stream: done before the timer's.
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      const FusedCall call{d, schedule, angles};
      FusedCudaRow row{op, d.decode ? "decode" : "prefill", dtype_name, pairing_name, angles_name, d.tokens,
                       d.decode ? kGraphCalls : kStreamingPasses * d.count, d.count, 2 * d.moved};
      row.bitwise = fused_device_matches(call, timer.stream());
      time_fused_row(call, o, timer, row);
      row.pass = row.bitwise && (d.decode ? row.fused_ns / row.plain_ns <= kFusedDecodePlainTarget
                                          : row.fused_ns < row.unfused_ns &&
                                                row.fused_ns / row.copy_ns <= kFusedPrefillCopyTarget);
      rows.push_back(row);
    }
  }
}

std::string json_fused_row(const FusedCudaRow& r) {
  for (const auto& [value, name] : {std::pair{r.fused_ns, "median_ns"}, std::pair{r.unfused_ns, "unfused_median_ns"},
                                    std::pair{r.copy_ns, "memcpy_median_ns"}, std::pair{r.plain_ns, "plain_median_ns"}}) {
    require_finite_for_json(value, fmt::format("{} of {}", name, r.op));
  }
  nlohmann::ordered_json j;
  j["device"] = "cuda";
  j["case"] = r.op;
  j["shape"] = r.shape;
  j["dtype"] = r.dtype;
  j["pairing"] = r.pairing;
  j["angles"] = r.angles;
  j["timing"] = r.shape == "decode" ? "graph" : "events";
  j["tokens"] = r.tokens;
  j["calls_per_rep"] = r.calls;
  j["buffers"] = r.buffers;
  j["bytes"] = r.bytes;
  j["median_ns"] = json_rounded(r.fused_ns, 1);
  j["gbps"] = json_rounded(static_cast<double>(r.bytes) / r.fused_ns, 3);
  j["unfused_median_ns"] = json_rounded(r.unfused_ns, 1);
  j["ratio_to_unfused"] = json_rounded(r.fused_ns / r.unfused_ns, 4);
  j["memcpy_median_ns"] = json_rounded(r.copy_ns, 1);
  j["ratio_to_memcpy"] = json_rounded(r.fused_ns / r.copy_ns, 4);
  if (r.plain_ns > 0) {
    j["plain_median_ns"] = json_rounded(r.plain_ns, 1);
    j["ratio_to_plain"] = json_rounded(r.fused_ns / r.plain_ns, 4);
  }
  j["target"] = r.plain_ns > 0 ? kFusedDecodePlainTarget : kFusedPrefillCopyTarget;
  j["target_against"] = r.plain_ns > 0 ? "plain" : "memcpy and unfused";
  j["bitwise"] = r.bitwise;
  j["pass"] = r.pass;
  return j.dump();
}

void print_fused_table(const std::vector<FusedCudaRow>& rows, const DeviceInfo& info, const BenchOptions& o,
                       std::ostream& out) {
  out << fmt::format(
      "rotary-dev bench --device cuda — fused operations on {} ({} SMs, L2 {} MiB): Llama-3.1-8B (32 q / 8 kv heads, "
      "head_dim 128), a paged NHD cache of {}-slot blocks through a shuffled block table; medians of {} interleaved "
      "repetitions; prefill: 4096 tokens, events around {} passes over a pool >= {}x the L2; decode: 1 token, a CUDA "
      "graph of {} calls replayed; unfused: cuda::apply + a scatter kernel (rope_store), two RMSNorm kernels + "
      "cuda::apply (qk_norm_rope); copy: cudaMemcpyAsync of the bytes the fused call moves; plain: cuda::apply of "
      "the same q and k; bitwise: q, k and the caches equal the CPU's\n",
      info.name, info.multiprocessors, info.l2_bytes >> 20, kFusedBlockSize, o.reps, kStreamingPasses,
      kStreamingL2Multiple, kGraphCalls);
  out << fmt::format("{:<13} {:<8} {:<5} {:<12} {:<10} {:>10} {:>8} {:>11} {:>9} {:>9} {:>7} {:>9} {:>7} {:>16} {:<4} "
                     "{}\n",
                     "case", "shape", "dtype", "pairing", "angles", "median_us", "GB/s", "unfused_us", "/unfused",
                     "copy_us", "/copy", "plain_us", "/plain", "target", "pass", "bitwise");
  int passed = 0;
  for (const FusedCudaRow& r : rows) {
    passed += r.pass ? 1 : 0;
    const bool decode = r.plain_ns > 0;
    out << fmt::format("{:<13} {:<8} {:<5} {:<12} {:<10} {:>10.3f} {:>8.1f} {:>11.3f} {:>9.3f} {:>9.3f} {:>7.3f} "
                       "{:>9} {:>7} {:>16} {:<4} {}\n",
                       r.op, r.shape, r.dtype, r.pairing, r.angles, r.fused_ns / 1e3,
                       static_cast<double>(r.bytes) / r.fused_ns, r.unfused_ns / 1e3, r.fused_ns / r.unfused_ns,
                       r.copy_ns / 1e3, r.fused_ns / r.copy_ns,
                       decode ? fmt::format("{:.3f}", r.plain_ns / 1e3) : "-",
                       decode ? fmt::format("{:.3f}", r.fused_ns / r.plain_ns) : "-",
                       decode ? fmt::format("<={:.2f}x plain", kFusedDecodePlainTarget)
                              : fmt::format("<1 unf, <={:.2f}x", kFusedPrefillCopyTarget),
                       r.pass ? "yes" : "NO", r.bitwise ? "yes" : "NO");
  }
  out << fmt::format("{} of {} fused rows meet their targets (prefill: faster than unfused and within {:.2f}x of the "
                     "copy; decode: within {:.2f}x of the plain call; every row: bitwise)\n",
                     passed, rows.size(), kFusedPrefillCopyTarget, kFusedDecodePlainTarget);
}

}  // namespace

std::string cuda_bench_unavailable() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    return fmt::format("no CUDA device (cudaGetDeviceCount: {}: {})", cudaGetErrorName(status),
                       cudaGetErrorString(status));
  }
  if (count == 0) return "no CUDA device (cudaGetDeviceCount: 0 devices)";
  return {};
}

int run_cuda_bench(const BenchOptions& o, std::ostream& out) {
  const DeviceInfo info = device_info();
  Timer timer;
  std::vector<CudaRow> rows;
  std::mt19937_64 rng(o.seed);
  for (const CudaBenchCase& c : kCudaBenchCases) {
    if (std::find(o.cases.begin(), o.cases.end(), c.name) == o.cases.end()) continue;
    for (const std::string& dtype_name : o.dtypes) {
      const CaseData d = make_case_data(c, dtype_of(dtype_name), info.l2_bytes, rng);
      bench_case(d, dtype_name, o, timer, rows);
    }
  }
  std::vector<FusedCudaRow> fused;
  for (const char* op : kCudaFusedCases) {
    if (std::find(o.cases.begin(), o.cases.end(), op) == o.cases.end()) continue;
    for (const bool decode : {false, true}) {
      for (const std::string& dtype_name : o.dtypes) {
        const FusedData d = make_fused_data(op, decode, dtype_of(dtype_name), info.l2_bytes, rng);
        bench_fused(d, op, dtype_name, o, timer, fused);
      }
    }
  }
  if (o.json) {
    std::vector<std::string> lines;
    for (const CudaRow& r : rows) lines.push_back(json_row(r));
    for (const FusedCudaRow& r : fused) lines.push_back(json_fused_row(r));
    std::string text = "[\n";
    for (size_t i = 0; i < lines.size(); ++i) text += lines[i] + (i + 1 < lines.size() ? ",\n" : "\n");
    out << text << "]\n";
    return 0;
  }
  if (!rows.empty()) print_table(rows, info, o, out);
  if (!fused.empty()) print_fused_table(fused, info, o, out);
  return 0;
}

}  // namespace rotary::cli
