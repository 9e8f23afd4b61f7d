// rotary — fused operations for serving engines: RoPE + KV-cache write (rope_store), QK-norm + RoPE
// (qk_norm_rope), and moving cached keys in place (rerotate_cache).
//
// Each operation is defined as a composition of rotary's own primitives with explicit rounding
// points, and gives the bits of that composition on every backend (CPU, CUDA, the CUDA body played
// on the host): fusing never changes a model's output. (A NaN result is NaN on every path, its sign
// and payload not, as apply's: rotary/apply.hpp, Reproducibility.)
//   rope_store   = apply(q, k) -> k' (rounded to k's dtype) -> quantise -> cache[slot];
//                  v -> quantise -> v_cache[slot]
//   qk_norm_rope = RMSNorm(q), RMSNorm(k) (each rounded to the data dtype) -> apply   (norm_then_rope)
//                  apply -> RMSNorm                                                    (rope_then_norm)
//                  then, optionally, rope_store's cache write of k and v
//   rerotate_cache = gather -> dequantise -> rotate (rerotate's angles, factor 1) -> quantise -> scatter
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "rotary/apply.hpp"
#include "rotary/schedule.hpp"
#include "rotary/tensor.hpp"

namespace rotary {

// ---- Cache addressing ----

/// One K or V cache (or one column range of an MLA row), addressed by slot. Element (slot, h, d) of
/// a cache lies at
///   data + (slot / block_size) * strides[0] + (slot % block_size) * strides[1]
///        + h * strides[2] + (offset + d) * strides[3]                       (strides in elements)
/// for slot in [0, num_blocks * block_size), h < heads, d < head_dim. What engines use:
///   vLLM paged / FlashInfer NHD  [num_blocks, block_size, heads, D]: nhd(...)
///   FlashInfer HND               [num_blocks, heads, block_size, D]: hnd(...)
///   SGLang token pool            [slots, heads * D]: nhd(data, dtype, slots, 1, heads, D)
///   contiguous [batch, max_seq, heads, D] (HF, ORT BSNH): nhd with block_size = max_seq, a slot
///                                being b * max_seq + s; BNSH [batch, heads, max_seq, D]: hnd
///   MLA rows [num_blocks, block_size, kv_lora_rank + rope_dim]: heads 1, two views on the same
///                                memory with offset 0 (kv_c) and kv_lora_rank (k_pe)
/// Non-owning. dtype: f32, f64, f16, bf16, fp8_e4m3, fp8_e5m2 or i8 (quantised with a CacheQuant).
struct CacheView {
  void* data = nullptr;
  DType dtype = DType::bf16;
  int64_t block_size = 1;
  int64_t num_blocks = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;                ///< columns this view writes per head (d < head_dim)
  std::array<int64_t, 4> strides{};    ///< {block, token in block, head, channel}, in elements
  int64_t offset = 0;                  ///< first column: channel d is column offset + d

  /// Slots this cache holds: num_blocks * block_size.
  int64_t capacity() const { return num_blocks * block_size; }
  bool is_set() const { return data != nullptr || num_blocks != 0 || heads != 0 || head_dim != 0; }

  /// [num_blocks, block_size, heads, row_width] contiguous (vLLM, FlashInfer NHD, SGLang with
  /// block_size 1); the view covers columns [offset, offset + head_dim) of row_width (0: head_dim).
  /// Throws rotary::Error for block_size < 1, columns that do not fit, or strides leaving int64.
  static CacheView nhd(void* data, DType dtype, int64_t num_blocks, int64_t block_size, int64_t heads,
                       int64_t head_dim, int64_t offset = 0, int64_t row_width = 0);
  /// [num_blocks, heads, block_size, row_width] contiguous (FlashInfer HND, BNSH with block =
  /// batch row), columns as nhd.
  static CacheView hnd(void* data, DType dtype, int64_t num_blocks, int64_t block_size, int64_t heads,
                       int64_t head_dim, int64_t offset = 0, int64_t row_width = 0);
};

/// One cache slot per token (vLLM's slot_mapping, SGLang's cache_loc), int32 or int64, separate from
/// the RoPE positions. A negative slot skips the token's cache writes (vLLM's padding); its q (and
/// k_out) are still rotated. Non-negative slots must be below the cache's capacity and distinct:
/// a duplicate or an out-of-range slot is an error, checked on the host before anything is written.
/// Non-owning. count: one per token of the call (batch * seq).
struct Slots {
  const void* data = nullptr;
  bool is_i64 = true;
  int64_t count = 0;

