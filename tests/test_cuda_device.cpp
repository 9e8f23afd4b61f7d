// The CUDA kernels on a device: the host emulation's calls (tests/support/cuda_calls.hpp: random
// calls, special values, real models, the whole position range) run by rotary::cuda::apply over
// device memory and compared BYTE FOR BYTE with rotary::apply's scalar reference: every arena is
// copied to the device whole, guard zones and poison included, and back, and every element must
// agree (NaNs compared as NaN: a GPU makes canonical NaNs). Besides: more tokens than the grid has
// blocks, unusable positions skipped and flagged in Options::error and named by
// cuda::check_positions, a stream other than the default (the call queued on it alone, without
// waiting for it), a decode call captured in a CUDA graph and replayed, and the C ABI
// (rotary_cuda_apply) on device memory.
//
// Without a usable CUDA device (as on CI) every test skips, naming why (ctest shows them skipped).
// ROTARY_DEVICE_CALLS=n runs the first n of the 4000 random calls (the compute-sanitizer runs,
// tests/cuda_sanitizer.cmake, take fewer).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/fast_body.hpp"
#include "cuda/fast_store_body.hpp"
#include "cuda/launch.hpp"
#include "cuda/rope_body.hpp"
#include "fused/fused_args.hpp"
#include "kernel/args.hpp"
#include "rotary/cuda.hpp"
#include "rotary/fused.hpp"
#include "rotary/rotary_cuda.h"
#include "support/cuda_calls.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

using namespace test;  // the calls (support/cuda_calls.hpp)

// ---- The device and its memory ----

// Throws std::runtime_error naming the CUDA call and the runtime's error (gtest reports it as the
// test's failure).
void cuda_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA ") + what + " failed: " + cudaGetErrorName(status) + ": " +
                             cudaGetErrorString(status));
  }
}

// Why no CUDA device is usable here, or empty when one is.
const std::string& no_device() {
  static const std::string why = [] {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(status) + ": " + cudaGetErrorString(status);
    }
    return count == 0 ? std::string("cudaGetDeviceCount found no device") : std::string();
  }();
  return why;
}

// Every test starts here: without a device it is skipped, saying why.
#define REQUIRE_DEVICE()                                                                        \
  do {                                                                                          \
    if (!no_device().empty()) {                                                                 \
      GTEST_SKIP() << "no usable CUDA device (" << no_device()                                  \
                   << "); the device tests need an NVIDIA GPU, the emulation tests run without"; \
    }                                                                                           \
  } while (false)

// Resets the device after the last test, so that compute-sanitizer's leak check sees whatever
// device memory a test left allocated.
class ResetDeviceAfterTheTests : public ::testing::Environment {
 public:
  void TearDown() override {
    if (no_device().empty()) static_cast<void>(cudaDeviceReset());
  }
};
[[maybe_unused]] const auto* const reset_device =
    ::testing::AddGlobalTestEnvironment(new ResetDeviceAfterTheTests);

// Device memory (cudaMalloc), or pinned host memory (cudaMallocHost), freed by the destructor.
template <bool kPinnedHost>
class Memory {
 public:
  explicit Memory(size_t bytes) : bytes_(bytes) {
    cuda_ok(kPinnedHost ? cudaMallocHost(&data_, bytes) : cudaMalloc(&data_, bytes),
            kPinnedHost ? "cudaMallocHost" : "cudaMalloc");
  }
  ~Memory() {
    if (data_ != nullptr) static_cast<void>(kPinnedHost ? cudaFreeHost(data_) : cudaFree(data_));
  }
  Memory(Memory&& other) noexcept : data_(std::exchange(other.data_, nullptr)), bytes_(other.bytes_) {}
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  Memory& operator=(Memory&&) = delete;

  unsigned char* get() const { return static_cast<unsigned char*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};
using DeviceMemory = Memory<false>;
using PinnedMemory = Memory<true>;

// Options::error: a zeroed word in device memory.
class ErrorWord {
 public:
  ErrorWord() { cuda_ok(cudaMemset(memory_.get(), 0, sizeof(uint32_t)), "cudaMemset (error word)"); }
  uint32_t* get() const { return reinterpret_cast<uint32_t*>(memory_.get()); }
  uint32_t read() const {
    uint32_t bits = 0;
    cuda_ok(cudaMemcpy(&bits, memory_.get(), sizeof bits, cudaMemcpyDeviceToHost), "cudaMemcpy (error word)");
    return bits;
  }

