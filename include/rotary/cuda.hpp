// rotary — the CUDA backend: rotate q and k in device memory, on a stream. Built when CMake finds
// nvcc (ROTARY_CUDA=AUTO, the default, or ON), as the library rotary_cuda; this header needs no
// CUDA header (cudaStream_t is CUstream_st*).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rotary/apply.hpp"
#include "rotary/error.hpp"
#include "rotary/fused.hpp"
#include "rotary/schedule.hpp"
#include "rotary/table.hpp"

struct CUstream_st;

namespace rotary::cuda {

/// A cudaStream_t (nullptr: the legacy default stream).
using Stream = CUstream_st*;

/// What a failure of the CUDA runtime throws (no device, device memory exhausted, a copy or a
/// launch that failed), as distinct from a broken rule (a plain rotary::Error): its message names
/// the CUDA call and the runtime's error, e.g. "CUDA cudaMalloc (table cos) failed:
/// cudaErrorNoDevice: no CUDA-capable device is detected".
class RuntimeError : public Error {
 public:
  using Error::Error;
};

/// The most pairs (rotary_dim / 2) a CUDA call rotates: the kernels take inv_freq and the pairs'
/// streams in their launch parameters (nothing to copy per call, so a call can be captured in a
/// CUDA graph), which CUDA caps at 32 KB.
inline constexpr int64_t max_pairs = 2048;

/// A Table copied to device memory: the rows of one contiguous range of positions (Table::range),
/// gathered by `position - first()` without any search. Owns its memory (freed by the destructor,
/// on the device that was current at upload); move-only.
class DeviceTable {
 public:
  /// Copies `table` to the current device and waits for the copy. Throws rotary::Error when the
  /// table's positions are not one contiguous range (a Table::at with gaps, repeats or another
  /// order), RuntimeError when allocating or copying fails.
  explicit DeviceTable(const Table& table);
  ~DeviceTable();
  DeviceTable(DeviceTable&& other) noexcept;
  DeviceTable& operator=(DeviceTable&& other) noexcept;
  DeviceTable(const DeviceTable&) = delete;
  DeviceTable& operator=(const DeviceTable&) = delete;

  const Schedule& schedule() const { return schedule_; }
  int64_t first() const { return first_; }  ///< the position of row 0
  int64_t rows() const { return rows_; }
  int64_t pairs() const { return schedule_.pairs(); }
  const float* cos() const { return cos_; }  ///< device memory, rows() * pairs() values
  const float* sin() const { return sin_; }

 private:
  void release() noexcept;

