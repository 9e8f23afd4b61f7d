// Internal: the Highway CPU kernels (src/cpu/*.cc) and their dispatcher.
#pragma once

#include <cstdint>

#include "../kernel/args.hpp"

namespace rotary::detail {

/// The team for one OpenMP loop over `blocks` independent blocks: `requested` threads (0:
/// omp_get_max_threads()), cut to at most omp_get_num_procs() (counted at the first call),
/// max_threads and `blocks`, and at least 1. Every OpenMP team the library starts is sized by
/// this, so no count a caller passes (or OMP_NUM_THREADS sets) asks for more threads than can run.
int useful_threads(int requested, int64_t blocks);

/// cpu_apply calls moving at least prefetch_min_bytes() (read + written; kPrefetchMinBytes, more
/// than a core's L2 holds, so the rows come from the last-level cache or memory) prefetch the rows
/// of the token about kPrefetchDistance bytes of the operand's rows ahead (the rotated slice, or the
/// whole head with copy_tail) as they go (RowArgs::prefetch_in): the hardware
/// prefetchers alone left the loads waiting (`rotary-dev bench` prefill_q, bf16 in place, one core
/// of a Xeon VM: 1.5x a memcpy of its bytes before, 0.9x after). Decode-sized calls, in cache, do not.
constexpr int64_t kPrefetchMinBytes = int64_t{1} << 21;
constexpr int64_t kPrefetchDistance = 4096;
int64_t prefetch_min_bytes();
/// Tests: how many calls so far prefetched (cpu_apply's, and the fused rows' through
/// count_prefetched_call), and, while a ScopedMinBytes of Threshold::prefetch is alive, how many non-zero
/// prefetch distances the rows were given (count_prefetch_distance: a call's rows prefetched).
int64_t prefetched_call_count();
void count_prefetched_call();
int64_t prefetch_distance_count();
void count_prefetch_distance();

/// Per-thread room for one token's angles: `pairs` values in each array.
struct AngleScratch {
  float* c = nullptr;
  float* s = nullptr;
  double* dc = nullptr;
  double* ds = nullptr;
  double* pair_position = nullptr;  ///< per pair: the position of its stream (multi-stream only)
};

/// One token's angles in pair order: cos and sin times the attention factor, sin negated for the
/// inverse. Float rows are what f32/f16/bf16 rotate with (the values a Table holds: one rounding
/// to float of the exact value); double rows serve f64 storage (exact values times the factor in
/// double; Table or caller floats widened).
struct FloatRow {
  const float* c = nullptr;
  const float* s = nullptr;
};
struct DoubleRow {
  const double* c = nullptr;
  const double* s = nullptr;
};

/// The CPU's row of token (b, s) = token: the kernel layer's pair_angle (src/kernel/angles.hpp)
/// for every pair, bit for bit, built as fast as the source allows: a pointer into the Table's
/// row (one stream, forward), the vectorised exact row (cos_sin_row_f32 / cos_sin_row: the same
/// exact values), else pair by pair. Rows may point into the Table or into scratch.
FloatRow float_angle_row(const KernelArgs& args, int64_t token, int64_t s, const AngleScratch& scratch);
DoubleRow double_angle_row(const KernelArgs& args, int64_t token, int64_t s, const AngleScratch& scratch);

/// xPos: `row` scaled for operand `op` (a query's or a key's σ per pair: the kernel layer's
/// xpos_angle), into scratch.c/s (row may point there: each value is read before it is written).
FloatRow xpos_float_row(const KernelArgs& args, int64_t token, int64_t s, FloatRow row, const KernelOperand& op,
                        const AngleScratch& scratch);
DoubleRow xpos_double_row(const KernelArgs& args, int64_t token, int64_t s, DoubleRow row, const KernelOperand& op,
                          const AngleScratch& scratch);

/// The fused operations' norm inside the rows (norm_then_rope, src/fused/cpu_rows.cpp): each head's
/// channels normalised as they are loaded, body.hpp's normalise lane by lane (y = fl32(x r); no
/// weight: fl_T(y); gemma: fl_T(fl32(y w)); else fl_T(fl32(fl_T(y) w))), then rotated as apply
/// rotates them, and the channels outside the rotated slice normalised alone: one pass over the
/// head instead of a normalise pass into scratch and apply's pass over it, with the same bits.
struct RowNorm {
  const float* r = nullptr;  ///< head h's factor at r[h * r_stride] (all_heads: stride 0); null: no norm
  int64_t r_stride = 1;
  /// Head h's weights at w + h * w_head_stride, head_dim values (the effective weights; bf16: as
  /// prepare_norm_weights_bf16 lays them out); null: none.
  const float* w = nullptr;
  int64_t w_head_stride = 0;
  bool gemma = false;
};

/// One token's heads of one operand, head_dim contiguous (stride 1) in and out.
/// Angles are float32, sin already negated for the inverse, natural pair order:
///   c = [c_0 c_1 .. c_{h-1}],  s = [s_0 s_1 .. s_{h-1}]          (h = rotary_dim / 2)
/// plus `lanes`, the per-target rearrangement PrepareLanes built from them for this token (for
/// block_half: built per block, block k's at lanes + 2 * k * (rotary_dim / blocks)).
/// Every pair is rotated with detail::rotate_minus (src/rotate.hpp), in vectors or in the scalar
/// tail, so the result is bit-identical to the reference on every target.
struct RowArgs {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t heads = 0;
  int64_t in_head_stride = 0;   ///< elements between heads
  int64_t out_head_stride = 0;
  int64_t rotary_dim = 0;
  int64_t head_dim = 0;
  int64_t rotary_offset = 0;  ///< first rotated channel
  int64_t blocks = 1;         ///< block_half: the slice in `blocks` half-paired blocks
  bool interleaved = false;
  bool copy_tail = false;  ///< copy the channels outside the rotated slice (out of place only)
  /// Out of place into a destination larger than the cache: the vector bodies store aligned
  /// vectors non-temporally (no read of the destination line first, as memcpy does at that size).
  /// The caller fences (stream_fence) before the results are handed over.
  bool stream = false;
  /// The angles are the caller's (CallerAngles): a NaN among them may carry payload bits, which the
  /// bf16 bodies then round NaN-safely (bf16_lanes-inl.h).
  bool caller_angles = false;
  /// Bytes from each head's input (output) to the same head of a later token, whose rotated slice
  /// (or whole head, with copy_tail) the kernel prefetches as it goes; 0: none (kPrefetchMinBytes).
  int64_t prefetch_in = 0;
  int64_t prefetch_out = 0;
  const float* c = nullptr;
  const float* s = nullptr;
  const float* lanes = nullptr;
  /// norm.r set: every channel of each head normalised (the rotated slice, then the channels beside
  /// it), one slice (blocks == 1), plain stores; prefetch spans then cover the whole head.
  RowNorm norm{};
};

/// Per dtype, dynamic dispatch to the best Highway target. Single-threaded, no allocation.
/// prepare_lanes_*: builds RowArgs::lanes (2 * rotary_dim floats) from the natural rows, once per
/// token; rotate_heads_*: rotates args.heads heads.
void prepare_lanes_f32(const float* c, const float* s, int64_t pairs, bool interleaved, float* lanes);
void prepare_lanes_f16(const float* c, const float* s, int64_t pairs, bool interleaved, float* lanes);
void prepare_lanes_bf16(const float* c, const float* s, int64_t pairs, bool interleaved, float* lanes);
/// prepare_norm_weights_bf16: head_dim effective weights laid out as the bf16 rows read them
/// (RowNorm::w): per vector block of the rotated slice [channels at even lanes | at odd lanes], the
/// other channels as they are.
void prepare_norm_weights_bf16(const float* w, int64_t head_dim, int64_t rotary_offset, int64_t rotary_dim,
                               bool interleaved, float* out);
void rotate_heads_f32(const RowArgs& args);
void rotate_heads_f16(const RowArgs& args);
void rotate_heads_bf16(const RowArgs& args);

/// Orders the non-temporal stores of RowArgs::stream before any later store (sfence on x86).
void stream_fence();

/// Out-of-place calls moving at least this many bytes (read + written) store non-temporally: the
/// last-level cache's size, unless a ScopedMinBytes of Threshold::stream is alive.
int64_t stream_min_bytes();
/// Tests: overrides stream_min_bytes (Threshold::stream; 0: every out-of-place call streams) or
/// prefetch_min_bytes (Threshold::prefetch; 0: every call prefetches) while alive.
enum class Threshold { stream, prefetch };
class ScopedMinBytes {
 public:
  ScopedMinBytes(Threshold which, int64_t bytes);
  ~ScopedMinBytes();
  ScopedMinBytes(const ScopedMinBytes&) = delete;
  ScopedMinBytes& operator=(const ScopedMinBytes&) = delete;