 private:
  DeviceMemory memory_{sizeof(uint32_t)};
};

// A stream of its own that does not synchronise with the legacy default stream.
class Stream {
 public:
  Stream() { cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~Stream() { static_cast<void>(cudaStreamDestroy(stream_)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// ---- A call on the device ----

// A call's memory on the device: a copy of each arena (guards and poison included) in an
// allocation of its own, its per-token positions, its table as a cuda::DeviceTable; and the call's
// arguments over them.
class DeviceCall {
 public:
  // Allocates and copies `arenas` and the call's positions (waits for the copies).
  DeviceCall(const Call& c, const std::vector<Arena>& arenas) : call_(c) {
    for (const Arena& arena : arenas) arenas_.emplace_back(arena.bytes.size());
    if (position_bytes(c) > 0) positions_.emplace(position_bytes(c));
    if (const std::optional<Table> table = table_of(c)) table_.emplace(*table);
    upload(arenas, nullptr);
    upload_positions(c, nullptr);
    cuda_ok(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
  }

  // Queues copies of `arenas` (of the call's sizes) into the device's on `stream`.
  void upload(const std::vector<Arena>& arenas, cudaStream_t stream) {
    for (size_t a = 0; a < arenas.size(); ++a) {
      cuda_ok(cudaMemcpyAsync(arenas_[a].get(), arenas[a].bytes.data(), arenas_[a].bytes(), cudaMemcpyHostToDevice,
                              stream),
              "cudaMemcpyAsync (arena to the device)");
    }
  }
  // Queues a copy of the per-token positions of `c` (the call's kind and count, any values).
  void upload_positions(const Call& c, cudaStream_t stream) {
    if (!positions_) return;
    cuda_ok(cudaMemcpyAsync(positions_->get(), position_data(c), positions_->bytes(), cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync (positions)");
  }
  // The device's arenas after the work queued on `stream`: `arenas` overwritten with them.
  std::vector<Arena> download(std::vector<Arena> arenas, cudaStream_t stream) const {
    for (size_t a = 0; a < arenas.size(); ++a) {
      cuda_ok(cudaMemcpyAsync(arenas[a].bytes.data(), arenas_[a].get(), arenas_[a].bytes(), cudaMemcpyDeviceToHost,
                              stream),
              "cudaMemcpyAsync (arena to the host)");
    }
    cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return arenas;
  }

  // The call's arguments over device memory (ApplyArgs::table null: a DeviceTable goes in Options).
  ApplyArgs args() {
    ArenaBases bases;
    for (const DeviceMemory& arena : arenas_) bases.push_back(arena.get());
    return args_at(call_, bases, positions_at(call_, positions_ ? positions_->get() : nullptr), nullptr, &angles_);
  }
  const cuda::DeviceTable* table() const { return table_ ? &*table_ : nullptr; }
  // Queues the call on `stream`.
  void apply(cudaStream_t stream, uint32_t* error) {
    cuda::apply(call_.schedule, args(), stream, {.table = table(), .error = error});
  }
  // The kernel arguments of cuda::apply (its checks, then make_kernel_args over the device memory).
  detail::KernelArgs kernel_args(uint32_t* error) {
    const ApplyArgs a = args();
    validate_shapes(call_.schedule, a);
    std::optional<detail::TableRows> range;
    if (table_) range = detail::TableRows{.cos = table_->cos(), .sin = table_->sin(), .first = table_->first(),
                                           .rows = table_->rows()};
    detail::KernelArgs kernel = detail::make_kernel_args(call_.schedule, a, range ? &*range : nullptr);
    kernel.error = error;
    return kernel;
  }
  // Queues the call on the general kernel with the call's own launch shape (or launch_shape's):
  // the shapes cuda::apply never picks on a GPU, and the general kernel for calls it gives the fast.
  void apply_general(cudaStream_t stream, uint32_t* error) {
    const detail::KernelArgs kernel = kernel_args(error);
    detail::cuda::launch(kernel, call_.default_shape ? detail::cuda::launch_shape(kernel) : call_.shape, stream);
  }
  // Queues the call on a fast kernel with `shape` (a call choose_kernel gives to them).
  void apply_fast(cudaStream_t stream, uint32_t* error, const detail::cuda::FastShape& shape) {
    detail::cuda::launch_fast(kernel_args(error), shape, stream);
  }
  detail::cuda::KernelChoice choice() { return detail::cuda::choose_kernel(kernel_args(nullptr)); }
  const DeviceMemory& arena(size_t a) const { return arenas_[a]; }

 private:
  const Call& call_;
  std::vector<DeviceMemory> arenas_;
  std::optional<DeviceMemory> positions_;
  std::optional<cuda::DeviceTable> table_;
  CallerAngles angles_;
};

// Runs `c` on the device (the legacy default stream) over copies of its arenas, through
// cuda::apply (the dispatcher's kernel), then the general kernel with the call's launch shape, then,
// when the fast kernels may take the call, a fast kernel with a random launch shape: each time every
// byte of every arena, copied back, must be the reference's, and no position may be flagged.
void check_on_device(const Call& c, uint64_t seed) {
  const std::vector<Arena> start = make_arenas(c, seed);
  const std::vector<Arena> want = reference_result(c, start);
  DeviceCall device(c, start);
  const ErrorWord error;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  const bool fast = device.choice().kind == detail::cuda::KernelKind::fast;
  for (int run = 0; run < 3; ++run) {
    std::string kernel = "cuda::apply (" + detail::cuda::describe(device.choice()) + ")";
    if (run == 0) {
      device.apply(nullptr, error.get());
    } else if (run == 1) {
      if (!fast && c.default_shape) continue;  // the same launch as cuda::apply's
      kernel = "the general kernel";
      device.upload(start, nullptr);
      device.apply_general(nullptr, error.get());
    } else {
      if (!fast) continue;
      const detail::cuda::FastShape shape = random_fast_shape(device.kernel_args(nullptr), rng);
      kernel = "a fast kernel, grid " + std::to_string(shape.grid) + "x" + std::to_string(shape.groups) + ", block " +
               std::to_string(shape.chunks) + "x" + std::to_string(shape.rows) + ", tiles of " +
               std::to_string(1 << shape.tile_shift);
      device.upload(start, nullptr);
      device.apply_fast(nullptr, error.get(), shape);
    }
    const std::vector<Arena> got = device.download(start, nullptr);
    const std::string difference = first_difference(c, got, want);
    ASSERT_TRUE(difference.empty()) << kernel << ": " << c.describe() << ": " << difference;
    ASSERT_EQ(error.read(), 0u) << kernel << ": " << c.describe() << ": a usable position was flagged";
  }
}

// Checks every call of `calls`, stopping at the first failure.
void check_calls_on_device(const std::vector<SeededCall>& calls) {
  for (const SeededCall& s : calls) {
    SCOPED_TRACE(s.model);
    check_on_device(s.call, s.seed);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// ROTARY_DEVICE_CALLS, or every random call.
int random_call_count() {
  const char* text = std::getenv("ROTARY_DEVICE_CALLS");
  if (text == nullptr || *text == '\0') return kRandomCalls;
  char* end = nullptr;
  const long count = std::strtol(text, &end, 10);
  if (*end != '\0' || count < 1 || count > kRandomCalls) {
    throw std::invalid_argument("ROTARY_DEVICE_CALLS=" + std::string(text) + " must be a count in [1, " +
                                std::to_string(kRandomCalls) + "]");
  }
  return static_cast<int>(count);
}

// ---- The emulation's calls ----

// The device, and the calls of one model (every angle source, both directions) on it: a device the
// kernels were not built for fails here, naming the CUDA error. (The sanitizer runs ask this test
// whether a device is usable.)
TEST(CudaDevice, RunsOnThisDevice) {
  REQUIRE_DEVICE();
  int device = 0, driver = 0, runtime = 0;
  cudaDeviceProp properties{};
  cuda_ok(cudaGetDevice(&device), "cudaGetDevice");
  cuda_ok(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  cuda_ok(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  cuda_ok(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  std::printf("device %d: %s, compute capability %d.%d, %d multiprocessors, %.1f GiB; CUDA driver %d, runtime %d\n",
              device, properties.name, properties.major, properties.minor, properties.multiProcessorCount,
              static_cast<double>(properties.totalGlobalMem) / (1 << 30), driver, runtime);
  std::vector<SeededCall> calls = real_model_calls();
  calls.resize(8);  // Llama-3.1-8B bf16: exact angles, a table, per-position and per-token cos/sin
  check_calls_on_device(calls);
}

// The emulation's sweep on the device (tests/support/cuda_calls.hpp's random_call: every layout,
// dtype, memory order, angle source and position kind), each with its own launch shape: half
// of them launch_shape's, the rest the emulation's odd shapes (per-item angles, blocks < tokens).
TEST(CudaDevice, RandomCallsMatchTheReferenceBitForBit) {
  REQUIRE_DEVICE();
  const int count = random_call_count();
  const std::vector<SeededCall> calls = random_calls(count);
  check_calls_on_device(calls);
  if (HasFatalFailure()) return;
  expect_coverage(calls, 20 * count / kRandomCalls, /*launch_shapes=*/false);
}

// The fast kernels' sweep (tests/support/cuda_calls.hpp's random_fast_call), through both kernels.
TEST(CudaDevice, FastKernelCallsMatchTheReferenceBitForBit) {
  REQUIRE_DEVICE();
  check_calls_on_device(fast_calls(std::min(kFastCalls, random_call_count())));
}

// Zeros, infinities, NaN, subnormals and values near each format's overflow, in q, k and the
// caller's cos/sin: the device's explicitly rounded arithmetic (no flush to zero) gives the same
// bits.
TEST(CudaDevice, SpecialValuesMatchTheReference) {
  REQUIRE_DEVICE();
  check_calls_on_device(special_value_calls());
}

// transformers' float32 angles on the device, from a device table and on the fly, bit for bit.
TEST(CudaDevice, HfFloat32CallsMatchTheReferenceBitForBit) {
  REQUIRE_DEVICE();
  check_calls_on_device(hf_float32_calls());
}

// ApplyArgs::undo on the device: the emulation's undo calls, bit for bit.
TEST(CudaDevice, UndoCallsMatchTheReferenceBitForBit) {
  REQUIRE_DEVICE();
  check_calls_on_device(undo_calls());
}

TEST(CudaDevice, RealModelShapes) {
  REQUIRE_DEVICE();
  check_calls_on_device(real_model_calls());
}

// Exact angles where float32 angles break down, computed by the device's double-double reduction.
TEST(CudaDevice, ExactAnglesAcrossTheWholePositionRange) {
  REQUIRE_DEVICE();
  check_calls_on_device(whole_range_calls());
}

TEST(CudaDevice, PerPositionAnglesAcrossTheWholeRange) {
  REQUIRE_DEVICE();
  check_calls_on_device(whole_range_angle_calls());
}

// Over a million tokens: more than the grid's detail::cuda::kMaxBlocks blocks, so blocks loop over
// tokens (the grid-stride loop, which the emulation alone reaches with smaller calls).
TEST(CudaDevice, MoreTokensThanBlocks) {
  REQUIRE_DEVICE();
  Call c = model_call(Spec{.head_dim = 4, .rotary_dim = 2}, DType::f32, 1, 1);
  c.batch = 1;
  c.seq = detail::cuda::kMaxBlocks + 3;
  c.in_order = 0;
  c.q_in_place = false;  // the tail (channels 2, 3) copied to q_out, k in place
  std::mt19937_64 rng(5);
  per_token_positions(c, 1, [&](int64_t) { return uniform(rng, 0, max_position_limit - 1); });
  lay_out(c);
  std::vector<Arena> host = make_arenas(c, 0);
  const detail::KernelArgs kernel = detail::make_kernel_args(c.schedule, args_of(c, host, nullptr));
  ASSERT_LT(detail::cuda::launch_shape(kernel).blocks, kernel.tokens);
  check_on_device(c, 31);
}

// Two million tokens (2 x (2^20 + 3)) through a fast kernel: its default grid (2^18 blocks of 8
// tokens) and a grid of 1000 blocks looping over the tiles.
TEST(CudaDevice, TwoMillionTokensThroughAFastKernel) {
  REQUIRE_DEVICE();
  Call c = model_call(Spec{.head_dim = 8}, DType::f32, 1, 1);
  c.batch = 2;
  c.seq = (int64_t{1} << 20) + 3;
  c.in_order = 0;
  c.k_order = 1;
  c.q_in_place = false;
  c.out_order = 0;
  std::mt19937_64 rng(6);
  per_token_positions(c, 1, [&](int64_t) { return uniform(rng, 0, max_position_limit - 1); });
  lay_out(c);
  const std::vector<Arena> start = make_arenas(c, 32);
  const std::vector<Arena> want = reference_result(c, start);
  DeviceCall device(c, start);
  ASSERT_EQ(detail::cuda::describe(device.choice()), "fast");
  const ErrorWord error;
  for (const int64_t grid : {int64_t{0}, int64_t{1000}}) {
    device.upload(start, nullptr);
    if (grid == 0) {
      device.apply(nullptr, error.get());
    } else {
      detail::cuda::FastShape shape = detail::cuda::fast_launch_shape(device.kernel_args(nullptr), 132);
      shape.grid = grid;
      device.apply_fast(nullptr, error.get(), shape);
    }
    const std::string difference = first_difference(c, device.download(start, nullptr), want);
    ASSERT_TRUE(difference.empty()) << "grid " << grid << ": " << difference;
    EXPECT_EQ(error.read(), 0u);
  }
}

// ---- Positions in device memory ----

// A token whose position the kernels cannot use is skipped (its outputs keep what they held), its
// bit set in Options::error, and cuda::check_positions names the rule and clears the word.
TEST(CudaDevice, UnusablePositionsAreSkippedFlaggedAndNamed) {
  REQUIRE_DEVICE();
  const std::map<uint32_t, std::string> rules = {
      {cuda::position_out_of_range, "outside [0, 2^31)"},
      {cuda::position_not_in_table, "fractional or not a row of the table"},
      {cuda::position_not_in_angles, "fractional or not below the rows of the per_position cos/sin"},
      {cuda::position_beyond_xpos_reach, "further from xpos_center than xPos's reach (rotary::xpos_reach)"}};
  for (const BadPosition& bad : bad_positions()) {
    for (int stream : {0, 2}) {  // the bad entry in the first stream, or only in the last
      Call c = bad_position_call(bad);
      const std::vector<Arena> start = make_arenas(c, 9);
      std::vector<Arena> want = reference_result(c, start);  // every position usable
      make_position_bad(c, bad, stream);
      keep_skipped_token(c, start, want);
      DeviceCall device(c, start);
      const ErrorWord error;
      device.apply(nullptr, error.get());
      const std::vector<Arena> got = device.download(start, nullptr);
      const std::string what = "position " + std::to_string(bad.value) + " in stream " + std::to_string(stream);
      const std::string difference = first_difference(c, got, want);
      ASSERT_TRUE(difference.empty()) << what << ": " << difference;
      EXPECT_EQ(error.read(), bad.bit) << what;
      EXPECT_ROTARY_ERROR(cuda::check_positions(error.get(), nullptr),
                          "positions: a per-token position was " + rules.at(bad.bit) +
                              " (those tokens were left unrotated)");
      EXPECT_EQ(error.read(), 0u) << what << ": check_positions clears the word";
      EXPECT_NO_THROW(cuda::check_positions(error.get(), nullptr)) << what;
    }
  }
}

// ---- Streams and graphs ----

// Holds a stream from a host function queued on it until opened; gives up after 20 s, so that a
// call that waits for the stream it was given fails instead of hanging.
class Gate {
 public:
  explicit Gate(cudaStream_t stream) { cuda_ok(cudaLaunchHostFunc(stream, &Gate::hold, this), "cudaLaunchHostFunc"); }
  void open() { open_ = true; }
  bool gave_up() const { return gave_up_; }

 private:
  static void CUDART_CB hold(void* self) {
    auto* gate = static_cast<Gate*>(self);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!gate->open_) {
      if (std::chrono::steady_clock::now() > deadline) {
        gate->gave_up_ = true;
        return;
      }
      std::this_thread::yield();
    }
  }
  std::atomic<bool> open_{false};
  std::atomic<bool> gave_up_{false};
};

// A call runs on the stream it is given, in that stream's order, and returns without waiting for
// it: with the stream held by a gate, the inputs' copies, the call and the copies back are queued
// behind it (from pinned memory: truly asynchronous), and only then is the gate opened. A kernel
// launched anywhere else (the legacy default stream does not wait for a non-blocking stream) would
// rotate the device's earlier contents, which the copies then overwrite.
TEST(CudaDevice, CallsRunOnTheStreamGivenWithoutWaitingForIt) {
  REQUIRE_DEVICE();
  const Stream stream;
  for (const SeededCall& s : real_model_calls()) {
    SCOPED_TRACE(s.model);
    const Call& c = s.call;
    const std::vector<Arena> start = make_arenas(c, s.seed);
    const std::vector<Arena> want = reference_result(c, start);
    DeviceCall device(c, make_arenas(c, s.seed + 1));  // other values until the stream copies the call's
    const ErrorWord error;
    // Once ungated: CUDA loads a kernel at its first launch, which may wait for the device.
    device.apply(stream.get(), error.get());
    cuda_ok(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    std::vector<PinnedMemory> staging;
    for (const Arena& arena : start) {
      staging.emplace_back(arena.bytes.size());
      std::memcpy(staging.back().get(), arena.bytes.data(), arena.bytes.size());
    }
    Gate gate(stream.get());
    for (size_t a = 0; a < staging.size(); ++a) {
      cuda_ok(cudaMemcpyAsync(device.arena(a).get(), staging[a].get(), staging[a].bytes(), cudaMemcpyHostToDevice,
                              stream.get()),
              "cudaMemcpyAsync (to the device)");
    }
    device.apply(stream.get(), error.get());
    for (size_t a = 0; a < staging.size(); ++a) {
      cuda_ok(cudaMemcpyAsync(staging[a].get(), device.arena(a).get(), staging[a].bytes(), cudaMemcpyDeviceToHost,
                              stream.get()),
              "cudaMemcpyAsync (to the host)");
    }
    gate.open();
    cuda_ok(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    ASSERT_FALSE(gate.gave_up()) << c.describe() << ": the call waited for the stream it was queued on";
    std::vector<Arena> got = start;
    for (size_t a = 0; a < got.size(); ++a) std::memcpy(got[a].bytes.data(), staging[a].get(), staging[a].bytes());
    const std::string difference = first_difference(c, got, want);
    ASSERT_TRUE(difference.empty()) << c.describe() << ": " << difference;
    ASSERT_EQ(error.read(), 0u) << c.describe();
  }
}

using Graph = std::unique_ptr<CUgraph_st, decltype([](cudaGraph_t g) { static_cast<void>(cudaGraphDestroy(g)); })>;
using GraphExec =
    std::unique_ptr<CUgraphExec_st, decltype([](cudaGraphExec_t g) { static_cast<void>(cudaGraphExecDestroy(g)); })>;

// Decode under a CUDA graph, as serving engines run it: one call captured (global capture mode
// refuses any allocation, synchronisation or pageable copy in it), one kernel node for q and k;
// nothing runs at capture; each replay reads the q, k and positions written into the same device
// memory before it, with the eager call's bytes and the reference's.
TEST(CudaDevice, DecodeCallCapturedInAGraphReplaysBitForBit) {
  REQUIRE_DEVICE();
  const Stream stream;
  // Llama-3.1-8B: 8 sequences decoding one token each, q [8, 1, 32, 128] and k [8, 1, 8, 128] bf16
  // slices of the fused QKV projection, rotated in place at positions of their own.
  const Spec llama{.head_dim = 128, .base = 500000, .schedule = ScheduleType::llama3, .factor = 8.0,
                   .original_max_position = 8192, .low_freq_factor = 1.0, .high_freq_factor = 4.0};
  for (int source : {0, 1, 2}) {  // exact angles, a DeviceTable, vLLM's per-position cos/sin cache
    Call c = model_call(llama, DType::bf16, 32, 8);
    c.batch = 8;
    c.seq = 1;
    c.table = source == 1;
    c.table_first = 4000;
    c.table_rows = 200;
    c.caller = source == 2;
    c.angle_index = CallerAngles::Index::per_position;
    c.angle_rows = 4200;
    per_token_positions(c, 1, [](int64_t i) { return 4090 + 7 * i; });
    lay_out(c);
    SCOPED_TRACE(c.describe());
    const std::vector<Arena> start = make_arenas(c, 40 + static_cast<uint64_t>(source));
    DeviceCall eager(c, start);
    DeviceCall replayed(c, start);
    const ErrorWord error;
    eager.apply(stream.get(), error.get());
    cuda_ok(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");

    cuda_ok(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    replayed.apply(stream.get(), error.get());
    cudaGraph_t captured = nullptr;
    cuda_ok(cudaStreamEndCapture(stream.get(), &captured), "cudaStreamEndCapture");
    const Graph graph(captured);
    size_t nodes = 0;
    cuda_ok(cudaGraphGetNodes(graph.get(), nullptr, &nodes), "cudaGraphGetNodes");
    EXPECT_EQ(nodes, 1u) << "q and k in one kernel";
    cudaGraphExec_t instantiated = nullptr;
    cuda_ok(cudaGraphInstantiate(&instantiated, graph.get(), 0), "cudaGraphInstantiate");
    const GraphExec exec(instantiated);
    const std::vector<Arena> untouched = replayed.download(start, stream.get());
    for (size_t a = 0; a < start.size(); ++a) {
      ASSERT_TRUE(untouched[a].bytes == start[a].bytes) << "ran at capture: " << first_difference(c, untouched, start);
    }

    cuda_ok(cudaGraphLaunch(exec.get(), stream.get()), "cudaGraphLaunch");
    const std::vector<Arena> got = replayed.download(start, stream.get());
    const std::vector<Arena> eager_got = eager.download(start, stream.get());
    for (size_t a = 0; a < start.size(); ++a) {
      ASSERT_TRUE(got[a].bytes == eager_got[a].bytes) << "replay != eager: " << first_difference(c, got, eager_got);
    }
    std::string difference = first_difference(c, got, reference_result(c, start));
    ASSERT_TRUE(difference.empty()) << difference;

    // The next step: new q and k, every position one further, written where the graph reads them.
    Call next = c;
    for (int64_t& p : next.p64) ++p;
    const std::vector<Arena> next_start = make_arenas(next, 50 + static_cast<uint64_t>(source));
    replayed.upload(next_start, stream.get());
    replayed.upload_positions(next, stream.get());
    cuda_ok(cudaGraphLaunch(exec.get(), stream.get()), "cudaGraphLaunch");
    difference = first_difference(next, replayed.download(next_start, stream.get()), reference_result(next, next_start));
    ASSERT_TRUE(difference.empty()) << "second replay: " << difference;
    EXPECT_EQ(error.read(), 0u);
  }
}

// ---- The C ABI ----

rotary_tensor c_tensor(const TensorView& v) {
  rotary_tensor t{};
  t.data = v.data;
  switch (v.dtype) {
    case DType::f32: t.dtype = ROTARY_F32; break;
    case DType::f64: t.dtype = ROTARY_F64; break;
    case DType::f16: t.dtype = ROTARY_F16; break;
    case DType::bf16: t.dtype = ROTARY_BF16; break;
    default: break;  // cache dtypes (rotary/fused.hpp) are not apply's
  }
  for (size_t i = 0; i < 4; ++i) {
    t.shape[i] = v.shape[i];
    t.strides[i] = v.strides[i];
  }
  return t;
}

// args as rotary.h spells them: sequential positions in args.offset; per-token int64 positions
// in `positions`, int32 ones in args.positions_i32.
rotary_apply_args c_args(const ApplyArgs& args, rotary_positions& positions) {
  rotary_apply_args c{};
  c.q = c_tensor(args.q);
  c.k = c_tensor(args.k);
  c.q_out = c_tensor(args.q_out);
  c.k_out = c_tensor(args.k_out);
  c.inverse = args.direction == Direction::inverse ? ROTARY_INVERSE : ROTARY_FORWARD;
  c.skip_tail_copy = args.copy_tail ? 0 : 1;
  c.backend = ROTARY_BACKEND_REFERENCE;
  const Positions& p = args.positions;
  positions = rotary_positions{};
  if (p.kind == Positions::Kind::sequential) {
    c.offset = p.offset;
  } else if (p.kind == Positions::Kind::per_token_i32) {
    c.positions_i32 = static_cast<const int32_t*>(p.data);
    c.positions_count = p.count;
  } else {
    positions = rotary_positions{.kind = ROTARY_POSITIONS_I64, .data = p.data, .count = p.count * p.streams,
                                 .streams = p.streams};
  }
  return c;
}

using CSchedule = std::unique_ptr<rotary_schedule, decltype(&rotary_schedule_free)>;
using CTable = std::unique_ptr<rotary_table, decltype(&rotary_table_free)>;
using CDeviceTable = std::unique_ptr<rotary_cuda_table, decltype(&rotary_cuda_table_free)>;

// The C ABI on device memory gives rotary_apply's bytes (the C ABI's reference backend on the
// host): a rotary_cuda_table with int64 positions in three streams, exact angles with int32
// positions from args, sequential positions out of place and inverse. rotary_cuda_check_positions
// names an unusable position, then finds the word cleared.
TEST(CudaDevice, CAbiOnDeviceMemory) {
  REQUIRE_DEVICE();
  // Qwen2-VL-7B: M-RoPE sections [16, 24, 24], 28 q heads, 4 kv heads.
  const int64_t sections[] = {16, 24, 24};
  rotary_spec spec{};
  spec.head_dim = 128;
  spec.base = 1e6;
  rotary_spec_ext ext{};
  ext.stream_layout = ROTARY_STREAMS_SECTIONS;
  ext.sections = sections;
  ext.sections_count = 3;
  rotary_schedule* made = nullptr;
  ASSERT_EQ(rotary_schedule_from_spec_ext(&spec, &ext, -1, &made), ROTARY_OK) << rotary_last_error();
  const CSchedule schedule(made, &rotary_schedule_free);
  rotary_table* host_made = nullptr;
  ASSERT_EQ(rotary_table_range(schedule.get(), 1000, 16, ROTARY_ANGLES_EXACT, &host_made), ROTARY_OK) << rotary_last_error();
  const CTable host_table(host_made, &rotary_table_free);
  rotary_cuda_table* device_made = nullptr;
  ASSERT_EQ(rotary_cuda_table_create(host_table.get(), &device_made), ROTARY_OK) << rotary_last_error();
  const CDeviceTable device_table(device_made, &rotary_cuda_table_free);

  const Spec qwen2_vl{.head_dim = 128, .base = 1e6, .stream_layout = StreamLayout::sections, .sections = {16, 24, 24}};
  std::mt19937_64 rng(8);
  for (int form : {0, 1, 2, 3}) {  // a table; exact, int32; sequential; a table and an unusable position
    Call c = model_call(qwen2_vl, DType::bf16, 28, 4);
    c.table = form == 0 || form == 3;
    if (c.table) {
      per_token_positions(c, 3, [&](int64_t) { return uniform(rng, 1000, 1015); });
      if (form == 3) c.p64[kBadToken] = 999;  // below the table's rows
    } else if (form == 1) {
      c.kind = Positions::Kind::per_token_i32;
      for (int64_t i = 0; i < c.batch * c.seq; ++i) c.p32.push_back(static_cast<int32_t>(uniform(rng, 0, 1 << 30)));
    } else {
      c.offset = 123456;
      c.q_in_place = c.k_in_place = false;
      c.out_order = 1;
      c.direction = Direction::inverse;
    }
    lay_out(c);
    SCOPED_TRACE(c.describe());
    std::vector<Arena> want = make_arenas(c, 60 + static_cast<uint64_t>(form));
    DeviceCall device(c, want);
    const ErrorWord error;
    rotary_positions device_positions{};
    const rotary_apply_args on_device = c_args(device.args(), device_positions);
    rotary_cuda_options options{};
    options.table = c.table ? device_table.get() : nullptr;
    options.error = error.get();
    ASSERT_EQ(rotary_cuda_apply(schedule.get(), &on_device,
                                device_positions.data != nullptr ? &device_positions : nullptr, nullptr, &options),
              ROTARY_OK)
        << rotary_last_error();
    const std::vector<Arena> got = device.download(want, nullptr);
    if (form == 3) {  // (the skipped token's bytes: UnusablePositionsAreSkippedFlaggedAndNamed)
      EXPECT_EQ(rotary_cuda_check_positions(error.get(), nullptr), ROTARY_ERROR_INVALID_ARGUMENT);
      EXPECT_NE(std::strstr(rotary_last_error(), "a per-token position was fractional or not a row of the table"),
                nullptr)
          << rotary_last_error();
      EXPECT_EQ(rotary_cuda_check_positions(error.get(), nullptr), ROTARY_OK) << rotary_last_error();
      continue;
    }
    EXPECT_EQ(rotary_cuda_check_positions(error.get(), nullptr), ROTARY_OK) << rotary_last_error();
    rotary_positions host_positions{};
    CallerAngles no_angles;
    rotary_apply_args host = c_args(args_of(c, want, nullptr, &no_angles), host_positions);
    host.table = c.table ? host_table.get() : nullptr;
    ASSERT_EQ(rotary_apply_positions(schedule.get(), &host, host_positions.data != nullptr ? &host_positions : nullptr),
              ROTARY_OK)
        << rotary_last_error();
    const std::string difference = first_difference(c, got, want);
    ASSERT_TRUE(difference.empty()) << difference;
  }
}

// ---- The fused operations on a device (rotary/fused.hpp, cuda.hpp): the CPU's bytes ----

// A host buffer and its device copy: up(), then the call on device pointers, then down().
struct Mirror {
  std::vector<unsigned char> host;
  DeviceMemory device;
  explicit Mirror(std::vector<unsigned char> bytes) : host(std::move(bytes)), device(std::max<size_t>(host.size(), 1)) {
    cuda_ok(cudaMemcpy(device.get(), host.data(), host.size(), cudaMemcpyHostToDevice), "cudaMemcpy (up)");
  }
  std::vector<unsigned char> down() const {
    std::vector<unsigned char> out(host.size());
    cuda_ok(cudaMemcpy(out.data(), device.get(), out.size(), cudaMemcpyDeviceToHost), "cudaMemcpy (down)");
    return out;
  }
  void* d() const { return device.get(); }
  void* h() { return host.data(); }
};

// n bf16 values of N(0, 1)-like magnitude (finite: the bytes compare exactly).
/// A fused call's per-token positions (below max_position) and slots (distinct, over a shuffled cache
/// of `capacity` slots; token `skipped` gets -1), drawn from rng.
struct TokenSlots {
  std::vector<int64_t> positions;
  std::vector<int64_t> slots;
};
TokenSlots shuffled_tokens(int64_t tokens, int64_t capacity, uint64_t max_position, int64_t skipped,
                           std::mt19937_64& rng) {
  TokenSlots out{std::vector<int64_t>(static_cast<size_t>(tokens)), std::vector<int64_t>(static_cast<size_t>(tokens))};
  std::vector<int64_t> order(static_cast<size_t>(capacity));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int64_t t = 0; t < tokens; ++t) {
    out.positions[static_cast<size_t>(t)] = static_cast<int64_t>(rng() % max_position);
    out.slots[static_cast<size_t>(t)] = t == skipped ? -1 : order[static_cast<size_t>(t)];
  }
  return out;
}

std::vector<unsigned char> bf16_values(int64_t n, std::mt19937_64& rng) {
  std::vector<unsigned char> out(static_cast<size_t>(2 * n));
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    const float v = normal(rng);
    std::memcpy(&bits, &v, 4);
    const auto b = static_cast<uint16_t>(bits >> 16);
    std::memcpy(&out[static_cast<size_t>(2 * i)], &b, 2);
  }
  return out;
}

template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& v) {
  std::vector<unsigned char> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

TEST(CudaDevice, FusedOperationsMatchTheCpuByteForByte) {
  REQUIRE_DEVICE();
  const Schedule schedule = make_schedule(Spec{.head_dim = 128, .base = 500000.0, .schedule = ScheduleType::llama3,
                                               .factor = 8.0, .original_max_position = 8192, .low_freq_factor = 1.0,
                                               .high_freq_factor = 4.0});
  const int64_t tokens = 37, hq = 8, hk = 2, d = 128, blocks = 8, block = 16;
  std::mt19937_64 rng(25);
  const auto [positions, slots] = shuffled_tokens(tokens, blocks * block, 200000, 5, rng);
  const float scale = 0.07f;
  for (const DType cache : {DType::bf16, DType::fp8_e4m3, DType::i8}) {
    SCOPED_TRACE(to_string(cache));
    const int64_t cache_bytes = blocks * block * hk * d * size_of(cache);
    Mirror q(bf16_values(tokens * hq * d, rng)), k(bf16_values(tokens * hk * d, rng)), v(bf16_values(tokens * hk * d, rng));
    Mirror kc(std::vector<unsigned char>(static_cast<size_t>(cache_bytes), 0xA5));
    Mirror vc(std::vector<unsigned char>(static_cast<size_t>(cache_bytes), 0x5A));
    Mirror pos(bytes_of(positions)), sl(bytes_of(slots)), sc(bytes_of(std::vector<float>{scale}));
    const auto args = [&](bool on_device) {
      const auto at = [&](Mirror& m) { return on_device ? m.d() : m.h(); };
      RopeStoreArgs a;
      a.rope = ApplyArgs{.q = TensorView::bshd(at(q), DType::bf16, 1, tokens, hq, d),
                         .k = TensorView::bshd(at(k), DType::bf16, 1, tokens, hk, d),
                         .positions = Positions::per_token(std::span(static_cast<const int64_t*>(at(pos)),
                                                                     static_cast<size_t>(tokens)))};
      a.cache.slots = Slots{.data = at(sl), .is_i64 = true, .count = tokens};
      a.cache.k_cache = CacheView::nhd(at(kc), cache, blocks, block, hk, d);
      a.cache.v_cache = CacheView::nhd(at(vc), cache, blocks, block, hk, d);
      a.cache.v = TensorView::bshd(at(v), DType::bf16, 1, tokens, hk, d);
      if (is_quantised_dtype(cache)) {
        a.cache.k_quant = CacheQuant{.scale = static_cast<const float*>(at(sc))};
        a.cache.v_quant = a.cache.k_quant;
      }
      return a;
    };
    const ErrorWord error;
    cuda::rope_store(schedule, args(true), nullptr, {.error = error.get()});
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    rope_store(schedule, args(false));
    EXPECT_EQ(error.read(), 0u);
    EXPECT_TRUE(q.down() == q.host) << "q";
    EXPECT_TRUE(kc.down() == kc.host) << "k_cache";
    EXPECT_TRUE(vc.down() == vc.host) << "v_cache";

    // rerotate_cache by per-slot deltas on the caches just written (exact angles on both).
    std::vector<int64_t> delta(static_cast<size_t>(tokens));
    for (auto& x : delta) x = static_cast<int64_t>(rng() % 2001) - 1000;
    Mirror dl(bytes_of(delta));
    const auto re = [&](bool on_device) {
      RerotateCacheArgs r{.cache = args(on_device).cache.k_cache, .slots = Slots{.data = on_device ? sl.d() : sl.h(),
                                                                               .is_i64 = true, .count = tokens}};
      r.delta = static_cast<const int64_t*>(on_device ? dl.d() : dl.h());
      if (is_quantised_dtype(cache)) r.quant = CacheQuant{.scale = static_cast<const float*>(on_device ? sc.d() : sc.h())};
      return r;
    };
    cuda::rerotate_cache(schedule, re(true), nullptr, {.error = error.get()});
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    rerotate_cache(schedule, re(false));
    EXPECT_TRUE(kc.down() == kc.host) << "rerotated k_cache";

    // qk_norm_rope with the cache write, through the C ABI on the device.
    Mirror qw(bf16_values(d, rng)), kw(bf16_values(d, rng));
    rotary_spec spec{};
    spec.head_dim = 128;
    spec.base = 500000.0;
    rotary_schedule* made = nullptr;
    ASSERT_EQ(rotary_schedule_from_spec(&spec, -1, &made), ROTARY_OK) << rotary_last_error();
    const CSchedule plain(made, &rotary_schedule_free);
    const auto norm_c = [&](bool on_device, rotary_cache_write& write, rotary_positions& p) {
      const auto at = [&](Mirror& m) { return on_device ? m.d() : m.h(); };
      rotary_qk_norm_rope_args a{};
      EXPECT_EQ(rotary_tensor_bshd(at(q), ROTARY_BF16, 1, tokens, hq, d, &a.rope.q), ROTARY_OK);
      EXPECT_EQ(rotary_tensor_bshd(at(k), ROTARY_BF16, 1, tokens, hk, d, &a.rope.k), ROTARY_OK);
      p = rotary_positions{};
      p.kind = ROTARY_POSITIONS_I64;
      p.data = at(pos);
      p.count = tokens;
      p.streams = 1;
      a.positions = &p;
      a.q_weight = rotary_norm_weight{at(qw), ROTARY_BF16, d};
      a.k_weight = rotary_norm_weight{at(kw), ROTARY_BF16, d};
      write = rotary_cache_write{};
      write.slots = rotary_slots{ROTARY_SLOTS_I64, at(sl), tokens};
      EXPECT_EQ(rotary_cache_view_nhd(at(kc), cache == DType::bf16 ? ROTARY_BF16 : cache == DType::i8 ? ROTARY_I8
                                                                                                  : ROTARY_FP8_E4M3,
                                      blocks, block, hk, d, 0, 0, &write.k_cache),
                ROTARY_OK);
      if (is_quantised_dtype(cache)) write.k_quant = rotary_cache_quant{static_cast<const float*>(at(sc)), 1,
                                                                        ROTARY_SCALE_DIVIDE};
      a.store = &write;
      return a;
    };
    rotary_cache_write dw, hw;
    rotary_positions dp, hp;
    const rotary_qk_norm_rope_args on_device = norm_c(true, dw, dp);
    rotary_cuda_fused_options options{};
    options.error = error.get();
    ASSERT_EQ(rotary_cuda_qk_norm_rope(plain.get(), &on_device, nullptr, &options), ROTARY_OK) << rotary_last_error();
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const rotary_qk_norm_rope_args on_host = norm_c(false, hw, hp);
    ASSERT_EQ(rotary_qk_norm_rope(plain.get(), &on_host), ROTARY_OK) << rotary_last_error();
    EXPECT_EQ(error.read(), 0u);
    EXPECT_TRUE(q.down() == q.host) << "normed q";
    EXPECT_TRUE(k.down() == k.host) << "normed k";
    EXPECT_TRUE(kc.down() == kc.host) << "k_cache after qk_norm_rope";
  }
}

// rope_store's fast kernel (src/cuda/fast_store_body.hpp) on the device, with the launch
// cuda::rope_store picks and with shapes it does not (one SM's multi-token tiles, one block looping
// over every tile, a head per group, one row per token): q, k_out and both caches equal the CPU's
// rope_store byte for byte, bf16 half pairing and f32 interleaved with a slice at an offset.
TEST(CudaDevice, RopeStoreFastKernelOnEveryLaunchShapeMatchesTheCpu) {
  REQUIRE_DEVICE();
  struct Case {
    DType dtype;
    Schedule schedule;
  };
  const Case cases[] = {{DType::bf16, make_schedule(Spec{.head_dim = 128})},
                        {DType::f32, make_schedule(Spec{.head_dim = 96, .rotary_dim = 64, .pairing = Pairing::interleaved,
                                                        .rotary_offset = 16})}};
  const int64_t tokens = 37, hq = 8, hk = 2, blocks = 8, block = 16;
  std::mt19937_64 rng(2525);
  const auto [positions, slots] = shuffled_tokens(tokens, blocks * block, 500000, 7, rng);
  for (const Case& c : cases) {
    const int64_t d = c.schedule.head_dim, es = size_of(c.dtype);
    SCOPED_TRACE(to_string(c.dtype));
    const auto values = [&](int64_t n) {  // finite values of the dtype (bf16's bits widened for f32)
      std::vector<unsigned char> b = bf16_values(n, rng), out(static_cast<size_t>(n * es));
      for (int64_t i = 0; i < n; ++i) {
        if (es == 2) {
          std::memcpy(&out[static_cast<size_t>(2 * i)], &b[static_cast<size_t>(2 * i)], 2);
        } else {
          uint16_t h;
          std::memcpy(&h, &b[static_cast<size_t>(2 * i)], 2);
          const uint32_t w = uint32_t{h} << 16;
          std::memcpy(&out[static_cast<size_t>(4 * i)], &w, 4);
        }
      }
      return out;
    };
    const std::vector<unsigned char> q0 = values(tokens * hq * d), k0 = values(tokens * hk * d), v0 = values(tokens * hk * d);
    const std::vector<unsigned char> poison(static_cast<size_t>(blocks * block * hk * d * es), 0xA5);
    // The CPU's result, once.
    std::vector<unsigned char> q = q0, k = k0, v = v0, k_out(k0.size(), 0x3C), kc = poison, vc = poison;
    const auto args = [&](void* qp, void* kp, void* vp, void* kop, void* kcp, void* vcp, const int64_t* pos, const int64_t* sl) {
      RopeStoreArgs a;
      a.rope = ApplyArgs{.q = TensorView::bshd(qp, c.dtype, 1, tokens, hq, d), .k = TensorView::bshd(kp, c.dtype, 1, tokens, hk, d),
                         .positions = Positions::per_token(std::span(pos, static_cast<size_t>(tokens)))};
      a.rope.k_out = TensorView::bshd(kop, c.dtype, 1, tokens, hk, d);
      a.cache.slots = Slots{.data = sl, .is_i64 = true, .count = tokens};
      a.cache.k_cache = CacheView::nhd(kcp, c.dtype, blocks, block, hk, d);
      a.cache.v_cache = CacheView::hnd(vcp, c.dtype, blocks, block, hk, d);
      a.cache.v = TensorView::bshd(vp, c.dtype, 1, tokens, hk, d);
      return a;
    };
    rope_store(c.schedule, args(q.data(), k.data(), v.data(), k_out.data(), kc.data(), vc.data(), positions.data(), slots.data()));
    Mirror pos(bytes_of(positions)), sl(bytes_of(slots));
    int sms = 0;
    cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
    // Variant 0: cuda::rope_store's own launch; 1-5: launch_fast_store with other shapes.
    for (int variant = 0; variant < 6; ++variant) {
      Mirror dq(q0), dk(k0), dv(v0), dko(std::vector<unsigned char>(k0.size(), 0x3C)), dkc(poison), dvc(poison);
      const RopeStoreArgs a = args(dq.d(), dk.d(), dv.d(), dko.d(), dkc.d(), dvc.d(), static_cast<const int64_t*>(pos.d()),
                                   static_cast<const int64_t*>(sl.d()));
      const ErrorWord error;
      if (variant == 0) {
        // The fast kernel is what cuda::rope_store runs for this call.
        detail::validate_rope_store(c.schedule, a, false);
        ASSERT_EQ(detail::cuda::fast_store_refusal(detail::make_rope_store_args(c.schedule, a, nullptr)), nullptr);
        cuda::rope_store(c.schedule, a, nullptr, {.error = error.get()});
      } else {
        detail::validate_rope_store(c.schedule, a, false);
        detail::FusedKernelArgs f = detail::make_rope_store_args(c.schedule, a, nullptr);
        f.rope.error = error.get();
        ASSERT_EQ(detail::cuda::fast_store_refusal(f), nullptr);
        detail::cuda::FastShape shape = detail::cuda::fast_store_launch_shape(f, variant == 1 ? 1 : variant == 2 ? 4 : sms);
        if (variant == 3) shape.grid = 1;                       // one block loops over every tile
        if (variant == 4) shape.group_heads = 1, shape.groups = static_cast<int>(hq + 2 * hk);  // a head per group
        if (variant == 5) shape.rows = 1 << shape.tile_shift;  // one row per token: threads loop over heads
        SCOPED_TRACE("variant " + std::to_string(variant) + ": chunks=" + std::to_string(shape.chunks) +
                     " rows=" + std::to_string(shape.rows) + " tile_shift=" + std::to_string(shape.tile_shift) +
                     " groups=" + std::to_string(shape.groups) + " grid=" + std::to_string(shape.grid));
        detail::cuda::launch_fast_store(f, shape, nullptr);
      }
      cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      EXPECT_EQ(error.read(), 0u) << "variant " << variant;
      EXPECT_TRUE(dq.down() == q) << "q, variant " << variant;
      EXPECT_TRUE(dk.down() == k0) << "k (read only), variant " << variant;
      EXPECT_TRUE(dko.down() == k_out) << "k_out, variant " << variant;
      EXPECT_TRUE(dkc.down() == kc) << "k_cache, variant " << variant;
      EXPECT_TRUE(dvc.down() == vc) << "v_cache, variant " << variant;
    }
  }
}

// DeepSeek-V3's MLA write on the device: q's rope part [tokens, 16, 64] in place, k_pe [tokens, 1, 64]
// rotated (interleaved) into the latent row's last 64 channels and kv_c [tokens, 1, 512] beside it,
// bf16 and fp8 e4m3 (a scale each in device memory): cuda::rope_store runs the fast kernel (k_pass as
// its copied heads) and writes the CPU's bytes.
TEST(CudaDevice, MlaRopeStoreTakesTheFastKernelAndMatchesTheCpu) {
  REQUIRE_DEVICE();
  const Schedule schedule = make_schedule(Spec{.head_dim = 64, .pairing = Pairing::interleaved});
  const int64_t tokens = 45, hq = 16, d = 64, pass = 512, row = pass + d, blocks = 4, block = 64;
  std::mt19937_64 rng(2727);
  const auto [positions, slots] = shuffled_tokens(tokens, blocks * block, 160000, 3, rng);
  const std::vector<unsigned char> q0 = bf16_values(tokens * hq * d, rng), k0 = bf16_values(tokens * d, rng),
                                   p0 = bf16_values(tokens * pass, rng);
  for (const DType cache_dtype : {DType::bf16, DType::fp8_e4m3}) {
    SCOPED_TRACE(to_string(cache_dtype));
    const int64_t ces = size_of(cache_dtype);
    const std::vector<unsigned char> poison(static_cast<size_t>(blocks * block * row * ces), 0x5A);
    const std::vector<float> scales{0.75f, 1.5f};  // k_pe's, kv_c's
    const auto args = [&](void* qp, void* kp, void* pp, void* cp, const int64_t* pos, const int64_t* sl,
                          const float* sc) {
      RopeStoreArgs a;
      a.rope = ApplyArgs{.q = TensorView::bshd(qp, DType::bf16, 1, tokens, hq, d),
                         .k = TensorView::bshd(kp, DType::bf16, 1, tokens, 1, d),
                         .positions = Positions::per_token(std::span(pos, static_cast<size_t>(tokens)))};
      a.cache.slots = Slots{.data = sl, .is_i64 = true, .count = tokens};
      a.cache.k_cache = CacheView::nhd(cp, cache_dtype, blocks, block, 1, d, pass, row);
      a.cache.k_pass = TensorView::bshd(pp, DType::bf16, 1, tokens, 1, pass);
      a.cache.k_pass_cache = CacheView::nhd(cp, cache_dtype, blocks, block, 1, pass, 0, row);
      if (cache_dtype != DType::bf16) {
        a.cache.k_quant = CacheQuant{.scale = sc, .count = 1};
        a.cache.k_pass_quant = CacheQuant{.scale = sc + 1, .count = 1};
      }
      return a;
    };
    std::vector<unsigned char> q = q0, k = k0, p = p0, cache = poison;
    rope_store(schedule, args(q.data(), k.data(), p.data(), cache.data(), positions.data(), slots.data(), scales.data()));
    Mirror dq(q0), dk(k0), dp(p0), dc(poison), pos(bytes_of(positions)), sl(bytes_of(slots)), sc(bytes_of(scales));
    const RopeStoreArgs a = args(dq.d(), dk.d(), dp.d(), dc.d(), static_cast<const int64_t*>(pos.d()),
                                 static_cast<const int64_t*>(sl.d()), static_cast<const float*>(sc.d()));
    detail::validate_rope_store(schedule, a, false);
    ASSERT_EQ(detail::cuda::fast_store_refusal(detail::make_rope_store_args(schedule, a, nullptr)), nullptr);
    const ErrorWord error;
    cuda::rope_store(schedule, a, nullptr, {.error = error.get()});
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    EXPECT_EQ(error.read(), 0u);
    EXPECT_TRUE(dq.down() == q) << "q";
    EXPECT_TRUE(dk.down() == k) << "k";
    EXPECT_TRUE(dc.down() == cache) << "latent cache";
    EXPECT_NE(cache, poison) << "the CPU wrote the cache";
  }
}

// qk_norm_rope's fast kernel on the device (Qwen3's norm before the rotation, bf16 weights, the
// cache write), with the launch cuda::qk_norm_rope picks and with others: q, k and both caches equal
// the CPU's byte for byte.
TEST(CudaDevice, QkNormRopeFastKernelOnEveryLaunchShapeMatchesTheCpu) {
  REQUIRE_DEVICE();
  const Schedule schedule = make_schedule(Spec{.head_dim = 128, .base = 1000000.0});
  const int64_t tokens = 29, hq = 16, hk = 4, d = 128, blocks = 8, block = 16;
  std::mt19937_64 rng(2626);
  const auto [positions, slots] = shuffled_tokens(tokens, blocks * block, 100000, 3, rng);
  const std::vector<unsigned char> q0 = bf16_values(tokens * hq * d, rng), k0 = bf16_values(tokens * hk * d, rng);
  const std::vector<unsigned char> v0 = bf16_values(tokens * hk * d, rng), qw0 = bf16_values(d, rng), kw0 = bf16_values(d, rng);
  const std::vector<unsigned char> poison(static_cast<size_t>(blocks * block * hk * d * 2), 0xA5);
  CacheWrite host_write, device_write;
  const auto args = [&](CacheWrite& w, void* qp, void* kp, void* vp, void* kcp, void* vcp, const void* qw, const void* kw,
                        const int64_t* pos, const int64_t* sl) {
    QkNormRopeArgs a;
    a.rope = ApplyArgs{.q = TensorView::bshd(qp, DType::bf16, 1, tokens, hq, d), .k = TensorView::bshd(kp, DType::bf16, 1, tokens, hk, d),
                       .positions = Positions::per_token(std::span(pos, static_cast<size_t>(tokens)))};
    a.q_weight = NormWeight{qw, DType::bf16, d};
    a.k_weight = NormWeight{kw, DType::bf16, d};
    a.eps = 1e-6f;
    a.v = TensorView::bshd(vp, DType::bf16, 1, tokens, hk, d);
    w = CacheWrite{.slots = Slots{.data = sl, .is_i64 = true, .count = tokens},
                   .k_cache = CacheView::nhd(kcp, DType::bf16, blocks, block, hk, d),
                   .v_cache = CacheView::hnd(vcp, DType::bf16, blocks, block, hk, d)};
    a.store = &w;
    return a;
  };
  std::vector<unsigned char> q = q0, k = k0, v = v0, qw = qw0, kw = kw0, kc = poison, vc = poison;
  qk_norm_rope(schedule, args(host_write, q.data(), k.data(), v.data(), kc.data(), vc.data(), qw.data(), kw.data(),
                              positions.data(), slots.data()));
  Mirror pos(bytes_of(positions)), sl(bytes_of(slots)), dqw(qw0), dkw(kw0);
  for (int variant = 0; variant < 4; ++variant) {  // 0: cuda::qk_norm_rope; 1-3: other launch shapes
    Mirror dq(q0), dk(k0), dv(v0), dkc(poison), dvc(poison);
    const QkNormRopeArgs a = args(device_write, dq.d(), dk.d(), dv.d(), dkc.d(), dvc.d(), dqw.d(), dkw.d(),
                                  static_cast<const int64_t*>(pos.d()), static_cast<const int64_t*>(sl.d()));
    const ErrorWord error;
    if (variant == 0) {
      // The fast kernel is what cuda::qk_norm_rope runs for this call.
      detail::validate_qk_norm_rope(schedule, a, false);
      ASSERT_EQ(detail::cuda::fast_store_refusal(detail::make_qk_norm_rope_args(schedule, a, nullptr)), nullptr);
      cuda::qk_norm_rope(schedule, a, nullptr, {.error = error.get()});
    } else {
      detail::validate_qk_norm_rope(schedule, a, false);
      detail::FusedKernelArgs f = detail::make_qk_norm_rope_args(schedule, a, nullptr);
      f.rope.error = error.get();
      ASSERT_EQ(detail::cuda::fast_store_refusal(f), nullptr);
      detail::cuda::FastShape shape = detail::cuda::fast_store_launch_shape(f, variant == 1 ? 1 : 132);
      if (variant == 3) shape.rows = 1 << shape.tile_shift, shape.grid = std::min<int64_t>(shape.grid, 2);
      detail::cuda::launch_fast_store(f, shape, nullptr);
    }
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    EXPECT_EQ(error.read(), 0u) << "variant " << variant;
    EXPECT_TRUE(dq.down() == q) << "q, variant " << variant;
    EXPECT_TRUE(dk.down() == k) << "k, variant " << variant;
    EXPECT_TRUE(dkc.down() == kc) << "k_cache, variant " << variant;
    EXPECT_TRUE(dvc.down() == vc) << "v_cache, variant " << variant;
  }
}

// With check_duplicate_slots, a slot two tokens share is written by neither and flagged; the device
// result equals the CPU's with those tokens' slots set to -1 (and rerotate_cache's likewise).
TEST(CudaDevice, ADuplicateSlotIsWrittenByNeitherTokenAndFlagged) {
  REQUIRE_DEVICE();
  const Schedule schedule = make_schedule(Spec{.head_dim = 64});
  const int64_t tokens = 300, h = 2, d = 64, blocks = 40, block = 16;  // tokens > a block's threads
  std::mt19937_64 rng(31);
  std::vector<int64_t> order(static_cast<size_t>(blocks * block));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int64_t> slots(order.begin(), order.begin() + tokens), unique = slots;
  slots[290] = slots[3];  // shared by tokens 3 and 290
  unique[290] = unique[3] = -1;
  std::vector<int64_t> positions(static_cast<size_t>(tokens));
  std::iota(positions.begin(), positions.end(), 1000);
  const int64_t cache_bytes = blocks * block * h * d * 2;
  Mirror q(bf16_values(tokens * h * d, rng)), k(bf16_values(tokens * h * d, rng)), v(bf16_values(tokens * h * d, rng));
  Mirror kc(std::vector<unsigned char>(static_cast<size_t>(cache_bytes), 0xA5));
  Mirror vc(std::vector<unsigned char>(static_cast<size_t>(cache_bytes), 0x5A));
  Mirror pos(bytes_of(positions)), sl(bytes_of(slots)), un(bytes_of(unique));
  const auto args = [&](bool on_device) {
    const auto at = [&](Mirror& m) { return on_device ? m.d() : m.h(); };
    RopeStoreArgs a;
    a.rope = ApplyArgs{.q = TensorView::bshd(at(q), DType::bf16, 1, tokens, h, d),
                       .k = TensorView::bshd(at(k), DType::bf16, 1, tokens, h, d),
                       .positions = Positions::per_token(std::span(static_cast<const int64_t*>(at(pos)),
                                                                   static_cast<size_t>(tokens)))};
    a.cache.slots = Slots{.data = on_device ? sl.d() : un.h(), .is_i64 = true, .count = tokens};
    a.cache.k_cache = CacheView::nhd(at(kc), DType::bf16, blocks, block, h, d);
    a.cache.v_cache = CacheView::nhd(at(vc), DType::bf16, blocks, block, h, d);
    a.cache.v = TensorView::bshd(at(v), DType::bf16, 1, tokens, h, d);
    return a;
  };
  const ErrorWord error;
  EXPECT_ROTARY_ERROR(cuda::rope_store(schedule, args(true), nullptr, {.check_duplicate_slots = true}),
                      "check_duplicate_slots needs FusedOptions::error");
  cuda::rope_store(schedule, args(true), nullptr, {.error = error.get(), .check_duplicate_slots = true});
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  rope_store(schedule, args(false));
  EXPECT_EQ(error.read(), cuda::slot_duplicate);
  EXPECT_TRUE(q.down() == q.host) << "q";
  EXPECT_TRUE(kc.down() == kc.host) << "k_cache";
  EXPECT_TRUE(vc.down() == vc.host) << "v_cache";
  EXPECT_ROTARY_ERROR(cuda::check_positions(error.get(), nullptr), "slots: a slot was listed twice");

  std::vector<int64_t> delta(static_cast<size_t>(tokens), 77);
  Mirror dl(bytes_of(delta));
  const auto re = [&](bool on_device) {
    RerotateCacheArgs r{.cache = args(on_device).cache.k_cache,
                        .slots = Slots{.data = on_device ? sl.d() : un.h(), .is_i64 = true, .count = tokens}};
    r.delta = static_cast<const int64_t*>(on_device ? dl.d() : dl.h());
    return r;
  };
  cuda::rerotate_cache(schedule, re(true), nullptr, {.error = error.get(), .check_duplicate_slots = true});
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  rerotate_cache(schedule, re(false));
  EXPECT_EQ(error.read(), cuda::slot_duplicate);
  EXPECT_TRUE(kc.down() == kc.host) << "rerotated k_cache";
}

// A scale in device memory that is not finite and > 0: nothing written, scale_invalid flagged.
TEST(CudaDevice, AnUnusableDeviceScaleWritesNothingAndIsFlagged) {
  REQUIRE_DEVICE();
  const Schedule schedule = make_schedule(Spec{.head_dim = 64});
  const int64_t tokens = 5, h = 2, d = 64;
  std::mt19937_64 rng(41);
  Mirror q(bf16_values(tokens * h * d, rng)), k(bf16_values(tokens * h * d, rng));
  Mirror kc(std::vector<unsigned char>(static_cast<size_t>(4 * 16 * h * d), 0xA5));
  Mirror sl(bytes_of(std::vector<int64_t>{7, 1, 30, -1, 4}));
  Mirror sc(bytes_of(std::vector<float>{0.5f, std::numeric_limits<float>::quiet_NaN()}));
  RopeStoreArgs a;
  a.rope = ApplyArgs{.q = TensorView::bshd(q.d(), DType::bf16, 1, tokens, h, d),
                     .k = TensorView::bshd(k.d(), DType::bf16, 1, tokens, h, d)};
  a.cache.slots = Slots{.data = sl.d(), .is_i64 = true, .count = tokens};
  a.cache.k_cache = CacheView::nhd(kc.d(), DType::fp8_e4m3, 4, 16, h, d);
  a.cache.k_quant = CacheQuant{.scale = static_cast<const float*>(sc.d()), .count = 2};
  const ErrorWord error;
  cuda::rope_store(schedule, a, nullptr, {.error = error.get()});
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  EXPECT_EQ(error.read(), cuda::scale_invalid);
  EXPECT_TRUE(q.down() == q.host) << "q";
  EXPECT_TRUE(kc.down() == kc.host) << "k_cache";
  EXPECT_ROTARY_ERROR(cuda::check_positions(error.get(), nullptr), "scales: a scale was not finite and > 0");
}

// Raw keys rotated to their positions with a DeviceTable's rows (the CPU: the host Table), and an
// unusable raw position flagged (position_out_of_range) with its keys left.
TEST(CudaDevice, RawKeysFromADeviceTableMatchTheCpuAndBadPositionsAreFlagged) {
  REQUIRE_DEVICE();
  const Schedule schedule = make_schedule(Spec{.head_dim = 64});
  const Table host_table = Table::range(schedule, 0, 4096);
  const cuda::DeviceTable table(host_table);
  const int64_t count = 20, h = 2, d = 64, blocks = 4, block = 16;
  std::mt19937_64 rng(43);
  Mirror kc(bf16_values(blocks * block * h * d, rng));
  std::vector<int64_t> slots(static_cast<size_t>(count)), positions(static_cast<size_t>(count));
  std::iota(slots.begin(), slots.end(), 30);
  for (auto& p : positions) p = static_cast<int64_t>(rng() % 4096);
  std::vector<int64_t> cpu_slots = slots;
  cpu_slots[5] = -1;  // its position below is unusable on the device
  Mirror sl(bytes_of(slots)), cs(bytes_of(cpu_slots)), pos(bytes_of(positions));
  positions[5] = -4;
  Mirror bad_pos(bytes_of(positions));
  const auto args = [&](bool on_device) {
    RerotateCacheArgs a{.cache = CacheView::nhd(on_device ? kc.d() : kc.h(), DType::bf16, blocks, block, h, d),
                        .slots = Slots{.data = on_device ? sl.d() : cs.h(), .is_i64 = true, .count = count}};
    a.mode = RerotateMode::raw;
    a.positions = Positions::per_token(std::span(static_cast<const int64_t*>(on_device ? bad_pos.d() : pos.h()),
                                                 static_cast<size_t>(count)));
    return a;
  };
  const ErrorWord error;
  cuda::rerotate_cache(schedule, args(true), nullptr, {.table = &table, .error = error.get()});
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  RerotateCacheArgs cpu = args(false);
  cpu.table = &host_table;
  rerotate_cache(schedule, cpu);
  EXPECT_EQ(error.read(), cuda::position_out_of_range);
  EXPECT_TRUE(kc.down() == kc.host) << "k_cache";
}

}  // namespace
}  // namespace rotary
