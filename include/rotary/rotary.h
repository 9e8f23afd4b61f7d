/* rotary — the C ABI: schedules, tables and apply for C, Rust, Go, Zig and any other C FFI.
 *
 * C11, and valid C++ (declarations in extern "C"). A thin shell over the C++ API (the .hpp headers
 * beside this one): the same rules, the same checks, the same kernels, the same error texts.
 *
 * Errors: every function that can fail returns an int holding a rotary_status, 0 (ROTARY_OK) on
 * success. No C++ exception ever crosses this boundary. On failure, rotary_last_error() gives one
 * line naming the offending argument, its value and the rule, e.g. "q.head_dim=64 differs from the
 * schedule's head_dim=128"; every check runs before the first write, so the caller's memory is
 * untouched, and an object pointer passed as `out` is set to NULL.
 *
 * Zero-initialised structs mean the defaults: `rotary_spec spec = {0}; spec.head_dim = 128;` is
 * Llama-style RoPE (base 10000, half pairing), and a zeroed rotary_apply_args rotates in place,
 * forward, at positions 0..seq-1, on every thread.
 *
 * Minimal use:
 *   rotary_schedule* schedule = NULL;
 *   if (rotary_schedule_from_preset("llama-3.1-8b", -1, &schedule) != ROTARY_OK) {
 *     fprintf(stderr, "%s\n", rotary_last_error());
 *   }
 *   rotary_apply_args args = {0};
 *   rotary_tensor_bshd(q, ROTARY_BF16, batch, seq, 32, 128, &args.q);
 *   rotary_tensor_bshd(k, ROTARY_BF16, batch, seq, 8, 128, &args.k);
 *   args.offset = past_tokens;
 *   if (rotary_apply(schedule, &args) != ROTARY_OK) fprintf(stderr, "%s\n", rotary_last_error());
 *   rotary_schedule_free(schedule);
 *
 * Thread safety: schedules and tables are immutable once built and may be shared between threads;
 * rotary_apply calls may run concurrently on disjoint outputs; rotary_last_error is per thread.
 */
#ifndef ROTARY_ROTARY_H
#define ROTARY_ROTARY_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Status ---------------------------------------------------------------------------------- */

/** What a function returns (as int). */
typedef enum rotary_status {
  ROTARY_OK = 0,
  ROTARY_ERROR_INVALID_ARGUMENT = 1, /**< an argument breaks a rule (NULL too); nothing written */
  ROTARY_ERROR_OUT_OF_MEMORY = 2,    /**< an allocation failed; nothing written */
  ROTARY_ERROR_INTERNAL = 3          /**< any other failure: a bug in rotary (please report it) */
} rotary_status;

/** The message of the last failure on the calling thread ("" if none yet). Failures on other
 *  threads never change it; a successful call leaves it as it was (like errno). The pointer stays
 *  valid until the next failing call on this thread. Never NULL. */
const char* rotary_last_error(void);

/** The library version, "MAJOR.MINOR.PATCH". */
const char* rotary_version(void);

/* ---- Schedules ------------------------------------------------------------------------------- */

/** How the rotary_dim leading channels of a head form pairs (zero: half, as in the C++ API).
 *    half:        pair i is (x[i], x[i + r/2])  lanes [a0 a1 ... b0 b1 ...]  HF rotate_half, NeoX
 *    interleaved: pair i is (x[2i], x[2i+1])    lanes [a0 b0 a1 b1 ...]      Meta LLaMA, GPT-J */
typedef enum rotary_pairing {
  ROTARY_PAIRING_HALF = 0,
  ROTARY_PAIRING_INTERLEAVED = 1
} rotary_pairing;

/** How inv_freq and attention_factor are derived (Hugging Face definitions; see schedule.hpp). The
 *  values are rotary::ScheduleType's, one per schedule of the library. */
