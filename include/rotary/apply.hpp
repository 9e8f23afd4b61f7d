// rotary — rotate q and k.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "rotary/schedule.hpp"
#include "rotary/table.hpp"
#include "rotary/tensor.hpp"

namespace rotary {

/// forward rotates pair (a, b) by +angle; inverse by -angle. The inverse is the transpose, i.e. the
/// backward pass (gradients), with the same scale as forward: the attention factor g, and under
/// xPos the same σ. It undoes forward only when g = 1 and there is no xPos; otherwise a forward
/// then inverse round trip scales each pair by (g σ)^2. To take a rotation back (un-rotate stored
/// keys), set ApplyArgs::undo.
enum class Direction { forward, inverse };

/// Which implementation runs. `automatic` picks the fastest available (today: cpu); `cpu` is the
/// Highway SIMD kernels (best target chosen at run time) threaded with OpenMP; `reference` is the
/// scalar oracle written from the formulas (single-threaded, double arithmetic).
enum class Backend { automatic, reference, cpu };

/// The most threads an apply call takes (ApplyArgs::threads); the CLI's and Python's limit too.
inline constexpr int max_threads = 1024;

/// cos and sin the caller computed (already times the attention factor), used instead of a Table
/// or exact angles, so a model's own tables get the fused kernel. Read-only, any strides.
///   index per_token:    [batch or 1, seq, width] — transformers' `cos, sin = rotary_emb(x, ids)`
///                       (a batch of 1 broadcasts); row (b, s) serves token (b, s)
///   index per_position: [rows, width] — flash-attn's cos/sin [seqlen, rotary_dim/2], vLLM's
///                       cos_sin_cache halves; pair j of a token reads row p, p the token's
///                       position in the pair's stream (as vLLM's M-RoPE indexes its cache);
///                       positions must be whole numbers below rows
/// columns says where pair j's value sits in a row:
///   pairs:    width rotary_dim/2, column j
///   halves:   width rotary_dim, [c_0 .. c_{P-1} c_0 .. c_{P-1}] (rotate_half form): column j
///   repeated: width rotary_dim, [c_0 c_0 c_1 c_1 ..] (repeat_interleave form, GLM): column 2j
/// The duplicate columns are not read. Values are f32, f16, bf16 or f64 (widened to the compute
/// type: float32, or double for f64 data); the inverse negates sin. Pairs of a multi-stream
/// schedule take the caller's value as given (the caller merged the streams).
struct CallerAngles {
  enum class Index { per_token, per_position };
  enum class Columns { pairs, halves, repeated };
  Index index = Index::per_token;
  Columns columns = Columns::halves;
  const void* cos = nullptr;
  const void* sin = nullptr;
  DType dtype = DType::f32;
  std::array<int64_t, 3> shape{};        ///< per_token: [batch or 1, seq, width];
                                         ///< per_position: [1, rows, width]
  std::array<int64_t, 3> cos_strides{};  ///< elements, any sign
  std::array<int64_t, 3> sin_strides{};
};

/// One call rotates q and (optionally) k, sharing each token's angles between all heads.
///
/// For pair (a, b) of a head at position p, with φ = p * inv_freq[i] and g = attention_factor:
///   a' = g (a cos φ - b sin φ),   b' = g (a sin φ + b cos φ)       (inverse: sin φ -> -sin φ)
/// Channels outside the rotated slice [rotary_offset, rotary_offset + rotary_dim) pass through:
/// left alone in place, copied bit for bit out of place (unless copy_tail is false).
///
/// xPos (schedule.xpos()): q's pair j also scales by σ = e^t and k's by e^-t, t = ln ζ_j (p - c)/γ
/// (schedule.hpp), computed in double without libm (the same bits on every backend); each angle
/// value (cos or sin times g, as a Table holds it) times σ is rounded once more to float, so the
/// f32 bound below becomes about 2^-22 σ g (|a| + |b|). The inverse keeps σ (it is the transpose).
///
/// undo: the true inverse of `direction`: pair (a, b) turns by the opposite angle and is divided
/// by g and by its xPos σ (a query's σ^-1 is a key's scale, and the other way round), so that
/// apply(undo) after apply gives back the input to within a few roundings — what un-rotating
/// stored keys needs. The values are cos and sin times fl64(1/g) (times σ^-1 under xPos), rounded
/// once to float, then the rotation as below. With g = 1 and no xPos this is the inverse bit for
/// bit. A Table holds cos and sin times g, so undo with g != 1 takes exact angles (table null);
/// the caller's cos/sin hold an unknown factor, so undo refuses them.
/// σ reaches e^80 at the reach's ends: f16 data overflows to inf once σ |x| > 65504 (for |x| ~ 1,
/// from |p - c| ~ 8.85 γ), as flash-attn's f16 xPos does; keep xPos data in bf16, f32 or f64.
///
/// Arithmetic: float32 for f32, f16 and bf16. cos and sin times g are rounded once to float (the
/// values a Table holds), then each output is one fused multiply-add in which the larger of the
/// two products is fused and only the smaller is rounded first:
///   a' = fma(a, c, -fl(b s)) if |fl(a c)| >= |fl(b s)|, else fma(-b, s, fl(a c))   (b' likewise)
/// Accuracy (f32): |result - exact| <= 2^-23 * g * (|a| + |b|) per pair, exact meaning the real
/// rotation by the exact angle (a plain fma(a, c, -fl(b s)) reaches 1.24 times this bound).
/// f16/bf16: the f32 result of the widened input, rounded once (nearest-even) at the store.
/// f64: double arithmetic with double angles.
/// Reproducibility: with a Table, results are bit-identical on every SIMD target, for any thread
/// count, and to the scalar reference (Backend::reference); on the fly, the vectorised cos/sin
/// round to the Table's float in all but (rare) values within ~2 double ulps of a rounding boundary.
/// NaN (from NaN inputs or angles, or inf - inf): NaN on every path, its sign and payload not (the
/// processor keeps one operand's NaN, and which one depends on the instruction a path uses).
///
/// Views: "unset" is the absent view TensorView{} (data null, shape all 0); an empty view (some
/// extent 0, data possibly null, as torch passes an empty tensor) is set and rotates nothing, so a
/// call whose q and k are empty is a no-op. Every set view spans < max_view_bytes (tensor.hpp).
/// Threads: `threads` in [0, max_threads], 0 meaning omp_get_max_threads(); the team is then cut
/// to what helps: never more threads than omp_get_num_procs(), nor than (token, head) blocks, and
/// one thread below 256 KiB moved. The count never changes the results.
struct ApplyArgs {
  TensorView q{};      ///< input [batch, seq, heads_q, head_dim]; also the output when q_out unset
  TensorView k{};      ///< optional input [batch, seq, heads_k, head_dim]; unset = q only
  TensorView q_out{};  ///< optional output, same shape and dtype as q; unset = in place
  TensorView k_out{};  ///< optional output, same shape and dtype as k; unset = in place
  Positions positions{};
  Direction direction = Direction::forward;
  const Table* table = nullptr;  ///< angles from this table (built from the same schedule), or
                                 ///< null: computed exactly on the fly, once per token
  const CallerAngles* caller_angles = nullptr;  ///< or the caller's cos/sin (table must then be null)
  /// The old name of caller_angles, read for one release: set alone, it serves as caller_angles;
  /// set beside a different caller_angles, the call is refused. (`angles` also names the angle mode,
  /// numerics, and a table's values.)
  [[deprecated("ApplyArgs::angles is now caller_angles")]] const CallerAngles* angles = nullptr;
  /// Which angles: exact, or transformers' float32 pipeline (AngleMode::hf_float32: what a model
  /// computed in float32 was trained with; whole positions). Unset: the table's mode, else exact.
  /// A table given must have been built with this mode; without one, hf_float32 angles are
  /// computed on the fly, the values Table::at(..., hf_float32) holds. The caller's cos/sin are
  /// their own values: numerics may not be hf_float32 with them.
  std::optional<AngleMode> numerics{};
  bool copy_tail = true;         ///< out of place: copy the channels outside the rotated slice
  bool q_is_key = false;         ///< xPos: scale q as a key (a call on keys alone; k unset);
                                 ///< without xPos it changes nothing
  bool undo = false;             ///< take back a rotation made in `direction` (see above): turn
                                 ///< the other way and divide out g and xPos's σ
  int threads = 0;               ///< 0: all OpenMP threads, else at most max_threads; results
                                 ///< are bit-identical for any value
  Backend backend = Backend::automatic;
};

/// Checks everything apply checks, writes nothing. Throws rotary::Error naming the argument, e.g.
/// "q.head_dim=64 differs from the schedule's head_dim=128". Rules: schedule valid; q set; k, outputs
/// and dtypes consistent (all four share q's dtype); batch and seq agree; head_dim matches; no
/// negative extents; a non-empty view has non-null data and spans < max_view_bytes (checked
/// without overflow for any extents and strides); outputs do not overlap themselves, each other,
/// or an input they do not alias exactly (in place means the same data pointer and strides), nor
/// per-token positions (read token by token as the outputs are written);
/// positions: streams equal to the schedule's or 1 (one stream serving all), per-token count ==
/// batch*seq or seq (one row broadcast over the batch; an empty batch takes either), and with a
/// shape (Positions::with_shape) each stream [batch, seq] or [1, seq]; every position in [0, 2^31) (a whole number
/// in the table, or below the rows of per_position caller angles, when one is given); caller
/// angles: not together with a table, shape and width as CallerAngles says, not overlapping an
/// output, not with an xPos schedule; xPos: every position within xpos_reach(schedule) of
/// xpos_center (the message suggests a centre that serves the call); q_is_key only without k;
/// undo: no caller angles, and no table unless attention_factor is 1; numerics (when set) a named
/// AngleMode, the table's mode, not hf_float32 with caller angles; whole positions for hf_float32
/// angles (and the schedule's inv_freq_hf32 usable: table.hpp);
/// the table was built from an equal schedule; threads in [0, max_threads];
/// direction and backend named enumerators.
void validate(const Schedule& schedule, const ApplyArgs& args);

/// validate's checks that read no per-token position entry (shapes, strides, dtypes, aliasing,
/// enumerators, the positions' kind, streams, count and pointer, sequential offsets and their
/// range, table and xPos reach included): the host's part of a call whose positions live in device
/// memory (rotary::cuda::apply checks the entries on the device). validate = validate_shapes plus
/// every per-token entry's rules.
void validate_shapes(const Schedule& schedule, const ApplyArgs& args);

/// Rotates. Validates first (see validate); on error nothing was written. Does not allocate: each
/// thread keeps its token's angles on the stack (heap only when rotary_dim > 1024). Thread-safe for
/// calls on disjoint outputs; uses up to `threads` OpenMP threads (0: all; see ApplyArgs) and gives
/// the same bits for any.
void apply(const Schedule& schedule, const ApplyArgs& args);

/// The angles a call uses: args.numerics, else its table's mode, else exact.
inline AngleMode numerics_of(const ApplyArgs& args) {
  if (args.numerics) return *args.numerics;
  return args.table != nullptr ? args.table->mode() : AngleMode::exact;
}

}  // namespace rotary
