// Internal: the fused operations' per-token body (rotary/fused.hpp), written once as ROTARY_HD code
// over plain data, so that the CPU's reference loop (src/fused/fused.cpp: Backend::reference and
// f64; the CPU's vectorised rows, src/fused/cpu_rows.cpp, are tested equal to it), the CUDA kernels
// (src/cuda/fused.cu) and their host emulation (tests) run the same arithmetic: CPU == CUDA bit
// for bit. The rotation is apply's (kernel/angles.hpp, kernel/pairs.hpp, math/rotate.hpp); the
// rounding points are the compositions' (fused.hpp):
//   norm_then_rope: x -> norm (rounded to T) -> rotate -> rounded to T -> outputs
//   rope_then_norm: x -> rotate -> rounded to T -> norm (rounded to T) -> outputs
//   outputs: q_out / k_out / v_out in T; caches converted from the T value (quantised: scale in
//   float32, one rounding to the code, math/quant.hpp).
// Work split: per token, the angle row once (fused_angles: a thread per pair on a device), the
// all-heads norms (fused_token_norms), then items, one per head of q, k, v and k_pass: each item's
// norm factor (fused_item_factor: a warp's first thread on a device), then its elements
// (fused_item: the warp's threads, lane by lane). Every element is written by one thread alone.
#pragma once

#include <cstdint>

#include "../kernel/angles.hpp"
#include "../kernel/args.hpp"
#include "../kernel/pairs.hpp"
#include "../kernel/storage.hpp"
#include "../math/hd.hpp"
#include "../math/quant.hpp"

namespace rotary::detail {

/// One cache (rotary::CacheView) and its scale, as plain data.
struct KernelCache {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t block_size = 1;
  int64_t capacity = 0;
  int64_t head_dim = 0;
  int64_t strides[4] = {};
  int64_t offset = 0;
  const float* scale = nullptr;  ///< null: 1; else 1 value, or one per head (per_head)
  bool per_head = false;
  ScaleOp op = ScaleOp::divide;
};

/// A norm weight (rotary::NormWeight) as plain data.
struct KernelWeight {
  const void* data = nullptr;
  DType dtype = DType::f32;
};

/// One flat tensor [batch, seq, heads, dim] (v, v_out, k_pass, q_quantized): in read at `strides`,
/// out written at `out_strides` (each view's own layout: v_out need not be laid out as v).
struct KernelFlat {
  const void* in = nullptr;
  void* out = nullptr;
  DType dtype = DType::f32;
  int64_t heads = 0;
  int64_t dim = 0;
  int64_t strides[4] = {};
  int64_t out_strides[4] = {};
};

/// Slot errors a kernel reports (rotary::cuda::slot_out_of_range, slot_duplicate).
inline constexpr uint32_t kSlotOutOfRange = 16;
inline constexpr uint32_t kSlotDuplicate = 32;
/// A scale in device memory that is not finite and > 0 (rotary::cuda::scale_invalid).
inline constexpr uint32_t kScaleInvalid = 64;

/// A fused call for a kernel. rope: apply's KernelArgs (operand 0 q, operand 1 k; their `out`
/// pointers are the q_out / k_out targets, written when write_q / write_k).
struct FusedKernelArgs {
  KernelArgs rope{};
  bool write_q = true;
  bool write_k = true;
  KernelFlat q_quantized{};     ///< out set: quantised q with q_scale
  KernelCache q_scale{};        ///< only scale/per_head/op and dtype are read
  // Cache write.
  const void* slots = nullptr;  ///< null: no cache write
  bool slots_i64 = true;
  bool check_duplicates = false;  ///< a device looks for tokens sharing a slot (slot_shared)
  KernelCache k_cache{};
  bool has_v_cache = false;
  KernelCache v_cache{};
  KernelFlat v{};               ///< in: v; out: v_out (null: v not written)
  bool has_k_pass = false;
  KernelFlat k_pass{};
  KernelCache k_pass_cache{};
  // Norm.
  bool norm = false;
  bool rope_then_norm = false;
  bool gemma = false;
  bool all_heads = false;
  bool v_norm = false;
  float eps = 0;
  float weight_offset = 0;
  KernelWeight q_weight{};
  KernelWeight k_weight{};
};

/// Items per token: heads of q, of k, of v (when read), of k_pass.
ROTARY_HD inline int64_t fused_items(const FusedKernelArgs& f) {
  int64_t items = f.rope.operands[0].heads + (f.rope.operand_count > 1 ? f.rope.operands[1].heads : 0);
  if (f.v.in != nullptr) items += f.v.heads;
  if (f.has_k_pass) items += f.k_pass.heads;
  return items;
}

/// A value of storage T rounded to T and widened back (identity for f32 and f64).
template <class T>
ROTARY_HD inline typename Storage<T>::Value round_to(typename Storage<T>::Value v) {
  if constexpr (sizeof(typename Storage<T>::Bits) == 2) {
    typename Storage<T>::Bits bits;
    Storage<T>::store(&bits, 0, v);
    return Storage<T>::load(&bits, 0);
  } else {
    return v;
  }
}

/// Element i of `in` copied bit for bit to element j of `out`, both of storage T: what apply does with
/// a pass-through channel, and what an output or a cache of the data's dtype receives of a value the
/// composition copies unchanged (NaN payloads kept, signalling ones too).
template <class T>
ROTARY_HD inline void copy_bits(const void* in, int64_t i, void* out, int64_t j) {
  using Bits = typename Storage<T>::Bits;
  static_cast<Bits*>(out)[j] = static_cast<const Bits*>(in)[i];
}

ROTARY_HD inline float load_weight(const KernelWeight& w, int64_t i) {
  switch (w.dtype) {
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(w.data)[i]);
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(w.data)[i]);
    default: return static_cast<const float*>(w.data)[i];
  }
}

