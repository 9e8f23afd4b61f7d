/* rotary — the CUDA backend's C ABI: rotary_apply on device memory, queued on a CUDA stream.
 *
 * C11, and valid C++; needs no CUDA header (a cudaStream_t is a struct CUstream_st*). A thin shell
 * over rotary::cuda (cuda.hpp), itself built when rotary finds nvcc: link rotary_cuda (CMake:
 * rotary::cuda) besides rotary. The conventions are rotary.h's: every function that can fail
 * returns a rotary_status, rotary_last_error() gives the failure's one line (per thread), an object
 * pointer passed as `out` is NULL on failure, and every check runs before anything is queued. One
 * status more:
 *   ROTARY_ERROR_CUDA: the CUDA runtime failed (no device, device memory exhausted, a copy or a
 *   launch failed, or an earlier asynchronous error surfaced); the message names the CUDA call and
 *   the runtime's error, e.g. "CUDA cudaMalloc (table cos) failed: cudaErrorNoDevice: ...".
 *
 * Use:
 *   rotary_cuda_table* table = NULL;   (optional: exact angles without one)
 *   rotary_cuda_table_create(host_table, &table);
 *   rotary_apply_args args = {0};      (q, k, q_out, k_out: device pointers)
 *   rotary_tensor_bshd(q_device, ROTARY_BF16, batch, seq, 32, 128, &args.q);
 *   rotary_positions positions = {ROTARY_POSITIONS_I64, positions_device, batch * seq, 1};
 *   rotary_cuda_options options = {0};
 *   options.table = table;
 *   options.error = error_word_device;  (a zeroed uint32_t in device memory, or NULL)
 *   if (rotary_cuda_apply(schedule, &args, &positions, stream, &options) != ROTARY_OK) ...
 *   ...
 *   if (rotary_cuda_check_positions(error_word_device, stream) != ROTARY_OK) ...  (synchronises)
 *
 * Thread safety: as rotary.h; a rotary_cuda_table may be shared by calls on any stream of its
 * device.
 */
#ifndef ROTARY_ROTARY_CUDA_H
#define ROTARY_ROTARY_CUDA_H

#include <stdint.h>

#include "rotary/rotary.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The status of a failure of the CUDA runtime (see above); the other statuses are rotary.h's. */
#define ROTARY_ERROR_CUDA 4

/** A cudaStream_t. NULL is the legacy default stream. */
struct CUstream_st;

/** A rotary_table copied to device memory: the rows of one contiguous range of positions
 *  (rotary_table_range), read by position - first without any search. Opaque; owns its memory. */
typedef struct rotary_cuda_table rotary_cuda_table;

/** Copies `table` to the current device and waits for the copy. Fails when its positions are not
 *  one contiguous range (a rotary_table_at with gaps, repeats or another order), or with
 *  ROTARY_ERROR_CUDA. On failure *out is NULL. */
int rotary_cuda_table_create(const rotary_table* table, rotary_cuda_table** out);
/** Frees a device table (on the device that was current at its creation); NULL is a no-op. */
void rotary_cuda_table_free(rotary_cuda_table* table);

/** Bits the kernels or into rotary_cuda_options.error for a token they skipped (nothing of it read
 *  or written) because they could not use its position (rotary::cuda::position_*). */
#define ROTARY_CUDA_POSITION_OUT_OF_RANGE 1u  /**< not in [0, 2^31), NaN included */
#define ROTARY_CUDA_POSITION_NOT_IN_TABLE 2u  /**< fractional, or no row of options.table */
#define ROTARY_CUDA_POSITION_BEYOND_XPOS_REACH 8u  /**< xPos (rotary_schedule_with_xpos): further from
                                                        the centre than the scale's float range allows */

/** What rotary_cuda_apply takes besides the call. Zero-initialised: exact angles, no error word. */
typedef struct rotary_cuda_options {
  /** Angles from this table (made from a table of an equal schedule), or NULL: exact angles
   *  computed on the fly. args.table (a host table) must be NULL. */
  const rotary_cuda_table* table;
  /** A uint32_t in device memory, or NULL. Per-token positions live in device memory, where only
   *  the kernels read them: a token whose position they cannot use is skipped and its
   *  ROTARY_CUDA_POSITION_* bit or'ed in here (see rotary_cuda_check_positions). */
  uint32_t* error;
} rotary_cuda_options;

/** rotary_apply_positions on a CUDA device: args' q, k, q_out and k_out and the per-token positions
 *  (`positions`, or args.positions / positions_i32 when it is NULL) in device memory, the kernels
 *  queued on `stream` (asynchronous: no synchronisation, no allocation, so a call can be captured
 *  in a CUDA graph). options NULL: the defaults. Results are rotary_apply's bit for bit (NaNs as
 *  NaN). Everything but the per-token position values is checked first, on the host, by
 *  rotary_apply's rules (rotary::cuda::apply, cuda.hpp); args.threads and backend are not used. */