typedef enum rotary_schedule_type {
  ROTARY_SCHEDULE_DEFAULT = 0,
  ROTARY_SCHEDULE_LINEAR = 1,
  ROTARY_SCHEDULE_NTK = 2,
  ROTARY_SCHEDULE_DYNAMIC = 3,
  ROTARY_SCHEDULE_YARN = 4,
  ROTARY_SCHEDULE_LLAMA3 = 5,
  ROTARY_SCHEDULE_LONGROPE = 6,
  ROTARY_SCHEDULE_MONOTONE = 7,
  ROTARY_SCHEDULE_PROPORTIONAL = 8, /**< Gemma 4: set rotary_spec_ext.partial_rotary_factor */
  ROTARY_SCHEDULE_LAST = ROTARY_SCHEDULE_PROPORTIONAL /**< the largest value */
} rotary_schedule_type;

/** A yes/no setting that may be left unset (then the schedule's default applies). */
typedef enum rotary_toggle {
  ROTARY_TOGGLE_UNSET = 0,
  ROTARY_TOGGLE_ON = 1,
  ROTARY_TOGGLE_OFF = 2
} rotary_toggle;

/** RoPE settings, the C image of rotary::Spec (spec.hpp has the table of which schedule uses which
 *  field). A field left 0 (or NULL) is unset, like an empty std::optional: no optional field has a
 *  meaningful 0 (transformers, too, reads a YaRN mscale of 0 as not given). Any other value is
 *  passed on and checked, e.g. factor=-1 fails with "factor=-1 must be > 0". */
typedef struct rotary_spec {
  int64_t head_dim;               /**< width of one head, > 0 */
  int64_t rotary_dim;             /**< rotated leading channels, even, <= head_dim; 0: head_dim */
  double base;                    /**< rope_theta, > 1; 0: 10000 */
  rotary_pairing pairing;
  rotary_schedule_type schedule;
  double factor;                  /**< scaling factor s > 0 (linear, ntk, dynamic, yarn, llama3) */
  int64_t original_max_position;  /**< L, original_max_position_embeddings */
  int64_t max_position;           /**< M, max_position_embeddings */
  double beta_fast;               /**< yarn, default 32 */
  double beta_slow;               /**< yarn, default 1 */
  double mscale;                  /**< yarn */
  double mscale_all_dim;          /**< yarn */
  rotary_toggle truncate;         /**< yarn, default on */
  double attention_factor;        /**< explicit factor multiplied into cos and sin */
  double low_freq_factor;         /**< llama3 */
  double high_freq_factor;        /**< llama3 */
  const double* short_factor;     /**< longrope: rotary_dim/2 values (copied) */
  int64_t short_factor_count;
  const double* long_factor;      /**< longrope: rotary_dim/2 values (copied) */
  int64_t long_factor_count;
  int64_t max_length;             /**< monotone: N, the longest window the model sees */
  double monotone_scale;          /**< monotone: c; default the largest c with a 2^-10 margin */
} rotary_spec;

/** Which position stream drives each pair (rotary::StreamLayout, spec.hpp; zero: single). */
typedef enum rotary_stream_layout {
  ROTARY_STREAMS_SINGLE = 0,               /**< one stream (text models) */
  ROTARY_STREAMS_SECTIONS = 1,             /**< contiguous runs (Qwen2-VL, Qwen2.5-VL mrope_section) */
  ROTARY_STREAMS_INTERLEAVED_SECTIONS = 2, /**< Qwen3-VL mrope_interleaved */
  ROTARY_STREAMS_ALTERNATING_SECTIONS = 3, /**< ERNIE-4.5-VL */
  ROTARY_STREAMS_AXIAL = 4,                /**< vision towers: frequencies restart per axis */
  ROTARY_STREAMS_AXIAL_EVEN_ODD = 5        /**< Pixtral */
} rotary_stream_layout;

/** The settings rotary_spec predates (appended here so that rotary_spec keeps its size): the
 *  rotated slice's place, its blocks and the position streams. Zeroed means rotary_spec alone. */
typedef struct rotary_spec_ext {
  int64_t rotary_offset;              /**< first rotated channel, in [0, head_dim - rotary_dim] */
  int64_t blocks;                     /**< blocks of half pairs (block_half layout); 0: 1 */
  rotary_stream_layout stream_layout;
  const int64_t* sections;            /**< pairs per stream (copied), e.g. {16, 24, 24} */
  int64_t sections_count;
  double partial_rotary_factor;       /**< proportional: p in (0, 1]; 0: unset */
} rotary_spec_ext;