/// The norm's r from sum (double, in index order) of n squares: fl32(1 / sqrt(fl32(fl32(sum / n) + eps))).
ROTARY_HD inline float norm_factor(double sum, int64_t n, float eps) {
#if defined(__CUDA_ARCH__)
  const auto mean = static_cast<float>(__ddiv_rn(sum, static_cast<double>(n)));
  const float v = __fadd_rn(mean, eps);
  return static_cast<float>(__ddiv_rn(1.0, __dsqrt_rn(static_cast<double>(v))));
#else
  const auto mean = static_cast<float>(sum / static_cast<double>(n));
  const float v = mean + eps;
  return static_cast<float>(1.0 / __builtin_sqrt(static_cast<double>(v)));
#endif
}

ROTARY_HD inline double square_add(double sum, float x) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(sum, __dmul_rn(static_cast<double>(x), static_cast<double>(x)));
#else
  return sum + static_cast<double>(x) * static_cast<double>(x);
#endif
}

/// The norm of one value x (rounded to T at the model's point), weight w_index into `w`.
template <class T>
ROTARY_HD inline float normalise(const FusedKernelArgs& f, float x, float r, const KernelWeight& w, int64_t w_index) {
  const float y = mul_rn(x, r);
  if (w.data == nullptr) return round_to<T>(y);
  const float weight = f.weight_offset == 0.0f ? load_weight(w, w_index)
#if defined(__CUDA_ARCH__)
                                               : __fadd_rn(f.weight_offset, load_weight(w, w_index));
#else
                                               : f.weight_offset + load_weight(w, w_index);
#endif
  if (f.gemma) return round_to<T>(mul_rn(y, weight));
  return round_to<T>(mul_rn(round_to<T>(y), weight));
}

/// The pair of a rotated channel c: j, and whether c is its second channel; j = -1 outside the slice.
struct ChannelPair {
  int64_t j;
  bool second;
};
ROTARY_HD inline ChannelPair channel_pair(const KernelArgs& a, int64_t c) {
  const int64_t rel = c - a.rotary_offset;
  if (rel < 0 || rel >= a.rotary_dim) return {-1, false};
  const int64_t block = rel / a.block_width;
  const int64_t w = rel % a.block_width;
  if (a.pair_step == 2) return {block * a.block_pairs + w / 2, (w & 1) != 0};
  return w < a.partner ? ChannelPair{block * a.block_pairs + w, false}
                       : ChannelPair{block * a.block_pairs + w - a.partner, true};
}