int rotary_cuda_apply(const rotary_schedule* schedule, const rotary_apply_args* args,
                      const rotary_positions* positions, struct CUstream_st* stream,
                      const rotary_cuda_options* options);

/** The bit the fused kernels or into rotary_cuda_fused_options.error for a token whose slot is beyond a
 *  cache's capacity (its cache writes skipped; q and k_out still written), when the slots were not
 *  checked on the host (rotary::cuda::slot_out_of_range). */
#define ROTARY_CUDA_SLOT_OUT_OF_RANGE 16u
/** The bit the fused kernels or into rotary_cuda_fused_options.error, with check_duplicate_slots, for
 *  a slot two tokens share (neither token's cache writes made; rotary::cuda::slot_duplicate). */
#define ROTARY_CUDA_SLOT_DUPLICATE 32u
/** The bit the fused kernels or into rotary_cuda_fused_options.error when a scale in device memory
 *  is not finite and > 0; nothing is then written (rotary::cuda::scale_invalid). */
#define ROTARY_CUDA_SCALE_INVALID 64u

/** What the fused calls on a device take besides their arguments. Zero-initialised: exact angles, no
 *  error word, slots in device memory only. */
typedef struct rotary_cuda_fused_options {
  /** As rotary_cuda_options.table (rotary_cuda_rope_store, rotary_cuda_qk_norm_rope, and
   *  rotary_cuda_rerotate_cache's raw mode). The args' host table must be NULL. */
  const rotary_cuda_table* table;
  /** As rotary_cuda_options.error, plus ROTARY_CUDA_SLOT_OUT_OF_RANGE, ROTARY_CUDA_SLOT_DUPLICATE and
   *  ROTARY_CUDA_SCALE_INVALID. */
  uint32_t* error;
  /** A host copy of the call's slots (same kind and count): checked on the host (range, duplicates)
   *  before anything is queued, as rotary_rope_store checks them. NULL: the kernels skip and flag an
   *  out-of-range slot, and duplicates are detected only with check_duplicate_slots (the form a CUDA
   *  graph captures). */
  const rotary_slots* host_slots;
  /** 1 (0 or 1), without host_slots: the kernels also look for a slot two tokens share (tokens²
   *  compares per call: a debugging aid for prefill sizes) and flag ROTARY_CUDA_SLOT_DUPLICATE;
   *  needs error (rotary::cuda::FusedOptions::check_duplicate_slots). */
  int check_duplicate_slots;
} rotary_cuda_fused_options;

/** rotary_rope_store, rotary_qk_norm_rope and rotary_rerotate_cache on a CUDA device: every pointer
 *  of args (tensors, caches, slots, scales, weights, deltas, per-token positions) in device memory,
 *  the kernels queued on `stream` (no synchronisation, no allocation). Bit-identical to the CPU calls
 *  (the same per-token body). Checked first, on the host, by their rules but for values in device
 *  memory (positions, scales, and slots without options.host_slots, are checked by the kernels).
 *  options NULL: the defaults. threads and backend are not used. */
int rotary_cuda_rope_store(const rotary_schedule* schedule, const rotary_rope_store_args* args,
                           struct CUstream_st* stream, const rotary_cuda_fused_options* options);
int rotary_cuda_qk_norm_rope(const rotary_schedule* schedule, const rotary_qk_norm_rope_args* args,
                             struct CUstream_st* stream, const rotary_cuda_fused_options* options);
int rotary_cuda_rerotate_cache(const rotary_schedule* schedule, const rotary_rerotate_cache_args* args,
                               struct CUstream_st* stream, const rotary_cuda_fused_options* options);

/** The opt-in check of per-token positions: waits for `stream`, reads the error word (device
 *  memory, rotary_cuda_options.error or rotary_cuda_fused_options.error) and clears it. Fails
 *  (ROTARY_ERROR_INVALID_ARGUMENT) naming what the skipped tokens' positions broke (and
 *  ROTARY_CUDA_SLOT_OUT_OF_RANGE: a slot beyond its cache; ROTARY_CUDA_SLOT_DUPLICATE: a slot
 *  listed twice; ROTARY_CUDA_SCALE_INVALID: a scale not finite and > 0) when it was set, or with ROTARY_ERROR_CUDA.
 *  Synchronises: not for a captured graph. */
int rotary_cuda_check_positions(uint32_t* error, struct CUstream_st* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ROTARY_ROTARY_CUDA_H */