/** Immutable: per-pair inv_freq and the attention factor, all a kernel needs. Opaque. */
typedef struct rotary_schedule rotary_schedule;

/** For the constructors below, seq_len is the current sequence length n for the schedules that
 *  depend on it (dynamic, longrope); < 0 means unset (n <= the original context). On success *out
 *  owns a new schedule (free it with rotary_schedule_free); on failure *out is NULL. */

/** From settings (rotary::make_schedule). */
int rotary_schedule_from_spec(const rotary_spec* spec, int64_t seq_len, rotary_schedule** out);
/** From the text of a Hugging Face config.json (NUL-terminated), resolved as transformers does
 *  (rotary::read_hf_config). Its non-fatal notes are dropped. A model whose code turns pairs by
 *  -angle (NanoChat) keeps that: rotary_apply's ROTARY_FORWARD then rotates as the model does. */
int rotary_schedule_from_hf_config(const char* config_json, int64_t seq_len, rotary_schedule** out);
/** From a built-in preset, e.g. "llama-3.1-8b" (see rotary_preset_name). */
int rotary_schedule_from_preset(const char* name, int64_t seq_len, rotary_schedule** out);
/** A copy of `schedule` with xPos (Sun et al. 2022; rotary::with_xpos, schedule.hpp): pair j of a
 *  query at position p scales by zeta_j^((p - center)/scale_base), of a key by its inverse,
 *  zeta_j = (2j + 0.4 r)/(1.4 r). scale_base finite and > 0 (torchscale: 512; 0 turns xPos off,
 *  and then center must be 0), center finite. rotary_apply then scales q as queries and k as keys (to rotate keys alone, pass
 *  them as k beside a q with 0 heads) and refuses positions further from the centre than the
 *  scale's float range allows. On failure *out is NULL. */
int rotary_schedule_with_xpos(const rotary_schedule* schedule, double scale_base, double center,
                              rotary_schedule** out);
/** From settings with the extension (NULL ext: as rotary_schedule_from_spec). */
int rotary_schedule_from_spec_ext(const rotary_spec* spec, const rotary_spec_ext* ext, int64_t seq_len,
                                  rotary_schedule** out);
/** From a config or preset, choosing which of its RoPEs (rotary::ReadOptions): layer_type one of
 *  the model's layer types (e.g. "sliding_attention"; NULL or "": full_attention when it has it,
 *  else its first; an unknown name fails listing the known ones), vision 1 for the vision tower
 *  (vision_config), 0 for the text decoder. */
int rotary_schedule_from_hf_config_ex(const char* config_json, const char* layer_type, int vision,
                                      int64_t seq_len, rotary_schedule** out);
int rotary_schedule_from_preset_ex(const char* name, const char* layer_type, int vision, int64_t seq_len,
                                   rotary_schedule** out);
/** Frees a schedule; NULL is a no-op. */
void rotary_schedule_free(rotary_schedule* schedule);

/* Accessors: a NULL schedule gives 0 (NULL for inv_freq, -1 for the enums) and sets the last
 * error. */
int64_t rotary_schedule_head_dim(const rotary_schedule* schedule);
int64_t rotary_schedule_rotary_dim(const rotary_schedule* schedule);
/** rotary_dim/2 angular frequencies in radians per position, owned by the schedule. */
const double* rotary_schedule_inv_freq(const rotary_schedule* schedule);
double rotary_schedule_attention_factor(const rotary_schedule* schedule);
/** A rotary_pairing value, or -1. */
int rotary_schedule_pairing(const rotary_schedule* schedule);
/** A rotary_schedule_type value, or -1. */
int rotary_schedule_type_of(const rotary_schedule* schedule);