  static Slots of(std::span<const int64_t> slots) { return Slots{slots.data(), true, static_cast<int64_t>(slots.size())}; }
  static Slots of(std::span<const int32_t> slots) { return Slots{slots.data(), false, static_cast<int64_t>(slots.size())}; }
  /// Slot of token i (unchecked).
  int64_t at(int64_t i) const {
    return is_i64 ? static_cast<const int64_t*>(data)[i] : static_cast<const int32_t*>(data)[i];
  }
};

/// FlashInfer's page table as slots: token i of request r = batch_indices[i] (< 0: padding, slot -1),
/// at position_in_request[i] within the request, lies on page kv_indices[kv_indptr[r] +
/// position_in_request[i] / block_size], row position_in_request[i] % block_size:
///   slot = kv_indices[...] * block_size + position_in_request[i] % block_size
/// (FlashInfer's pos_enc.cuh addressing). Throws rotary::Error naming the entry when a request index
/// is beyond kv_indptr, a page index beyond the request's pages, or a value negative where it may
/// not be. batch_indices and position_in_request have one entry per token.
std::vector<int64_t> slots_from_page_table(std::span<const int32_t> kv_indices, std::span<const int32_t> kv_indptr,
                                           std::span<const int32_t> batch_indices,
                                           std::span<const int32_t> position_in_request, int64_t block_size);

// ---- Quantisation ----

/// How a float scale s maps a value x to the code stored:
///   divide:   q = fl32(x / s), dequantised x = fl32(q * s)   (vLLM, SGLang; the default)
///   multiply: q = fl32(x * s), dequantised x = fl32(q / s)   (FlashInfer, TensorRT-LLM)
/// x / s and x * (1/s) differ in the last float bit, which can flip an fp8 rounding: pick the
/// engine's convention (a FlashInfer user passes multiply and its own scale).
enum class ScaleMode { divide, multiply };

/// The scale of a quantised cache (or of fp8 q). q is then rounded to the code's type:
///   fp8_e4m3 (OCP E4M3FN, no inf): nearest-even, saturating to ±448; NaN -> NaN (0x7f / 0xff)
///   fp8_e5m2: nearest-even, saturating to ±57344; NaN -> NaN (0x7e / 0xfe); ±inf -> ±57344
///   i8: nearest-even, saturating to ±127 (never -128); NaN -> 0 (as CUDA's cvt.rni.sat.s8.f32)
/// (saturating as CUDA's __NV_SATFINITE: an infinity becomes the largest finite code).
/// scale: null for 1.0, else `count` floats: 1 (per tensor) or the cache's heads (per head), each
/// finite and > 0 (checked on the host for host memory; a CUDA call reads them on the device).
/// Only fp8 and i8 caches take a scale; the other dtypes store the value rounded, no scale.
struct CacheQuant {
  const float* scale = nullptr;
  int64_t count = 1;
  ScaleMode mode = ScaleMode::divide;
};

// ---- rope_store ----

/// Where rope_store (and qk_norm_rope's optional write) put k and v.
///   k_cache[slot(t), h, d] = quantise(k'(t, h, d))  for d < head_dim, k' = k rotated by apply and
///                            rounded to k's dtype (the whole head: rotated slice and pass-through)
///   v_cache[slot(t), h, d] = quantise(v(t, h, d))
///   k_pass_cache[slot(t), h, d] = quantise(k_pass(t, h, d))  (MLA kv_c, a nope part kept apart)
/// A quantised cache (fp8/i8) converts the value in float32 (scale, then one rounding); a model-dtype
/// cache stores it rounded once from the value in k's dtype (f32 -> bf16 rounds once). f64 data
/// goes to f64 caches only, and f64 caches take f64 data only.
struct CacheWrite {
  Slots slots{};
  CacheView k_cache{};          ///< heads = k's heads, head_dim = the schedule's head_dim
  CacheView v_cache{};          ///< optional (unset: no v); heads = v's heads, head_dim = v's
  TensorView v{};               ///< [batch, seq, heads_v, head_dim_v], k's dtype
  CacheQuant k_quant{};
  CacheQuant v_quant{};
  TensorView k_pass{};          ///< optional [batch, seq, heads, pass_dim], k's dtype
  CacheView k_pass_cache{};     ///< set with k_pass: heads and head_dim as k_pass
  CacheQuant k_pass_quant{};
};

/// rope_store's arguments. rope: apply's arguments for q and k (every descriptor: pairings,
/// partial rotary, the rotated slice at an offset, M-RoPE streams, xPos, tables, the caller's
/// cos/sin, exact or hf_float32 numerics), with these differences:
///   q: rotated in place, or into rope.q_out; with q_quantized set and rope.q_out unset, q is not
///      written (only the quantised copy is)
///   k: read only, unless rope.k_out is set (k_out may be k itself: in place); the rotated k goes
///      to the cache
/// q_quantized: optional [batch, seq, heads_q, head_dim] of fp8_e4m3/fp8_e5m2/i8: quantise(q') with
/// q_quant (q' rotated and rounded to q's dtype), the pass-through channels quantised too.
struct RopeStoreArgs {
  ApplyArgs rope{};
  CacheWrite cache{};
  TensorView q_quantized{};
  CacheQuant q_quant{};
};

/// Checks everything rope_store checks, writes nothing: validate(schedule, rope) (apply's rules),
/// then the cache write's: k set; caches' dtypes, shapes (heads, head_dim = k's, v's, k_pass's),
/// strides and spans (a non-empty cache spans < max_view_bytes), block_size >= 1, num_blocks >= 0;
/// slots' count = batch * seq, every non-negative slot below each cache's capacity and no slot
/// twice; scales (count 1 or heads, finite and > 0; only for fp8/i8); no cache overlapping another
/// output or an input (two views on one MLA row: disjoint column ranges), and no output (a cache
/// included) overlapping what the rows read as they go: slots, positions, caller angles, scales
/// (qk_norm_rope: and the norm weights); q_quantized's shape and
/// dtype. Errors name the argument and value, e.g. "slots[7]=4096 is beyond k_cache's capacity 4096
/// (num_blocks=256 * block_size=16)", "slots[9]=12 repeats slots[3]".
void validate(const Schedule& schedule, const RopeStoreArgs& args);

/// Rotates q and k and writes k and v to their caches at the slots, in one pass over the tokens
/// (angles computed once per token, shared by every head). Bit-identical to apply(q, k) followed by
/// the scatter and quantisation above. Validates first; on error nothing was written. Threads as
/// ApplyArgs::threads (bit-identical for any count); Backend::reference runs the same body on one
/// thread. Allocates only for the duplicate-slot check (a sorted copy of the slots).
void rope_store(const Schedule& schedule, const RopeStoreArgs& args);

// ---- qk_norm_rope ----

/// The order of norm and rotation: RMSNorm then RoPE (Qwen3, Gemma 3, OLMo 2, Qwen3-Next), or RoPE
/// then the norm (Llama 4's weightless L2 norm: give no weights).
enum class NormOrder { norm_then_rope, rope_then_norm };

/// Where the norm's value is rounded to the data dtype (T), following transformers:
///   llama: y = fl32(x * r), rounded to T, then times the weight: round_T(fl32(y * w_eff))
///          (LlamaRMSNorm / Qwen3RMSNorm: `weight * hidden.to(input_dtype)`; a bf16 or f16 product
///          computed in float32 and rounded once is what torch does)
///   gemma: round_T(fl32(fl32(x * r) * w_eff)), all in float32, one rounding (Gemma, OLMo 2,
///          Llama 4's L2 norm, Qwen3-Next)
/// w_eff = fl32(weight_offset + w) (weight_offset 1: Gemma's `1 + w`); without a weight, the
/// product is skipped (llama and gemma then agree).
enum class NormRounding { llama, gemma };

/// Which values one norm covers: each head (Qwen3, Gemma, Llama 4), or all heads of a token
/// together (OLMo 2's q_norm over heads * head_dim, before the head split).
enum class NormScope { head, all_heads };

/// A norm weight: `count` values of `dtype` (f32, or the data's dtype): head_dim per head scope,
/// heads * head_dim for all_heads (index h * head_dim + d). data null: no weight.
struct NormWeight {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t count = 0;
};

/// qk_norm_rope's arguments. rope: apply's arguments for q and k (q and k in place or into
/// q_out / k_out, as apply; with `store`, k goes to the cache and to rope.k_out when set, and k
/// itself is not written). v_norm: a weightless RMSNorm of v per head (Gemma 4), in place on v or
/// into v_out (with `store`, v's normed values go to the cache and v is not written).
///
/// The norm of n values x (one head, or all heads of a token), eps a float:
///   sum   = x_0^2 + x_1^2 + ... + x_{n-1}^2, in double, in that order (heads in order for
///           all_heads), each square exact (a float's square fits a double)
///   mean  = fl32(sum / n)                  (the division in double, rounded once to float)
///   r     = fl32(1 / sqrt(fl32(mean + eps)))  (the sum in float; sqrt and the division in double,
///           rounded once to float)
///   y_d   = as NormRounding says, from fl32(x_d * r)
/// The same operations, in the same order, on every backend: CPU == CUDA bit for bit. Within a
/// float ulp or so of transformers' float32 `x * torch.rsqrt(x.pow(2).mean(-1) + eps)`.
struct QkNormRopeArgs {
  ApplyArgs rope{};
  NormWeight q_weight{};
  NormWeight k_weight{};
  float eps = 1e-6f;
  float weight_offset = 0.0f;  ///< 0: w (Llama, Qwen3, OLMo 2); 1: 1 + w (Gemma, Qwen3-Next)
  NormOrder order = NormOrder::norm_then_rope;
  NormRounding rounding = NormRounding::llama;
  NormScope scope = NormScope::head;
  bool v_norm = false;          ///< weightless RMSNorm of v per head (Gemma 4), same rounding
  TensorView v{};               ///< with v_norm or store: [batch, seq, heads_v, head_dim_v]
  TensorView v_out{};           ///< v_norm without store: optional output (unset: in place)
  const CacheWrite* store = nullptr;  ///< optional: then k (and v) written as rope_store writes
                                      ///< them (store->v is ignored: v above is the one stored)
};

/// Checks everything qk_norm_rope checks, writes nothing: apply's rules on rope; f32, f16 or bf16
/// data (f64 is refused); weights' dtype (f32 or the data's) and count; eps finite and >= 0;
/// weight_offset finite; enumerators named; v's shape and dtype; with store, every rule of
/// validate(RopeStoreArgs).
void validate(const Schedule& schedule, const QkNormRopeArgs& args);

/// Norms and rotates q and k (and norms v), optionally writing k and v to their caches, in one
/// pass. Bit-identical to the composition: the reference norm written out above, rounded to the
/// data dtype, then apply (or apply then the norm), then rope_store's scatter. Validates first;
/// on error nothing was written. Threads as ApplyArgs::threads.
void qk_norm_rope(const Schedule& schedule, const QkNormRopeArgs& args);

// ---- rerotate_cache ----

/// How rerotate_cache turns the keys of each slot.
///   delta: keys rotated at p move to p + Δ (rerotate's semantics: pair j turns by the exact angle
///          |Δ_s| * inv_freq[j], cos and sin rounded once to float, sin negated for Δ_s < 0 or for
///          keys rotated inverse; factor 1: the attention factor they carry is not applied again)
///   raw:   keys stored un-rotated (vLLM's sink-eviction RFC) are rotated once, by apply's
///          arithmetic, to the given positions (angles exact, from a table, or hf_float32; the
///          attention factor applied once, here)
enum class RerotateMode { delta, raw };

/// rerotate_cache's arguments. For each token i with slots.at(i) >= 0, the keys of that slot (every
/// head of cache, channels [0, head_dim) of the view) are read, dequantised (quantised caches),
/// turned, quantised and written back (or into out, at the same slot).
///   delta mode: delta holds delta_streams * slots.count values, stream-major (delta[s * count + i]),
///               delta_streams 1 (every stream) or the schedule's streams; each in (-2^31, 2^31)
///   raw mode:   positions as ApplyArgs takes them for batch 1 and seq = slots.count
/// Quantised caches: x = dequantise(code), rotated in float32, quantised again; the added error
/// is the requantisation's: at most half a code step of the result per value (2^-4 relative for
/// e4m3, 2^-3 for e5m2, half a unit for i8) beyond the rotation's own rounding, and it accumulates
/// with every move (keep a model-dtype cache for keys that move often).
struct RerotateCacheArgs {
  CacheView cache{};
  CacheView out{};                ///< optional: written here at the same slots (unset: in place)
  Slots slots{};
  RerotateMode mode = RerotateMode::delta;
  const int64_t* delta = nullptr;  ///< delta mode (raw mode refuses it)
  int delta_streams = 1;
  Positions positions{};           ///< raw mode (delta mode refuses per-token or offset positions)
  const Table* table = nullptr;    ///< raw mode: angles from this table (else exact)
  std::optional<AngleMode> numerics{};  ///< raw mode, as ApplyArgs::numerics
  Direction rotated = Direction::forward;  ///< how the keys are (delta) or are to be (raw) rotated
  CacheQuant quant{};              ///< the cache's (and out's) scale
  int threads = 0;
  Backend backend = Backend::automatic;
};

/// Checks everything rerotate_cache checks, writes nothing: the schedule (no xPos: use rerotate for
/// xPos keys), the cache view (head_dim = the schedule's), out (same dtype, heads, head_dim and
/// capacity; disjoint from cache unless it is the same view), slots (range and duplicates), deltas
/// (count, range), raw positions (apply's rules), the scale; the cache written (out, or cache in
/// place) shares no byte with slots, deltas, positions or the scale.
void validate(const Schedule& schedule, const RerotateCacheArgs& args);

/// Moves cached keys in place by per-slot deltas (delta), or rotates raw keys once (raw). Bit-
/// identical to gathering the slots' keys, dequantising, rerotate (delta, one token at a time) or
/// apply (raw), quantising and scattering back. Validates first; on error nothing was written.
void rerotate_cache(const Schedule& schedule, const RerotateCacheArgs& args);

}  // namespace rotary