  Schedule schedule_;
  float* cos_ = nullptr;
  float* sin_ = nullptr;
  int64_t first_ = 0;
  int64_t rows_ = 0;
};

/// Bits a kernel ors into Options::error for a token it skipped (nothing of it read or written).
inline constexpr uint32_t position_out_of_range = 1;   ///< not in [0, 2^31), NaN included
inline constexpr uint32_t position_not_in_table = 2;   ///< fractional (table or hf_float32), or no table row
inline constexpr uint32_t position_not_in_angles = 4;  ///< per_position ApplyArgs::caller_angles: fractional,
                                                       ///< or not below their rows
inline constexpr uint32_t position_beyond_xpos_reach = 8;  ///< xPos: |p - xpos_center| > xpos_reach

/// What a CUDA call takes besides ApplyArgs.
struct Options {
  const DeviceTable* table = nullptr;  ///< angles from this table (built from an equal schedule),
                                       ///< or null: exact angles computed on the fly
  uint32_t* error = nullptr;  ///< device memory, or null: per-token positions are read on the
                              ///< device only, so they are checked there; a token with an unusable
                              ///< position is skipped and its position_* bit or'ed in here
};

/// rotary::apply on a CUDA device: q, k, q_out, k_out, per-token positions and the caller's
/// cos/sin (ApplyArgs::caller_angles, its cos and sin pointers) in device memory, the kernels queued on
/// `stream` (asynchronous; no host synchronisation, no allocation, so a call can be captured in a
/// CUDA graph). Results are rotary::apply's bit for bit, NaNs compared as NaN (a GPU's arithmetic
/// makes canonical NaNs): the same rotation (the larger product fused), exact angles from the same
/// double-double reduction, a DeviceTable's values, or the caller's values widened as the CPU
/// widens them (any dtype, columns, index and strides CallerAngles allows).
///
/// Checked on the host before anything is queued, by rotary::validate_shapes (apply.hpp: every rule
/// of validate but the per-token entries; errors naming the argument): shapes, strides, dtypes,
/// aliasing (the caller's cos/sin included), the positions' kind, streams and count, sequential
/// offsets (with a table, that they are rows of it; with per_position angles, that they are below
/// its rows; with xPos, within its reach). xPos schedules scale q as queries and k as keys, as on
/// the CPU (the same bits: ln ζ_j and e^t are the project's own double code, src/math/xpos.hpp). Errors too: ApplyArgs::table (a host Table:
/// pass a DeviceTable in options), angles together with Options::table, rotary_dim / 2 >
/// max_pairs. ApplyArgs::threads and backend are not used. The memory must be on the current
/// device; that is not checked (a wrong pointer is a CUDA error on the stream). Per-token positions
/// are checked by the kernels (see Options::error): in [0, 2^31), and, where they index rows (a
/// DeviceTable, per_position angles), whole numbers whose row exists; with xPos, within its reach.
/// Throws rotary::Error; RuntimeError when the launch fails.
void apply(const Schedule& schedule, const ApplyArgs& args, Stream stream, const Options& options = {});

// ---- Fused operations (rotary/fused.hpp) on a device ----
// The kernels (src/cuda/fused.cu) run src/fused/body.hpp one token per block, the block's threads
// filling the token's angle row, then one head (item) per warp: the grid tests/test_fused_emulation
// plays on the host, bit-identical to the CPU there. On a device: CudaDevice.FusedOperationsMatchTheCpu-
// ByteForByte (tests/test_cuda_device.cpp, the C++ calls and the C ABI's) and
// python/tests/test_torch_fused_cuda.py, both run by scripts/gpu-check (not yet on a GPU).

/// Bit a fused kernel ors into FusedOptions::error for a token whose slot is beyond a cache's
/// capacity (the token's cache writes are skipped; q and k_out are still written).
inline constexpr uint32_t slot_out_of_range = 16;
/// Bit a fused kernel ors into FusedOptions::error for a slot two tokens (or, for rerotate_cache,
/// two entries) share, with FusedOptions::check_duplicate_slots (neither token's cache writes are
/// made, neither entry's keys turned: no race, the cache rows keep what they held).
inline constexpr uint32_t slot_duplicate = 32;
/// Bit a fused kernel ors into FusedOptions::error when a scale it reads (a cache's, q_out's) is not
/// finite and > 0: the host's rule for host scales; the kernels then write nothing at all.
inline constexpr uint32_t scale_invalid = 64;

/// What a fused CUDA call takes besides its arguments.
struct FusedOptions {
  const DeviceTable* table = nullptr;  ///< as Options::table (rope_store, qk_norm_rope)
  /// As Options::error, plus slot_out_of_range, slot_duplicate, scale_invalid. Null: what the kernels
  /// skip (tokens, slots, a whole call with an unusable scale) is not reported at all.
  uint32_t* error = nullptr;
  /// A host copy of the call's slots (same count and type): checked on the host (range,
  /// duplicates) before anything is queued, as the CPU checks them. Null: the slots live on the
  /// device only (the form a CUDA graph captures); the kernels skip and flag an out-of-range slot,
  /// and duplicates are detected only with check_duplicate_slots (else which of two tokens writes a
  /// shared slot is undefined).
  const Slots* host_slots = nullptr;
  /// Without host_slots: the kernels also look for a slot two tokens share, each token's block
  /// scanning every other token's slot (work of tokens² compares per call, spread over the grid:
  /// a debugging aid for prefill sizes, cheap for decode batches), and flag it as slot_duplicate
  /// (capturable in a CUDA graph). Needs `error`. Ignored with host_slots (checked on the host).
  bool check_duplicate_slots = false;
};

/// rotary::rope_store on a CUDA device: every pointer of args (views, caches, slots, scales,
/// positions, the caller's cos/sin) in device memory, queued on `stream`, no allocation, no
/// synchronisation. Bit-identical to the CPU (the same ROTARY_HD body, src/fused/body.hpp).
/// Checked on the host: everything validate checks but the per-token entries (positions as
/// validate_shapes; slots when options.host_slots is given). Scales' values are checked by the
/// kernels (scale_invalid).
void rope_store(const Schedule& schedule, const RopeStoreArgs& args, Stream stream, const FusedOptions& options = {});

/// rotary::qk_norm_rope on a CUDA device, as rope_store above (norm weights in device memory).
void qk_norm_rope(const Schedule& schedule, const QkNormRopeArgs& args, Stream stream,
                  const FusedOptions& options = {});

/// rotary::rerotate_cache on a CUDA device, as rope_store above (deltas in device memory; raw mode's
/// positions too). Delta mode: exact angles of the deltas. Raw mode: exact angles, args.numerics'
/// (hf_float32), or a DeviceTable's rows (FusedOptions::table; a host Table is refused); a raw
/// position the kernel cannot use (outside [0, 2^31), not a row of the table, fractional with
/// hf_float32) is flagged as apply's are and its keys left. Without host_slots, a slot beyond the
/// cache's (or out's) capacity is skipped and flagged.
void rerotate_cache(const Schedule& schedule, const RerotateCacheArgs& args, Stream stream,
                    const FusedOptions& options = {});

/// What this build of the CUDA backend holds and whether this machine can run it.
struct BuildInfo {
  /// Machine code ("sm_80", "sm_90") and PTX the driver compiles at load for newer GPUs
  /// ("compute_90 (PTX)").
  std::vector<std::string> architectures;
  int runtime_version = 0;  ///< the CUDA runtime linked in, e.g. 13000 for 13.0
  int driver_version = 0;   ///< the driver's CUDA version, 0 without a driver
  int devices = 0;          ///< CUDA devices visible
  std::string device;       ///< the current device, e.g. "NVIDIA H200 (sm_90, 132 SMs)"; empty without one
  bool usable = false;      ///< the kernels load and run on the current device
  std::string why_not;      ///< when not usable: why (no driver, no device, no code for its architecture)
};

/// This build and the current device. Makes no allocation on the device and never throws (a failing
/// CUDA call becomes why_not).
BuildInfo build_info();

/// The opt-in check of per-token positions: waits for `stream`, reads the flag at `error`
/// (Options::error, FusedOptions::error) and clears it; throws rotary::Error naming what the skipped
/// tokens' positions broke when it was set (one rule per position_* bit; slot_out_of_range: a slot
/// beyond its cache, whose writes were skipped; slot_duplicate: a slot listed twice; scale_invalid: a
/// scale not finite and > 0, nothing written), RuntimeError when a CUDA call fails (an
/// earlier asynchronous error on the stream shows here too). Synchronises, so not for a captured
/// graph.
void check_positions(uint32_t* error, Stream stream);

}  // namespace rotary::cuda