/** How channels form pairs (rotary::ChannelLayout, schedule.hpp). */
typedef enum rotary_layout {
  ROTARY_LAYOUT_HALF = 0,        /**< pair j is (off + j, off + j + r/2) */
  ROTARY_LAYOUT_INTERLEAVED = 1, /**< pair j is (off + 2j, off + 2j + 1) */
  ROTARY_LAYOUT_BLOCK_HALF = 2   /**< `blocks` blocks of width w = r/blocks, half pairs in each */
} rotary_layout;
/** A rotary_layout value, or -1. */
int rotary_schedule_layout(const rotary_schedule* schedule);
/** First rotated channel (off above). */
int64_t rotary_schedule_rotary_offset(const rotary_schedule* schedule);
/** Blocks of the block_half layout, else 1. */
int64_t rotary_schedule_blocks(const rotary_schedule* schedule);
/** Position streams the pairs read (1 for text models, 3 for M-RoPE). */
int rotary_schedule_streams(const rotary_schedule* schedule);
/** The stream pair `pair` (in [0, rotary_dim/2)) reads, or -1 (NULL schedule, pair out of range;
 *  the last error says which). */
int rotary_schedule_pair_stream(const rotary_schedule* schedule, int64_t pair);

/** Built-in presets: the name at `index` (0, 1, ...), or NULL past the last one. Static storage. */
const char* rotary_preset_name(int64_t index);

/* ---- Tables ---------------------------------------------------------------------------------- */

/** How a table forms its angles (rotary::AngleMode). */
typedef enum rotary_angle_mode {
  ROTARY_ANGLES_EXACT = 0,     /**< the real p * inv_freq: within 1 float ulp for any p < 2^31 */
  ROTARY_ANGLES_HF_FLOAT32 = 1 /**< transformers' float32 pipeline, to match training numerics, but for
                                    base^(2j/d) correctly rounded where torch's float32 pow is not (a few
                                    pairs: rotary::AngleMode says which and how far apart) */
} rotary_angle_mode;

/** Immutable: float32 cos and sin (times attention_factor) per position, as rotary::Table.
 *  Opaque. */
typedef struct rotary_table rotary_table;

/** Positions first .. first+count-1. On failure *out is NULL. Allocates 8 * count * pairs bytes. */
int rotary_table_range(const rotary_schedule* schedule, int64_t first, int64_t count,
                       rotary_angle_mode mode, rotary_table** out);
/** One row per listed position (count of them, duplicates allowed). On failure *out is NULL. */
int rotary_table_at(const rotary_schedule* schedule, const int64_t* positions, int64_t count,
                    rotary_angle_mode mode, rotary_table** out);
/** Frees a table; NULL is a no-op. */
void rotary_table_free(rotary_table* table);
/* Accessors: a NULL table gives 0 (NULL for the arrays) and sets the last error. */
int64_t rotary_table_rows(const rotary_table* table);
int64_t rotary_table_pairs(const rotary_table* table);
/** rows * pairs values, row-major: row r holds cos(position_r * inv_freq[i]) * attention_factor
 *  (sin likewise), i in [0, pairs). */
const float* rotary_table_cos(const rotary_table* table);
const float* rotary_table_sin(const rotary_table* table);

/* ---- Apply ----------------------------------------------------------------------------------- */

/** Element types: f16 is IEEE binary16, bf16 is bfloat16, both passed as 16-bit storage. */
typedef enum rotary_dtype {
  ROTARY_F32 = 0,
  ROTARY_F64 = 1,
  ROTARY_F16 = 2,
  ROTARY_BF16 = 3,
  /* Cache dtypes (rotary_cache_view, rotary_rope_store's q_quantized): rotary_apply refuses them. */
  ROTARY_FP8_E4M3 = 4, /**< OCP E4M3FN, 8-bit storage, saturating to +-448 */
  ROTARY_FP8_E5M2 = 5, /**< 8-bit storage, saturating to +-57344 */
  ROTARY_I8 = 6        /**< int8, saturating to +-127 */
} rotary_dtype;

/** A strided view of activations, logical shape [batch, seq, heads, head_dim], strides in elements
 *  (any sign), as rotary::TensorView (tensor.hpp), with its three states:
 *    absent: data NULL and shape all 0 (a zeroed struct): k, q_out and k_out may be absent;
 *    empty:  some extent 0: nothing read or written, data may be NULL;
 *    set:    data not NULL (NULL data with a non-empty shape is an error, not "absent").
 *  Non-owning. */
typedef struct rotary_tensor {
  void* data;
  rotary_dtype dtype;
  int64_t shape[4];   /**< [batch, seq, heads, head_dim] */
  int64_t strides[4]; /**< elements between neighbours along each dimension */
} rotary_tensor;