/// Token `token`'s slot, or -1 (no cache write, or a skipped token).
ROTARY_HD inline int64_t raw_token_slot(const FusedKernelArgs& f, int64_t token) {
  if (f.slots == nullptr) return -1;
  return f.slots_i64 ? static_cast<const int64_t*>(f.slots)[token]
                     : static_cast<int64_t>(static_cast<const int32_t*>(f.slots)[token]);
}
/// Whether a slot lies beyond a cache the call writes (only without host-checked slots: CUDA
/// calls whose slots live on the device; the kernel skips the token's writes and flags it).
ROTARY_HD inline bool slot_beyond_caches(const FusedKernelArgs& f, int64_t slot) {
  return slot >= f.k_cache.capacity || (f.has_v_cache && slot >= f.v_cache.capacity) ||
         (f.has_k_pass && slot >= f.k_pass_cache.capacity);
}
ROTARY_HD inline int64_t token_slot(const FusedKernelArgs& f, int64_t token) {
  const int64_t slot = raw_token_slot(f, token);
  return slot_beyond_caches(f, slot) ? -1 : slot;  // never written beyond a cache
}

/// Entry i of a slot array (int64 or int32).
ROTARY_HD inline int64_t slot_entry(const void* slots, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(slots)[i] : static_cast<int64_t>(static_cast<const int32_t*>(slots)[i]);
}
/// Whether an entry other than i of the `count` slots equals slot (>= 0): the device's duplicate
/// check, lanes sharing the scan (lane reads entries lane, lane + lanes, ...; a block ors the lanes'
/// answers). O(count) per entry: opt-in (FusedOptions::check_duplicate_slots), as the host check of
/// host slots is the cheap one.
ROTARY_HD inline bool slot_shared(const void* slots, bool i64, int64_t count, int64_t i, int64_t slot, int64_t lane,
                                  int64_t lanes) {
  if (slot < 0) return false;
  for (int64_t other = lane; other < count; other += lanes) {
    if (other != i && slot_entry(slots, i64, other) == slot) return true;
  }
  return false;
}

/// Whether a cache's scale values (the first, or one per head of `heads`) are all finite and > 0: what
/// the host checks of host scales, for a device's kernels to check of scales in device memory.
ROTARY_HD inline bool scales_usable(const KernelCache& c, int64_t heads) {
  if (c.scale == nullptr) return true;
  const int64_t n = c.per_head ? heads : 1;
  for (int64_t i = 0; i < n; ++i) {
    const float s = c.scale[i];
    if (!(s > 0.0f && s <= 3.4028234663852886e38f)) return false;  // NaN fails both
  }
  return true;
}

/// Whether every scale a fused call reads is usable (scales_usable): its caches' and q_out's.
ROTARY_HD inline bool fused_scales_usable(const FusedKernelArgs& f) {
  const int64_t k_heads = f.rope.operand_count > 1 ? f.rope.operands[1].heads : 0;
  const bool caches = f.slots == nullptr ||
                      (scales_usable(f.k_cache, k_heads) && (!f.has_v_cache || scales_usable(f.v_cache, f.v.heads)) &&
                       (!f.has_k_pass || scales_usable(f.k_pass_cache, f.k_pass.heads)));
  return caches && (f.q_quantized.out == nullptr || scales_usable(f.q_scale, f.rope.operands[0].heads));
}

ROTARY_HD inline float cache_scale(const KernelCache& c, int64_t h) {
  if (c.scale == nullptr) return 1.0f;
  return c.scale[c.per_head ? h : 0];
}