 private:
  Threshold which_;
  int64_t previous_;
};
/// Tests: how many cpu_apply calls so far chose non-temporal stores.
int64_t streamed_call_count();

/// cos and sin of p_i * inv_freq[i] times factor, i < pairs, in double, vectorised, where p_i is
/// pair_position[i] when pair_position is not null (multi-stream), else `position` (a whole or
/// fractional position in [0, 2^31)): exact double-double product and reduction (FMA targets;
/// others use rotary::exact_cos_sin_real), Taylor polynomials on [-π/4, π/4]. Within about 2
/// double ulps of the exact value. Single-threaded.
void cos_sin_row(double position, const double* pair_position, const double* inv_freq,
                 int64_t pairs, double factor, double* cos_out, double* sin_out);

/// The same angles rounded once to float as a Table stores them, c = fl(cos * factor) and
/// s = sign * fl(sin * factor) with sign +1 (forward) or -1 (inverse). Single-threaded.
void cos_sin_row_f32(double position, const double* pair_position, const double* inv_freq,
                     int64_t pairs, double factor, float sign, float* cos_out, float* sin_out);

/// The threaded CPU path: one OpenMP loop over (token, head-range) blocks, its team sized by
/// useful_threads (args.threads requested). Results do not depend on the thread count. Requires a
/// validated call with at least one non-empty operand (so batch * seq * heads fits in int64).
void cpu_apply(const KernelArgs& args);

/// Tokens [first, last) of a validated call (its positions usable), on the calling thread, one block
/// per token, no non-temporal stores: the rows cpu_apply runs, for the fused operations' CPU path
/// (src/fused/cpu_rows.cpp), which calls it token by token between its own loads and stores.
/// prefetch_limit > 0: as they go, the rows prefetch a later token's rows below prefetch_limit
/// (RowArgs::prefetch_in; operands whose rows do not move from token to token, such as scratch
/// with zero token strides, prefetch nothing).
/// norms (one per operand; null, or an entry whose r is null: no norm) normalise the operands'
/// heads inside the rows (RowNorm); the caller sets r and w per token and makes sure every operand
/// with a norm is contiguous (stride 1 in and out), one slice (slice_blocks 1) and not f64.
void cpu_apply_tokens(const KernelArgs& args, int64_t first, int64_t last, int64_t prefetch_limit = 0,
                      const RowNorm* norms = nullptr);

/// The fused operations' norms (src/cpu/norm_rows.cc, per Highway target), the body's steps
/// (src/fused/body.hpp) bit for bit. norm_factors: the factor of each of `heads` rows of n values
/// of `dtype` (row h at base + h * head_stride, element stride `stride`), r[h], or one over all of
/// them in order (all_heads: r[0]). normalise_row: n values from src to dst (either may be the
/// other), fl_T(x r), or with weights w (the effective weight per channel) fl_T(x r w) (gemma) or
/// fl_T(fl_T(x r) w).
struct NormRow {
  const void* src = nullptr;
  int64_t src_stride = 1;
  void* dst = nullptr;
  int64_t dst_stride = 1;
  float r = 1.0f;
  const float* w = nullptr;
  bool gemma = false;
  int64_t n = 0;
};
void norm_factors(DType dtype, const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n,
                  bool all_heads, float eps, float* r);
void normalise_row(DType dtype, const NormRow& row);
/// The sums of squares norm_factors takes (double, each the body's square_add in channel order, or
/// the same double in another order where that sum is exact): sums[h], or sums[0] (all_heads).
void square_sums(DType dtype, const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n,
                 bool all_heads, double* sums);

enum class ScaleOp : int32_t;  // math/quant.hpp

/// The fused operations' quantised cache rows (src/cpu/quant_rows.cc, per Highway target): n
/// contiguous values of `data` (f32, f16, bf16) scaled (divide or multiply by `scale`) and encoded
/// as `code` (fp8_e4m3, fp8_e5m2, i8) into dst, n contiguous bytes: math/quant.hpp's codes.
void quantise_row(DType data, const void* src, DType code, void* dst, int64_t n, float scale, ScaleOp op);

/// The name of the Highway target HWY_DYNAMIC_DISPATCH runs on this machine ("AVX2", "AVX3", ...).
const char* dispatched_target();

}  // namespace rotary::detail