/** *out = a view of memory laid out [batch, seq, heads, head_dim], contiguous. Fails (and zeroes
 *  *out) when a stride, a product of extents, leaves int64. dtype is checked by rotary_apply. */
int rotary_tensor_bshd(void* data, rotary_dtype dtype, int64_t batch, int64_t seq, int64_t heads,
                       int64_t head_dim, rotary_tensor* out);
/** *out = a view of memory laid out [batch, heads, seq, head_dim], contiguous, seen as
 *  [batch, seq, heads, head_dim]. Fails as rotary_tensor_bshd does. */
int rotary_tensor_bhsd(void* data, rotary_dtype dtype, int64_t batch, int64_t heads, int64_t seq,
                       int64_t head_dim, rotary_tensor* out);

/** Direction of the rotation (rotary::Direction and ApplyArgs::undo, apply.hpp), the values of
 *  rotary_apply_args.inverse:
 *    ROTARY_FORWARD       rotate by +angle, times the attention factor g (and xPos's scale)
 *    ROTARY_INVERSE       rotate by -angle with the same scale: the transpose, i.e. the backward
 *                         pass. It undoes forward only when g = 1 and there is no xPos (else a
 *                         round trip scales each pair by (g sigma)^2).
 *    ROTARY_UNDO          the true inverse of forward: rotate by -angle and divide by g and by
 *                         xPos's scale (un-rotating stored keys); exact angles when g != 1 (no
 *                         table); refuses caller angles
 *    ROTARY_UNDO_INVERSE  the true inverse of ROTARY_INVERSE */
typedef enum rotary_direction {
  ROTARY_FORWARD = 0,
  ROTARY_INVERSE = 1,
  ROTARY_UNDO = 2,
  ROTARY_UNDO_INVERSE = 3
} rotary_direction;

/** Which implementation runs (rotary::Backend). */
typedef enum rotary_backend {
  ROTARY_BACKEND_AUTO = 0,      /**< the fastest available (today: cpu) */
  ROTARY_BACKEND_REFERENCE = 1, /**< the scalar oracle, double arithmetic, single-threaded */
  ROTARY_BACKEND_CPU = 2        /**< Highway SIMD kernels threaded with OpenMP */
} rotary_backend;

/** Everything rotary_apply takes, the C image of rotary::ApplyArgs. Zero-initialise, then set. */
typedef struct rotary_apply_args {
  rotary_tensor q;      /**< input; also the output when q_out is absent */
  rotary_tensor k;      /**< optional input, same dtype, batch and seq as q */
  rotary_tensor q_out;  /**< optional output, same shape and dtype as q; absent: in place */
  rotary_tensor k_out;  /**< optional output, same shape and dtype as k; absent: in place */
  /** Per-token positions, a [batch, seq] int64 array (positions_count = batch * seq entries), or
   *  NULL: token s of every batch row is at offset + s. Every position in [0, 2^31). */
  const int64_t* positions;
  int64_t positions_count;
  int64_t offset;       /**< sequential positions only (0 when positions are given) */
  int inverse;          /**< a rotary_direction: ROTARY_FORWARD (0), ROTARY_INVERSE (1),
                             ROTARY_UNDO (2) or ROTARY_UNDO_INVERSE (3) */
  int threads;          /**< 0: all OpenMP threads, else at most rotary::max_threads (apply.hpp);
                             the same bits for any count */
  /** Per-token positions as int32, instead of `positions` (at most one of the two is set); the
   *  count is positions_count. */
  const int32_t* positions_i32;
  /** Angles from this table (built from an equal schedule, holding every position used), or NULL:
   *  exact angles computed on the fly. */
  const rotary_table* table;
  rotary_backend backend;
  int skip_tail_copy;   /**< out of place: 0 copies channels rotary_dim..head_dim to the output (the
                             default), 1 leaves them unwritten */
} rotary_apply_args;

/** Element type of rotary_positions. */
typedef enum rotary_position_kind {
  ROTARY_POSITIONS_I64 = 0,
  ROTARY_POSITIONS_I32 = 1,
  ROTARY_POSITIONS_F32 = 2, /**< fractional positions turn by the exact real angle (no table) */
  ROTARY_POSITIONS_F64 = 3
} rotary_position_kind;