/// Stores v (a value of the data's dtype, widened) as `dtype` at element i of `base`, with `scale`
/// for the quantised dtypes. Double values go to f64 only (validate).
template <class Value>
ROTARY_HD inline void store_converted(void* base, int64_t i, DType dtype, Value v, float scale, ScaleOp op) {
  if constexpr (sizeof(Value) == sizeof(double)) {
    static_cast<double*>(base)[i] = v;
  } else {
    switch (dtype) {
      case DType::f32: static_cast<float*>(base)[i] = v; break;
      case DType::f16: static_cast<uint16_t*>(base)[i] = f32_to_f16(v); break;
      case DType::bf16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(v); break;
      case DType::fp8_e4m3: static_cast<uint8_t*>(base)[i] = float_to_fp8(scale_for_code(v, scale, op), e4m3_format()); break;
      case DType::fp8_e5m2: static_cast<uint8_t*>(base)[i] = float_to_fp8(scale_for_code(v, scale, op), e5m2_format()); break;
      case DType::i8: static_cast<int8_t*>(base)[i] = float_to_i8(scale_for_code(v, scale, op)); break;
      default: break;  // f64 caches take f64 data only
    }
  }
}

/// The value of element i of a cache of `dtype`, dequantised with `scale` (float; f64: double).
ROTARY_HD inline float load_dequantised(const void* base, int64_t i, DType dtype, float scale, ScaleOp op) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::fp8_e4m3: return scale_from_code(fp8_to_float(static_cast<const uint8_t*>(base)[i], e4m3_format()), scale, op);
    case DType::fp8_e5m2: return scale_from_code(fp8_to_float(static_cast<const uint8_t*>(base)[i], e5m2_format()), scale, op);
    case DType::i8: return scale_from_code(static_cast<float>(static_cast<const int8_t*>(base)[i]), scale, op);
    default: return 0.0f;
  }
}

/// Element offset of (slot, h, d) in a cache.
ROTARY_HD inline int64_t cache_index(const KernelCache& c, int64_t slot, int64_t h, int64_t d) {
  return (slot / c.block_size) * c.strides[0] + (slot % c.block_size) * c.strides[1] + h * c.strides[2] +
         (c.offset + d) * c.strides[3];
}

template <class Value>
ROTARY_HD inline void store_cache(const KernelCache& c, int64_t slot, int64_t h, int64_t d, Value v) {
  store_converted(c.data, cache_index(c, slot, h, d), c.dtype, v, cache_scale(c, h), c.op);
}

/// Phase 0 of a token: thread `thread` of `threads` fills cells[j] (the angle row, as apply's; no
/// xPos factor yet) for pairs j = thread, thread + threads, ...; skipped when the token's positions
/// are unusable (reported by thread 0).
template <class Value>
ROTARY_HD inline void fused_angles(const FusedKernelArgs& f, const PairArrays& pairs, int64_t token, int thread,
                                   int threads, AngleCell<Value>* cells) {
  const KernelArgs& a = f.rope;
  const uint32_t error = token_error(a, token);
  if (error != 0) {
    if (thread == 0 && a.error != nullptr) {
#if defined(__CUDA_ARCH__)
      atomicOr(a.error, error);
#else
      *a.error |= error;
#endif
    }
    return;
  }
  const int64_t count = a.rotary_dim / 2;
  for (int64_t j = thread; j < count; j += threads) cells[j] = pair_angle<Value>(a, pairs, token, j);
}

/// Values of head h of operand o, the whole composition up to the value in T (widened): the two
/// channels of pair j (pair_values), or a pass-through channel c (channel_value). r: the head's (or
/// token's) norm factor (norm), ignored otherwise; `norm` false: the rotation alone.
template <class T>
struct OperandHead {
  using Value = typename Storage<T>::Value;
  const FusedKernelArgs& f;
  const PairArrays& pairs;
  const AngleCell<Value>* cells;
  int64_t token;
  int o;
  int64_t h;
  float r;
  bool norm;

