// `rotary-dev bench`: RoPE against a memcpy of the same bytes, measured in one process.
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
  /// apply's angles; rerotate's rows use its own cos/sin ("caller"), switch's "on_the_fly". cuda:
  /// also "caller", named (a float32 cos|sin cache indexed by position, vLLM's and FlashInfer's).
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

/// The cases of `rotary-dev bench --device cuda`. The default run: Llama-3.1-8B q [batch, seq, 32, 128]
/// and k [batch, seq, 8, 128] rotated in one call; `prefill` (positions 0 .. 4095) streams from
/// device memory, its buffers rotated through a pool several times the L2, timed with CUDA events
/// around a queue of calls; `decode` (position 131071) and `batched_decode` (64 sequences, one token
/// each, positions drawn up to 131071) are cache-resident, timed by replaying a CUDA graph of many
/// calls. Named with --cases, prefill-sized and each timed against its plain variant (the same
/// shapes, one stream or the whole head rotated) in the same row: `mrope` (Qwen2-VL's M-RoPE
/// sections [16, 24, 24] over Llama-3.1-8B's heads, base 10^6, three streams of per-token positions:
/// a text prefix, then video frames), `partial_deepseek_v3` (q [1, 4096, 128, 192], the rotated 64
/// channels last, DeepSeek-V3's MLA query; its k_pe, one 64-channel head, is a call of its own) and
/// `partial_phi` (Phi-2: q and k [1, 4096, 32, 80], 32 channels rotated).
enum class CudaCaseKind { llama, mrope, partial };
struct CudaBenchCase {
  const char* name;
  int64_t batch, seq;
  bool graph;  ///< timed by graph replay (decode-sized), else by events around eager calls
  CudaCaseKind kind = CudaCaseKind::llama;
  int64_t heads_q = 32, heads_k = 8, head_dim = 128;
  int64_t rotary_dim = 0;     ///< partial: the rotated channels, else all of head_dim
  int64_t rotary_offset = 0;  ///< partial: the first rotated channel
  bool by_default = true;     ///< in the run without --cases
};
inline constexpr CudaBenchCase kCudaBenchCases[] = {
    {"prefill", 1, 4096, false},
    {"decode", 1, 1, true},
    {"batched_decode", 64, 1, true},
    {"mrope", 1, 4096, false, CudaCaseKind::mrope, 32, 8, 128, 0, 0, false},
    {"partial_deepseek_v3", 1, 4096, false, CudaCaseKind::partial, 128, 0, 192, 64, 128, false},
    {"partial_phi", 1, 4096, false, CudaCaseKind::partial, 32, 32, 80, 32, 0, false}};
/// The fused operations `rotary-dev bench --device cuda` times when named (rope_store, qk_norm_rope:
/// prefill and decode, against the unfused composition, a copy and a plain call; tools/bench_cuda.cpp).
inline constexpr const char* kCudaFusedCases[] = {"rope_store", "qk_norm_rope"};
inline constexpr int64_t kBenchHeadsQ = 32, kBenchHeadsK = 8, kBenchHeadDim = 128;
inline constexpr int64_t kBenchDecodePosition = 131071;

/// Qwen2-VL's text rotary (head_dim 128, base 10^6, `pairing`); `streams` 3: M-RoPE by its
/// mrope_section [16, 24, 24], 1: the same frequencies with one stream.
Schedule bench_mrope_schedule(int streams, Pairing pairing);
/// Qwen2-VL position_ids [3, 1, seq] of the M-RoPE cases: a 1024-token text prefix (t = h = w = s),
/// then video frames of a 32 x 32 grid.
std::vector<int64_t> bench_mrope_positions(int64_t seq);

/// Why `rotary-dev bench --device cuda` cannot run in this process ("this rotary was built without
/// CUDA", "no CUDA device (cudaGetDeviceCount: <error>)"), or empty when a device is there.
std::string cuda_bench_unavailable();

/// `rotary-dev bench --device cuda` (tools/bench_cuda.cpp, built with the CUDA backend): options already
/// validated, a device present. Each row: the call's median time against a device-to-device copy
/// of the same bytes timed interleaved in the same process, its target (prefill: a ratio to the
/// copy; decode: microseconds per call) and whether the device's output equals rotary::apply's on
/// the CPU bit for bit.
int run_cuda_bench(const BenchOptions& options, std::ostream& out);

}  // namespace rotary::cli