/** Per-token positions in one or more streams (rotary::Positions, positions.hpp): `streams`
 *  arrays one after the other, count / streams entries each, [streams, batch, seq] or
 *  [streams, 1, seq] (one row for every batch row) — transformers' M-RoPE position_ids. One
 *  stream serves every stream of the schedule. Every position in [0, 2^31). */
typedef struct rotary_positions {
  rotary_position_kind kind;
  const void* data;
  int64_t count;  /**< entries in all: streams * (batch * seq or seq) */
  int streams;    /**< in [1, 8]; 0: 1 */
} rotary_positions;

/** Rotates q and (optionally) k: pair (a, b) of a head at position p, with phi = p * inv_freq[i]
 *  and g = attention_factor, becomes (g (a cos phi - b sin phi), g (a sin phi + b cos phi));
 *  inverse negates sin (the transpose: see rotary_direction for the true inverse). Channels rotary_dim..head_dim pass through. Arithmetic, accuracy,
 *  threading and every rule as rotary::apply (apply.hpp): f32, f16 and bf16 in float32 with each
 *  result within 2^-23 * g * (|a| + |b|) of the exact rotation; f64 in double. Checks everything
 *  first; on failure nothing was written. Does not allocate. */
int rotary_apply(const rotary_schedule* schedule, const rotary_apply_args* args);
/** rotary_apply with `positions` (NULL: as rotary_apply); args->positions, positions_i32,
 *  positions_count and offset must then be 0. */
int rotary_apply_positions(const rotary_schedule* schedule, const rotary_apply_args* args,
                           const rotary_positions* positions);

/** A schedule with its own angle tables (rotary::Rope, rope.hpp): tables of positions [0, n) in
 *  each rotary_angle_mode, grown on demand up to 64 MiB each, shared safely by every thread that
 *  calls rotary_rope_apply. Opaque. */
typedef struct rotary_rope rotary_rope;

/** A Rope of `schedule` (copied: the schedule may be freed after). *out is NULL on failure. */
int rotary_rope_create(const rotary_schedule* schedule, rotary_rope** out);
/** Frees a Rope (NULL: nothing). No call may be using it. */
void rotary_rope_free(rotary_rope* rope);

/** rotary_apply_positions with the angles `mode` names (a rotary_angle_mode): taken from the Rope's
 *  table when the positions are whole and within it, else computed on the fly (the same bits).
 *  args->table must be NULL. Every rule of rotary_apply; for ROTARY_ANGLES_HF_FLOAT32, whole
 *  positions, and no undo with attention_factor != 1. */
int rotary_rope_apply(const rotary_rope* rope, const rotary_apply_args* args, const rotary_positions* positions,
                      int mode);

/* ---- Fused operations for serving engines (rotary/fused.hpp) --------------------------------- */

/** One K or V cache (or a column range of an MLA row) addressed by slot, the C image of
 *  rotary::CacheView: element (slot, h, d) lies at
 *    data + (slot / block_size) * strides[0] + (slot % block_size) * strides[1]
 *         + h * strides[2] + (offset + d) * strides[3]          (strides in elements)
 *  A zeroed struct is an absent cache. block_size 0 means 1 (a token pool). Non-owning. */
typedef struct rotary_cache_view {
  void* data;
  rotary_dtype dtype;  /**< a model dtype, or ROTARY_FP8_E4M3 / ROTARY_FP8_E5M2 / ROTARY_I8 with a scale */
  int64_t block_size;  /**< 0: 1 */
  int64_t num_blocks;
  int64_t heads;
  int64_t head_dim;    /**< columns written per head */
  int64_t strides[4];  /**< {block, token in block, head, channel}, in elements */
  int64_t offset;      /**< first column: channel d is column offset + d */
} rotary_cache_view;

/** *out = a [num_blocks, block_size, heads, row_width] contiguous cache (vLLM, FlashInfer NHD,
 *  SGLang with block_size 1), covering columns [offset, offset + head_dim) (row_width 0: head_dim).
 *  block_size >= 1 here (the struct's 0-means-1 is for a struct filled by hand); strides that leave
 *  int64 are an error. On failure *out is zeroed. */