  ROTARY_HD const KernelOperand& op() const { return f.rope.operands[o]; }
  ROTARY_HD int64_t in_at() const {
    const int64_t b = token / f.rope.seq;
    const int64_t s = token % f.rope.seq;
    return head_offsets(op(), b, s, h).in;
  }
  ROTARY_HD const KernelWeight& weight() const { return o == 0 ? f.q_weight : f.k_weight; }
  ROTARY_HD int64_t weight_index(int64_t c) const { return (f.all_heads ? h * f.rope.head_dim : 0) + c; }
  ROTARY_HD Value input(int64_t c) const {
    const Value x = Storage<T>::load(op().in, in_at() + c * op().in_strides[3]);
    if constexpr (sizeof(Value) == sizeof(float)) {
      if (norm && !f.rope_then_norm) return normalise<T>(f, x, r, weight(), weight_index(c));
    }
    return x;
  }
  ROTARY_HD Value post(Value v, int64_t c) const {
    if constexpr (sizeof(Value) == sizeof(float)) {
      if (norm && f.rope_then_norm) return normalise<T>(f, v, r, weight(), weight_index(c));
    }
    return v;
  }
  ROTARY_HD Value channel_value(int64_t c) const { return post(input(c), c); }
  ROTARY_HD void pair_values(int64_t j, Value& first, Value& second) const {
    const KernelArgs& a = f.rope;
    const PairChannels ch = pair_channels(a, j);
    AngleCell<Value> angle = cells[j];
    if (a.xpos_scale_base != 0) angle = xpos_angle(a, pairs, token, token % a.seq, j, op().key, angle);
    Value x_out;
    Value y_out;
    rotate_pair(input(ch.a), input(ch.b), angle.c, angle.s, x_out, y_out);
    first = post(round_to<T>(x_out), ch.a);
    second = post(round_to<T>(y_out), ch.b);
  }
};

/// The norm factor of head h of operand o (head scope), or of every head (all_heads: h ignored):
/// the sum of squares in channel order of the input (norm_then_rope) or of the rotated values in T
/// (rope_then_norm).
template <class T>
ROTARY_HD inline float head_norm(const FusedKernelArgs& f, const PairArrays& pairs, const AngleCell<float>* cells,
                                 int64_t token, int o, int64_t h) {
  const KernelArgs& a = f.rope;
  const int64_t first = f.all_heads ? 0 : h;
  const int64_t last = f.all_heads ? a.operands[o].heads : h + 1;
  double sum = 0;
  for (int64_t head = first; head < last; ++head) {
    const OperandHead<T> rotated{f, pairs, cells, token, o, head, 1.0f, false};
    for (int64_t c = 0; c < a.head_dim; ++c) {
      float x;
      if (f.rope_then_norm) {
        const ChannelPair cp = channel_pair(a, c);
        if (cp.j < 0) {
          x = rotated.channel_value(c);
        } else {
          float first_value;
          float second_value;
          rotated.pair_values(cp.j, first_value, second_value);
          x = cp.second ? second_value : first_value;
        }
      } else {
        x = rotated.input(c);
      }
      sum = square_add(sum, x);
    }
  }
  return norm_factor(sum, (last - first) * a.head_dim, f.eps);
}

/// The weightless norm factor of v's head h (v_norm).
template <class T>
ROTARY_HD inline float v_norm_factor(const FusedKernelArgs& f, int64_t token, int64_t h) {
  const int64_t b = token / f.rope.seq;
  const int64_t s = token % f.rope.seq;
  const int64_t base = b * f.v.strides[0] + s * f.v.strides[1] + h * f.v.strides[2];
  double sum = 0;
  for (int64_t c = 0; c < f.v.dim; ++c) sum = square_add(sum, Storage<T>::load(f.v.in, base + c * f.v.strides[3]));
  return norm_factor(sum, f.v.dim, f.eps);
}

