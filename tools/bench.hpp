// `rotary bench`: RoPE against a memcpy of the same bytes, measured in one process.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "rotary/schedule.hpp"

namespace rotary::cli {

struct BenchOptions {
  /// "cpu" (rotary::apply against memcpy) or "cuda" (rotary::cuda::apply against a device-to-device
  /// cudaMemcpyAsync, tools/bench_cuda.cpp).
  std::string device = "cpu";
  /// Empty: the device's default cases. cpu: "prefill_q", "prefill_k", "decode", "batched_decode",
  /// "mrope"; also "rerotate" and "switch" (cached keys moved by rerotate / switch_schedule), only
  /// when named: they add about a third to the default run's minutes. cuda: kCudaBenchCases.
  std::vector<std::string> cases;
  std::vector<std::string> dtypes = {"f32", "f16", "bf16"};
  std::vector<std::string> pairings = {"half", "interleaved"};
  /// apply's angles; rerotate's rows use its own cos/sin ("caller"), switch's "on_the_fly".
  std::vector<std::string> angles = {"table", "on_the_fly"};
  std::vector<std::string> placement = {"inplace", "outofplace"};
  std::vector<int> threads;  ///< empty: 1 and all (cpu only)
  int reps = 15;             ///< timed repetitions per side, after warm-up; medians reported
  bool json = false;
  uint64_t seed = 1;
};

/// Validates the options (throws rotary::Error naming the bad value), runs, prints a table or JSON.
/// Each row carries its speed target (a ratio to memcpy; for `mrope`, to the same call with one
/// stream; rerotate and switch, prefill's; target_of in tools/bench.cpp) and whether the measured
/// median meets it.
int run_bench(const BenchOptions& options, std::ostream& out);

/// Llama 3.1's RoPE (head_dim 128, base 500000, llama3 scaling by 8 from 8192), the schedule of every
/// apply case of both devices.
Schedule llama31_schedule(Pairing pairing);

/// The cases of `rotary bench --device cuda`: Llama-3.1-8B q [batch, seq, 32, 128] and k [batch,
/// seq, 8, 128] rotated in one call. `prefill` (positions 0 .. 4095) streams from device memory, its
/// buffers rotated through a pool several times the L2, timed with CUDA events around a queue of
/// calls; `decode` (position 131071) and `batched_decode` (64 sequences, one token each, positions
/// drawn up to 131071) are cache-resident, timed by replaying a CUDA graph of many calls.
struct CudaBenchCase {
  const char* name;
  int64_t batch, seq;
  bool graph;  ///< timed by graph replay (decode-sized), else by events around eager calls
};
inline constexpr CudaBenchCase kCudaBenchCases[] = {
    {"prefill", 1, 4096, false}, {"decode", 1, 1, true}, {"batched_decode", 64, 1, true}};
inline constexpr int64_t kBenchHeadsQ = 32, kBenchHeadsK = 8, kBenchHeadDim = 128;
inline constexpr int64_t kBenchDecodePosition = 131071;

/// Why `rotary bench --device cuda` cannot run in this process ("this rotary was built without
/// CUDA", "no CUDA device (cudaGetDeviceCount: <error>)"), or empty when a device is there.
std::string cuda_bench_unavailable();

/// `rotary bench --device cuda` (tools/bench_cuda.cpp, built with the CUDA backend): options already
/// validated, a device present. Each row: the call's median time against a device-to-device copy
/// of the same bytes timed interleaved in the same process, its target (prefill: a ratio to the
/// copy; decode: microseconds per call) and whether the device's output equals rotary::apply's on
/// the CPU bit for bit.
int run_cuda_bench(const BenchOptions& options, std::ostream& out);

}  // namespace rotary::cli