int rotary_cache_view_nhd(void* data, rotary_dtype dtype, int64_t num_blocks, int64_t block_size, int64_t heads,
                          int64_t head_dim, int64_t offset, int64_t row_width, rotary_cache_view* out);
/** *out = a [num_blocks, heads, block_size, row_width] contiguous cache (FlashInfer HND). */
int rotary_cache_view_hnd(void* data, rotary_dtype dtype, int64_t num_blocks, int64_t block_size, int64_t heads,
                          int64_t head_dim, int64_t offset, int64_t row_width, rotary_cache_view* out);

/** Element type of rotary_slots. */
typedef enum rotary_slot_kind {
  ROTARY_SLOTS_I64 = 0,
  ROTARY_SLOTS_I32 = 1
} rotary_slot_kind;

/** One cache slot per token (vLLM's slot_mapping), separate from the positions: a negative slot
 *  skips the token's cache writes; the others must be below each cache's capacity and distinct
 *  (checked before anything is written). count: batch * seq. */
typedef struct rotary_slots {
  rotary_slot_kind kind;
  const void* data;
  int64_t count;
} rotary_slots;

/** How a scale s maps x to the code stored (rotary::ScaleMode): divide q = x / s (vLLM, SGLang;
 *  zero, the default), multiply q = x * s (FlashInfer, TensorRT-LLM). They give different bits. */
typedef enum rotary_scale_mode {
  ROTARY_SCALE_DIVIDE = 0,
  ROTARY_SCALE_MULTIPLY = 1
} rotary_scale_mode;

/** The scale of a quantised cache (rotary::CacheQuant): scale NULL for 1.0, else `count` floats,
 *  1 (per tensor) or the cache's heads (per head), each finite and > 0. count 0 means 1. */
typedef struct rotary_cache_quant {
  const float* scale;
  int64_t count;
  rotary_scale_mode mode;
} rotary_cache_quant;

/** Where k and v go (rotary::CacheWrite): k_cache[slot(t), h, d] = quantise(k rotated, in k's dtype),
 *  v_cache[slot(t), h, d] = quantise(v), k_pass_cache likewise from k_pass. v_cache, v, k_pass and
 *  k_pass_cache are optional (zeroed: absent). */
typedef struct rotary_cache_write {
  rotary_slots slots;
  rotary_cache_view k_cache;
  rotary_cache_view v_cache;
  rotary_tensor v;             /**< [batch, seq, heads_v, head_dim_v], k's dtype */
  rotary_cache_quant k_quant;
  rotary_cache_quant v_quant;
  rotary_tensor k_pass;        /**< [batch, seq, heads, pass_dim], k's dtype (MLA kv_c) */
  rotary_cache_view k_pass_cache;
  rotary_cache_quant k_pass_quant;
} rotary_cache_write;

/** rotary_rope_store's arguments (rotary::RopeStoreArgs). rope: as rotary_apply takes them, except
 *  that k is read only unless rope.k_out is set (the rotated k goes to the cache), and q is not
 *  written when q_quantized is set and rope.q_out is absent. positions: NULL uses rope's own. */
typedef struct rotary_rope_store_args {
  rotary_apply_args rope;
  const rotary_positions* positions;
  rotary_cache_write cache;
  rotary_tensor q_quantized;   /**< optional fp8/i8 copy of the rotated q */
  rotary_cache_quant q_quant;
} rotary_rope_store_args;

/** rotary_apply(q, k) then the cache write above, in one pass, bit-identical to that composition.
 *  Checks everything first (slots' range and duplicates included); on failure nothing was written. */
int rotary_rope_store(const rotary_schedule* schedule, const rotary_rope_store_args* args);

/** rotary::NormOrder, NormRounding, NormScope (fused.hpp explains each). */
typedef enum rotary_norm_order {
  ROTARY_NORM_THEN_ROPE = 0, /**< Qwen3, Gemma 3, OLMo 2 */
  ROTARY_ROPE_THEN_NORM = 1  /**< Llama 4's L2 norm (no weights) */
} rotary_norm_order;
typedef enum rotary_norm_rounding {
  ROTARY_NORM_ROUNDING_LLAMA = 0, /**< round to the data dtype, then times the weight */
  ROTARY_NORM_ROUNDING_GEMMA = 1  /**< all in float32, rounded once */
} rotary_norm_rounding;
typedef enum rotary_norm_scope {
  ROTARY_NORM_SCOPE_HEAD = 0,
  ROTARY_NORM_SCOPE_ALL_HEADS = 1 /**< OLMo 2 */
} rotary_norm_scope;