/// The norm factor item `item` of token `token` multiplies by: a head of q or k, its head_norm (or
/// token_r[o], the all_heads factor of operand o); a head of v, its v_norm_factor; else 1. Formed
/// from the item's inputs alone, before any of its outputs is written (fused_item).
template <class T>
ROTARY_HD inline float fused_item_factor(const FusedKernelArgs& f, const PairArrays& pairs,
                                         const AngleCell<typename Storage<T>::Value>* cells, int64_t token,
                                         int64_t item, const float* token_r) {
  using Value = typename Storage<T>::Value;
  if constexpr (sizeof(Value) == sizeof(float)) {
    const KernelArgs& a = f.rope;
    const int64_t q_heads = a.operands[0].heads;
    const int64_t k_heads = a.operand_count > 1 ? a.operands[1].heads : 0;
    if (item < q_heads + k_heads) {
      if (!f.norm) return 1.0f;
      const int o = item < q_heads ? 0 : 1;
      return f.all_heads ? token_r[o] : head_norm<T>(f, pairs, cells, token, o, o == 0 ? item : item - q_heads);
    }
    const int64_t rest = item - q_heads - k_heads;
    if (f.v.in != nullptr && rest < f.v.heads && f.v_norm) return v_norm_factor<T>(f, token, rest);
  } else {
    static_cast<void>(f), static_cast<void>(pairs), static_cast<void>(cells), static_cast<void>(token);
    static_cast<void>(item), static_cast<void>(token_r);
  }
  return 1.0f;
}

/// Item `item` of token `token` (its positions usable): one head of q, k, v or k_pass, its outputs
/// of pairs (and of channels outside the rotated slice, of v's and k_pass's channels) lane, lane +
/// lanes, ...: lanes threads share an item, each element written by one of them (a warp on a
/// device: neighbouring channels, coalesced). r: fused_item_factor's, formed before any lane writes.
/// skip_cache: no cache write for the token (its slot shared by another token: slot_shared).
template <class T>
ROTARY_HD inline void fused_item(const FusedKernelArgs& f, const PairArrays& pairs,
                                 const AngleCell<typename Storage<T>::Value>* cells, int64_t token, int64_t item,
                                 float r, int64_t lane = 0, int64_t lanes = 1, bool skip_cache = false) {
  using Value = typename Storage<T>::Value;
  const KernelArgs& a = f.rope;
  const int64_t b = token / a.seq;
  const int64_t s = token % a.seq;
  const int64_t slot = skip_cache ? -1 : token_slot(f, token);
  const int64_t q_heads = a.operands[0].heads;
  const int64_t k_heads = a.operand_count > 1 ? a.operands[1].heads : 0;
  if (item < q_heads + k_heads) {
    const int o = item < q_heads ? 0 : 1;
    const int64_t h = o == 0 ? item : item - q_heads;
    const KernelOperand& op = a.operands[o];
    const bool write = o == 0 ? f.write_q : f.write_k;
    const HeadOffsets at = head_offsets(op, b, s, h);
    const OperandHead<T> head{f, pairs, cells, token, o, h, r, f.norm};
    // copied: v is the input's value unchanged (a pass-through channel without a norm): the outputs
    // and a cache of the data's dtype take its bits, as apply and a copy do; others convert v.
    auto emit = [&](int64_t ch, Value v, bool copied = false) {
      const int64_t from = at.in + ch * op.in_strides[3];
      if (write) {
        if (copied) {
          copy_bits<T>(op.in, from, op.out, at.out + ch * op.out_strides[3]);
        } else {
          Storage<T>::store(op.out, at.out + ch * op.out_strides[3], v);
        }
      }
      if (o == 0 && f.q_quantized.out != nullptr) {
        const KernelFlat& qq = f.q_quantized;
        const int64_t i = b * qq.out_strides[0] + s * qq.out_strides[1] + h * qq.out_strides[2] + ch * qq.out_strides[3];
        store_converted(qq.out, i, qq.dtype, v, cache_scale(f.q_scale, h), f.q_scale.op);  // a quantised dtype
      }
      if (o == 1 && slot >= 0) {
        if (copied && f.k_cache.dtype == a.dtype) {
          copy_bits<T>(op.in, from, f.k_cache.data, cache_index(f.k_cache, slot, h, ch));
        } else {
          store_cache(f.k_cache, slot, h, ch, v);
        }
      }
    };
    // Both channels of a pair are read before either is written (in place is safe); a head's norm
    // factor was formed from its inputs before any write.
    const int64_t pair_count = a.rotary_dim / 2;
    for (int64_t j = lane; j < pair_count; j += lanes) {
      Value first;
      Value second;
      head.pair_values(j, first, second);
      const PairChannels ch = pair_channels(a, j);
      emit(ch.a, first);
      emit(ch.b, second);
    }
    const int64_t passthrough = a.head_dim - a.rotary_dim;
    for (int64_t k = lane; k < passthrough; k += lanes) {
      const int64_t c = passthrough_channel(a, k);
      emit(c, head.channel_value(c), !f.norm);
    }
    return;
  }
  int64_t rest = item - q_heads - k_heads;
  if (f.v.in != nullptr && rest < f.v.heads) {
    const int64_t h = rest;
    const int64_t base = b * f.v.strides[0] + s * f.v.strides[1] + h * f.v.strides[2];
    const int64_t out_base = b * f.v.out_strides[0] + s * f.v.out_strides[1] + h * f.v.out_strides[2];
    const bool copied = !f.v_norm;  // v unchanged: a cache of the data's dtype takes its bits
    for (int64_t c = lane; c < f.v.dim; c += lanes) {
      const int64_t at = base + c * f.v.strides[3];
      Value v = Storage<T>::load(f.v.in, at);
      if constexpr (sizeof(Value) == sizeof(float)) {
        if (f.v_norm) v = normalise<T>(f, v, r, KernelWeight{}, 0);
      }
      if (f.v.out != nullptr) Storage<T>::store(f.v.out, out_base + c * f.v.out_strides[3], v);  // v_out: v_norm's
      if (f.has_v_cache && slot >= 0) {
        if (copied && f.v_cache.dtype == f.rope.dtype) {
          copy_bits<T>(f.v.in, at, f.v_cache.data, cache_index(f.v_cache, slot, h, c));
        } else {
          store_cache(f.v_cache, slot, h, c, v);
        }
      }
    }
    return;
  }
  if (f.v.in != nullptr) rest -= f.v.heads;
  if (f.has_k_pass && rest < f.k_pass.heads && slot >= 0) {
    const int64_t h = rest;
    const int64_t base = b * f.k_pass.strides[0] + s * f.k_pass.strides[1] + h * f.k_pass.strides[2];
    for (int64_t c = lane; c < f.k_pass.dim; c += lanes) {
      const int64_t at = base + c * f.k_pass.strides[3];
      if (f.k_pass_cache.dtype == f.rope.dtype) {  // copied unchanged: its bits
        copy_bits<T>(f.k_pass.in, at, f.k_pass_cache.data, cache_index(f.k_pass_cache, slot, h, c));
      } else {
        store_cache(f.k_pass_cache, slot, h, c, Storage<T>::load(f.k_pass.in, at));
      }
    }
  }
}

/// The all_heads norm factors of a token, for operands 0 (q) and 1 (k): token_r[0], token_r[1].
template <class T>
ROTARY_HD inline void fused_token_norms(const FusedKernelArgs& f, const PairArrays& pairs,
                                        const AngleCell<typename Storage<T>::Value>* cells,
                                        int64_t token, float* token_r) {
  token_r[0] = token_r[1] = 1.0f;
  if constexpr (sizeof(typename Storage<T>::Value) == sizeof(float)) {
    if (!f.norm || !f.all_heads) return;
    for (int o = 0; o < f.rope.operand_count; ++o) token_r[o] = head_norm<T>(f, pairs, cells, token, o, 0);
  }
}

// ---- rerotate_cache ----