/** A norm weight: `count` values of dtype (f32 or the data's); data NULL: no weight. */
typedef struct rotary_norm_weight {
  const void* data;
  rotary_dtype dtype;
  int64_t count;
} rotary_norm_weight;

/** rotary_qk_norm_rope's arguments (rotary::QkNormRopeArgs). eps 0 means 1e-6 (no model uses an
 *  eps of 0; the C++ API takes it). store: NULL, or the cache write of rotary_rope_store (its v is
 *  ignored: v below is the one stored). */
typedef struct rotary_qk_norm_rope_args {
  rotary_apply_args rope;
  const rotary_positions* positions; /**< NULL: rope's own */
  rotary_norm_weight q_weight;
  rotary_norm_weight k_weight;
  float eps;                         /**< 0: 1e-6 */
  float weight_offset;               /**< 0: w; 1: 1 + w (Gemma) */
  rotary_norm_order order;
  rotary_norm_rounding rounding;
  rotary_norm_scope scope;
  int v_norm;                        /**< 1: weightless RMSNorm of v per head (Gemma 4) */
  rotary_tensor v;
  rotary_tensor v_out;
  const rotary_cache_write* store;
} rotary_qk_norm_rope_args;

/** Per-head RMSNorm of q and k then RoPE (or RoPE then the norm), optionally with the cache write;
 *  bit-identical to the composition (rotary::qk_norm_rope). On failure nothing was written. */
int rotary_qk_norm_rope(const rotary_schedule* schedule, const rotary_qk_norm_rope_args* args);

/** How rotary_rerotate_cache turns the keys (rotary::RerotateMode). */
typedef enum rotary_rerotate_mode {
  ROTARY_REROTATE_DELTA = 0, /**< keys rotated at p move to p + delta */
  ROTARY_REROTATE_RAW = 1    /**< un-rotated keys rotated once to `positions` */
} rotary_rerotate_mode;

/** rotary_rerotate_cache's arguments (rotary::RerotateCacheArgs). */
typedef struct rotary_rerotate_cache_args {
  rotary_cache_view cache;
  rotary_cache_view out;             /**< optional (zeroed: in place) */
  rotary_slots slots;
  rotary_rerotate_mode mode;
  const int64_t* delta;              /**< delta mode: delta_streams * slots.count values */
  int delta_streams;                 /**< 0: 1 */
  const rotary_positions* positions; /**< raw mode: NULL means 0, 1, ... */
  const rotary_table* table;         /**< raw mode: angles from this table, else exact (delta mode: NULL) */
  int inverse;                       /**< 0: keys are (to be) rotated forward, 1: inverse */
  rotary_cache_quant quant;
  int threads;
  rotary_backend backend;
  rotary_angle_mode numerics;        /**< raw mode without a table: ROTARY_ANGLES_EXACT (0) or _HF_FLOAT32 */
} rotary_rerotate_cache_args;

/** Moves cached keys by per-slot deltas, or rotates raw keys once. Positions in delta mode and a
 *  delta in raw mode are refused; the cache written (out, or cache in place) may not overlap slots,
 *  delta, positions or the scale. On failure nothing was written. */
int rotary_rerotate_cache(const rotary_schedule* schedule, const rotary_rerotate_cache_args* args);

/** FlashInfer's page table as slots (rotary::slots_from_page_table): writes `tokens` slots to
 *  slots_out (int64), -1 for a token with batch_indices < 0. On failure slots_out is untouched. */
int rotary_slots_from_page_table(const int32_t* kv_indices, int64_t kv_indices_count, const int32_t* kv_indptr,
                                 int64_t kv_indptr_count, const int32_t* batch_indices,
                                 const int32_t* position_in_request, int64_t tokens, int64_t block_size,
                                 int64_t* slots_out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ROTARY_ROTARY_H */