/// rerotate_cache as plain data. delta mode: each slot's pairs turn by |Δ| inv_freq[j] (exact
/// angles, factor 1, sin negated for Δ < 0 xor inverse); raw mode: rope's angles (apply's) at the
/// token's positions, rope.tokens = slots.
struct RerotateKernelArgs {
  KernelArgs rope{};   ///< head_dim, pairing, inv_freq, streams, angle source (raw), positions (raw)
  bool raw = false;
  const int64_t* delta = nullptr;
  int32_t delta_streams = 1;
  int64_t count = 0;   ///< slots
  const void* slots = nullptr;
  bool slots_i64 = true;
  bool check_duplicates = false;  ///< a device looks for slots listed twice (slot_shared)
  int64_t heads = 0;
  KernelCache in{};
  KernelCache out{};
  bool rotated_inverse = false;
};

/// Pair j's angle of token i (rerotate_cache; its positions usable in raw mode).
ROTARY_HD inline AngleCell<float> rerotate_angle(const RerotateKernelArgs& r, const PairArrays& pairs, int64_t i,
                                                 int64_t j) {
  if (r.raw) return pair_angle<float>(r.rope, pairs, i, 0, i, j);
  const int stream = pairs.pair_stream == nullptr ? 0 : pairs.pair_stream[j];
  const int64_t d = r.delta[(r.delta_streams == 1 ? 0 : stream) * r.count + i];
  const int64_t magnitude = d < 0 ? -d : d;
  const CosSin cs = exact_angle(static_cast<double>(magnitude), pairs.inv_freq[j]);
  const auto c = static_cast<float>(cs.cos);
  const auto s = static_cast<float>(cs.sin);
  return {c, (d < 0) != r.rotated_inverse ? -s : s};
}

/// Head h of token i's slot (>= 0): read, dequantise, turn, quantise, write. Both channels of a pair
/// are read before either is written.
ROTARY_HD inline void rerotate_item(const RerotateKernelArgs& r, const PairArrays& pairs, const AngleCell<float>* cells,
                                    int64_t i, int64_t h, int64_t lane = 0, int64_t lanes = 1) {
  const int64_t slot = slot_entry(r.slots, r.slots_i64, i);
  if (slot < 0) return;
  const KernelArgs& a = r.rope;
  const float in_scale = cache_scale(r.in, h);
  const int64_t pairs_count = a.rotary_dim / 2;
  const bool moved = r.out.data != r.in.data || cache_index(r.out, slot, h, 0) != cache_index(r.in, slot, h, 0);
  for (int64_t j = lane; j < pairs_count; j += lanes) {  // lanes threads share the head, as fused_item
    const PairChannels ch = pair_channels(a, j);
    const float x = load_dequantised(r.in.data, cache_index(r.in, slot, h, ch.a), r.in.dtype, in_scale, r.in.op);
    const float y = load_dequantised(r.in.data, cache_index(r.in, slot, h, ch.b), r.in.dtype, in_scale, r.in.op);
    const AngleCell<float> angle = cells != nullptr ? cells[j] : rerotate_angle(r, pairs, i, j);
    float x_out;
    float y_out;
    rotate_pair(x, y, angle.c, angle.s, x_out, y_out);
    store_cache(r.out, slot, h, ch.a, x_out);
    store_cache(r.out, slot, h, ch.b, y_out);
  }
  if (!moved) return;  // in place: the pass-through channels stay as they are
  // Out of place: the pass-through channels copied bit for bit (out has the cache's dtype and scale).
  const int64_t passthrough = a.head_dim - a.rotary_dim;
  const int64_t bytes = r.in.dtype == DType::f32 ? 4 : r.in.dtype == DType::f16 || r.in.dtype == DType::bf16 ? 2 : 1;
  for (int64_t k = lane; k < passthrough; k += lanes) {
    const int64_t c = passthrough_channel(a, k);
    const auto* from = static_cast<const unsigned char*>(r.in.data) + cache_index(r.in, slot, h, c) * bytes;
    auto* to = static_cast<unsigned char*>(r.out.data) + cache_index(r.out, slot, h, c) * bytes;
    for (int64_t byte = 0; byte < bytes; ++byte) to[byte] = from[byte];
  }
}

}  // namespace rotary::detail
