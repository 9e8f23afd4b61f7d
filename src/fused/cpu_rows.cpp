// The fused operations' vectorised CPU path. Per token: the norms' factors (src/cpu/norm_rows.cc, per
// Highway target), the rotation by apply's own Highway rows (cpu_apply_tokens: apply's bits), which
// normalise each value as they load it (norm_then_rope on contiguous rows: RowNorm) or take rows
// normalised into scratch before them (other layouts) or after them (rope_then_norm), then the cache
// writes from the rows while they are in L1 (a copy when the cache has the data's dtype, else the
// quantiser of math/quant.hpp; a k that is not written elsewhere is rotated straight into a cache of
// its dtype). Every rounding point is the per-token body's
// (body.hpp), which the reference backend and CUDA run: the two give the same bits
// (tests/test_fused.cpp, FusedRows.*).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "../cpu/cpu.hpp"
#include "fused_args.hpp"

namespace rotary::detail {
namespace {

// A row of n values of T (src, element stride src_stride) into dst at dst_base + d * dst_stride:
// the bits when dst has the data's dtype (as the body's copy_bits, or its conversion of a value
// already in T, which gives those bits), else converted with `scale` (store_converted).
template <class T>
void put_row(const void* src, int64_t src_stride, void* dst, int64_t dst_base, int64_t dst_stride, DType dst_dtype,
             DType data_dtype, float scale, ScaleOp op, int64_t n) {
  if (dst_dtype == data_dtype) {
    using Bits = typename Storage<T>::Bits;
    const auto* from = static_cast<const Bits*>(src);
    Bits* to = static_cast<Bits*>(dst) + dst_base;
    if (src_stride == 1 && dst_stride == 1) {
      std::memcpy(to, from, static_cast<size_t>(n) * sizeof(Bits));
    } else {
      for (int64_t d = 0; d < n; ++d) to[d * dst_stride] = from[d * src_stride];
    }
    return;
  }
  // A quantised cache: contiguous rows by the vector encoder (src/cpu/quant_rows.cc, quant.hpp's
  // codes), others value by value.
  if (is_quantised_dtype(dst_dtype) && src_stride == 1 && dst_stride == 1) {
    quantise_row(data_dtype, src, dst_dtype, static_cast<uint8_t*>(dst) + dst_base, n, scale, op);
    return;
  }
  for (int64_t d = 0; d < n; ++d) {
    store_converted(dst, dst_base + d * dst_stride, dst_dtype, Storage<T>::load(src, d * src_stride), scale, op);
  }
}

// Head h's row of n values into the cache, its slot's row starting at element `base`
// (cache_index(c, slot, 0, 0), formed once per slot).
template <class T>
void put_cache_head(const void* src, int64_t src_stride, const KernelCache& c, DType data_dtype, int64_t base,
                    int64_t h, int64_t n) {
  put_row<T>(src, src_stride, c.data, base + h * c.strides[2], c.strides[3], c.dtype, data_dtype, cache_scale(c, h),
             c.op, n);
}

// `heads` heads' rows of n values (head h at src + h * src_head_stride elements) into the cache at
// `slot`: one copy when both sides hold them back to back in the data's dtype (a token's row of an
// NHD cache), else head by head.
template <class T>
void put_cache_heads(const void* src, int64_t src_head_stride, int64_t src_stride, const KernelCache& c,
                     DType data_dtype, int64_t slot, int64_t heads, int64_t n) {
  const int64_t base = cache_index(c, slot, 0, 0);
  const int64_t es = static_cast<int64_t>(sizeof(typename Storage<T>::Bits));
  if (c.dtype == data_dtype && src_stride == 1 && c.strides[3] == 1 && src_head_stride == n && c.strides[2] == n) {
    std::memcpy(static_cast<unsigned char*>(c.data) + base * es, src, static_cast<size_t>(heads * n * es));
    return;
  }
  for (int64_t h = 0; h < heads; ++h) {
    put_cache_head<T>(static_cast<const unsigned char*>(src) + h * src_head_stride * es, src_stride, c, data_dtype,
                      base, h, n);
  }
}

// The weight each channel multiplies by, as body.hpp's normalise forms it (w, or offset + w in
// float), once per call and thread: n values (the caller's own f32 weights when they are those values, else
// formed into `owned`), or null without a weight. bf16 data: a NaN weight with payload bits in its
// low half is given them cleared and its quiet bit set (owned). The bf16 rows' rounding at bit 16
// takes NaNs to have a zero low half (bf16_lanes-inl.h), and x * w of such a weight rounds to the
// bf16 that f32_to_bf16 makes of x * w with the caller's weight: the same bits.
const float* effective_weights(const FusedKernelArgs& f, const KernelWeight& w, int64_t n, DType data,
                               std::vector<float>& owned) {
  if (w.data == nullptr) return nullptr;
  const auto nan_with_low_bits = [](float v) { return std::isnan(v) && (float_bits(v) & 0xffffu) != 0; };
  if (w.dtype == DType::f32 && f.weight_offset == 0.0f) {  // load_weight's values
    const auto* values = static_cast<const float*>(w.data);
    if (data != DType::bf16 || std::none_of(values, values + n, nan_with_low_bits)) return values;
  }
  owned.resize(static_cast<size_t>(n));
  float* out = owned.data();
  // load_weight's values, a loop per dtype (a decode call forms these every call)
  if (w.dtype == DType::bf16 || w.dtype == DType::f16) {
    const auto* bits = static_cast<const uint16_t*>(w.data);
    if (w.dtype == DType::bf16) {
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(bits[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(bits[i]);
    }
  } else {
    std::memcpy(out, w.data, static_cast<size_t>(n) * sizeof(float));
  }
  if (f.weight_offset != 0.0f) {
    for (int64_t i = 0; i < n; ++i) out[i] = f.weight_offset + out[i];
  }
  if (data == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) {
      if (nan_with_low_bits(out[i])) out[i] = float_from_bits((float_bits(out[i]) & 0xffff0000u) | 0x00400000u);
    }
  }
  return out;
}

// The rows' float scratch on each thread, kept from call to call: a decode call would otherwise
// allocate each vector on every call. Each is sized and written in full before it is read.
struct FloatScratch {
  std::vector<float> factors;
  std::vector<float> operand_factors[2];
  std::vector<float> laid_out[2];
  std::vector<float> owned[2];
};
FloatScratch& float_scratch() {
  thread_local FloatScratch scratch;
  return scratch;
}

// Scratch a row is written to in full before it is read: not zeroed (a decode call's rows are most
// of its bytes).
using Scratch = std::unique_ptr<unsigned char[]>;
Scratch scratch(int64_t bytes) { return std::make_unique_for_overwrite<unsigned char[]>(static_cast<size_t>(bytes)); }

// Rows of `heads` heads normalised from src (head stride, element stride) into dst; w: the
// effective weights (null: none), [heads][n] for all_heads, else [n].
void normalise_rows(const FusedKernelArgs& f, DType dtype, const float* w, const float* r,
                    const void* src, int64_t src_head_stride, int64_t src_stride, void* dst, int64_t dst_head_stride,
                    int64_t dst_stride, int64_t heads, int64_t n) {
  const int64_t es = size_of(dtype);
  for (int64_t h = 0; h < heads; ++h) {
    normalise_row(dtype, NormRow{.src = static_cast<const unsigned char*>(src) + h * src_head_stride * es,
                                 .src_stride = src_stride,
                                 .dst = static_cast<unsigned char*>(dst) + h * dst_head_stride * es,
                                 .dst_stride = dst_stride,
                                 .r = f.all_heads ? r[0] : r[h],
                                 .w = w == nullptr ? nullptr : w + (f.all_heads ? h * n : 0),
                                 .gemma = f.gemma,
                                 .n = n});
  }
}

// Whether a norm_then_rope call's norms run inside apply's rows (RowNorm: one pass over each head
// instead of a normalise pass into scratch and apply's pass over it): every operand contiguous in
// and, where written straight to the output, out, and one rotated slice.
bool one_pass_norm(const FusedKernelArgs& f) {
  const KernelArgs& a = f.rope;
  if (!f.norm || f.rope_then_norm || slice_blocks(a) != 1) return false;
  for (int o = 0; o < a.operand_count; ++o) {
    const KernelOperand& op = a.operands[o];
    const bool write = o == 0 ? f.write_q : f.write_k;
    if (op.in_strides[3] != 1 || (write && op.out_strides[3] != 1)) return false;
  }
  return true;
}

std::atomic<int64_t> one_pass_calls{0};

// RowNorm::w for `heads` heads of weights (heads > 1: all_heads, one set per head) in `dtype`'s
// rows: the effective weights as they are (f32, f16), or laid out as the bf16 rows read them.
const float* row_weights(const float* w, DType dtype, const KernelArgs& a, int64_t heads, std::vector<float>& owned) {
  if (w == nullptr || dtype != DType::bf16) return w;
  owned.resize(static_cast<size_t>(heads * a.head_dim));
  for (int64_t h = 0; h < heads; ++h) {
    prepare_norm_weights_bf16(w + h * a.head_dim, a.head_dim, a.rotary_offset, a.rotary_dim, a.pair_step == 2,
                              owned.data() + h * a.head_dim);
  }
  return owned.data();
}

// Bytes one token's step reads and writes (its rows in the data's dtype, twice: in and out).
int64_t token_bytes(const FusedKernelArgs& f) {
  const KernelArgs& a = f.rope;
  int64_t elements = f.v.in != nullptr ? f.v.heads * f.v.dim : 0;
  for (int o = 0; o < a.operand_count; ++o) elements += a.operands[o].heads * a.head_dim;
  return std::max<int64_t>(2 * elements * size_of(a.dtype), 1);
}

template <class T>
void run_rows(const FusedKernelArgs& f, int team) {
  const KernelArgs& a = f.rope;
  const int64_t hd = a.head_dim;
  const int64_t es = static_cast<int64_t>(sizeof(typename Storage<T>::Bits));
  const bool norm_first = f.norm && !f.rope_then_norm;
  const bool norm_after = f.norm && f.rope_then_norm;
  const bool one_pass = one_pass_norm(f);
  if (one_pass) one_pass_calls.fetch_add(1, std::memory_order_relaxed);
  uint32_t error = 0;
  // Calls that stream from memory: apply's rows prefetch the next tokens' rows of q and k as they go
  // (cpu_apply_tokens' prefetch_limit) where they are the caller's: rope_store's inputs and outputs,
  // a one-pass norm's inputs and outputs, and a two-pass norm's outputs (in place: its inputs too; out
  // of place its inputs are per-thread scratch to apply, so they are left to the hardware).
  // Prefetching v's and the caches' rows too, or every row of a token at its start, measured no faster.
  const int64_t prefetch_limit = a.tokens * token_bytes(f) >= prefetch_min_bytes() ? a.tokens : 0;
  if (prefetch_limit > 0) count_prefetched_call();
  // Tokens [first, last) on the calling thread, its scratch its own; unusable positions or'ed into *bits.
  auto run = [&](int64_t first, int64_t last, uint32_t* bits) {
    // Per thread: each operand's normalised input (norm_first, two passes) and its rotated row when
    // it does not go straight to the output (norm_after, or an operand not written), [heads][head_dim] in T.
    Scratch pre[2];
    Scratch post[2];
    FloatScratch& floats = float_scratch();
    std::vector<float>& factors = floats.factors;
    auto& operand_factors = floats.operand_factors;  // one_pass: each operand's factors, for the rows
    auto& laid_out = floats.laid_out;
    RowNorm norms[2];
    const int64_t q_weights = f.all_heads ? a.operands[0].heads * hd : hd;
    const int64_t k_weights = f.all_heads && a.operand_count > 1 ? a.operands[1].heads * hd : hd;
    auto& owned = floats.owned;
    const float* weights[2] = {f.norm ? effective_weights(f, f.q_weight, q_weights, a.dtype, owned[0]) : nullptr,
                               f.norm ? effective_weights(f, f.k_weight, k_weights, a.dtype, owned[1]) : nullptr};
    const Scratch v_row = f.v.in != nullptr && f.v_norm ? scratch(f.v.dim * es) : nullptr;
    KernelArgs t = a;
    t.error = nullptr;
    bool direct[2] = {false, false};
    int64_t most_heads = 1;
    for (int o = 0; o < a.operand_count; ++o) {
      const KernelOperand& op = a.operands[o];
      KernelOperand& mine = t.operands[o];
      most_heads = std::max(most_heads, op.heads);
      const bool write = o == 0 ? f.write_q : f.write_k;
      direct[o] = write && !norm_after;
      const int64_t contiguous[4] = {0, 0, hd, 1};  // one token's row in scratch, whatever the token
      if (one_pass) {
        const int64_t weight_heads = f.all_heads ? op.heads : 1;
        operand_factors[o].resize(static_cast<size_t>(f.all_heads ? 1 : op.heads));
        norms[o] = RowNorm{.r = operand_factors[o].data(),
                           .r_stride = f.all_heads ? 0 : 1,
                           .w = row_weights(weights[o], a.dtype, a, weight_heads, laid_out[o]),
                           .w_head_stride = f.all_heads ? hd : 0,
                           .gemma = f.gemma};
      } else if (norm_first) {
        pre[o] = scratch(op.heads * hd * es);
        mine.in = pre[o].get();
        std::copy(contiguous, contiguous + 4, mine.in_strides);
      }
      if (!direct[o]) {
        post[o] = scratch(op.heads * hd * es);
        mine.out = post[o].get();
        std::copy(contiguous, contiguous + 4, mine.out_strides);
      }
      mine.in_place = (one_pass || !norm_first) && direct[o] && op.in_place;
    }
    factors.resize(static_cast<size_t>(most_heads));
    // k rotated straight into its cache row (no scratch row and copy): k not written to the caller,
    // no norm after the rotation, a cache of the data's dtype with contiguous channels (apply's rows,
    // which alone take the one-pass norm). Its slot's row is k's output for the token (the bits the
    // copy would have put there); a skipped slot's k goes to scratch as before.
    const bool k_to_cache = a.operand_count > 1 && !direct[1] && !norm_after && f.slots != nullptr &&
                            f.k_cache.dtype == a.dtype && f.k_cache.strides[3] == 1;
    unsigned char* const k_scratch = k_to_cache ? post[1].get() : nullptr;
    uint32_t& bad_bits = *bits;
    for (int64_t token = first; token < last; ++token) {
      const uint32_t bad = token_error(a, token);
      if (bad != 0) {
        bad_bits |= bad;
        continue;
      }
      const int64_t b = token / a.seq;
      const int64_t s = token % a.seq;
      const int64_t slot = token_slot(f, token);
      for (int o = 0; norm_first && o < a.operand_count; ++o) {
        const KernelOperand& op = a.operands[o];
        const void* in = static_cast<const unsigned char*>(op.in) + head_offsets(op, b, s, 0).in * es;
        if (one_pass) {  // the factors now, the normalised values inside apply's rows
          norm_factors(a.dtype, in, op.in_strides[2], 1, op.heads, hd, f.all_heads, f.eps,
                       operand_factors[o].data());
          continue;
        }
        norm_factors(a.dtype, in, op.in_strides[2], op.in_strides[3], op.heads, hd, f.all_heads, f.eps, factors.data());
        normalise_rows(f, a.dtype, weights[o], factors.data(), in, op.in_strides[2],
                          op.in_strides[3], pre[o].get(), hd, 1, op.heads, hd);
      }
      if (k_to_cache) {
        KernelOperand& k_op = t.operands[1];
        const KernelCache& c = f.k_cache;
        k_op.out = slot >= 0 ? static_cast<unsigned char*>(c.data) + cache_index(c, slot, 0, 0) * es : k_scratch;
        const int64_t row[4] = {0, 0, slot >= 0 ? c.strides[2] : hd, slot >= 0 ? c.strides[3] : 1};
        std::copy(row, row + 4, k_op.out_strides);
      }
      cpu_apply_tokens(t, token, token + 1, std::min(prefetch_limit, last), one_pass ? norms : nullptr);
      for (int o = 0; o < a.operand_count; ++o) {
        const KernelOperand& op = a.operands[o];
        const int64_t out_at = head_offsets(op, b, s, 0).out;
        // rope_then_norm: the rotated rows (scratch) normalised into the output when it is written,
        // else in place in scratch.
        const bool written = o == 0 ? f.write_q : f.write_k;
        if (norm_after) {
          norm_factors(a.dtype, post[o].get(), hd, 1, op.heads, hd, f.all_heads, f.eps, factors.data());
          if (written) {
            normalise_rows(f, a.dtype, weights[o], factors.data(), post[o].get(), hd, 1,
                           static_cast<unsigned char*>(op.out) + out_at * es, op.out_strides[2], op.out_strides[3],
                           op.heads, hd);
          } else {
            normalise_rows(f, a.dtype, weights[o], factors.data(), post[o].get(), hd, 1, post[o].get(), hd, 1,
                           op.heads, hd);
          }
        }
        // The token's final row of this operand: the output, or scratch.
        const bool in_output = direct[o] || (norm_after && written);
        const unsigned char* row = in_output ? static_cast<const unsigned char*>(op.out) + out_at * es : post[o].get();
        const int64_t row_head = in_output ? op.out_strides[2] : hd;
        const int64_t row_step = in_output ? op.out_strides[3] : 1;
        if (o == 0 && f.q_quantized.out != nullptr) {
          const KernelFlat& qq = f.q_quantized;
          for (int64_t h = 0; h < op.heads; ++h) {
            put_row<T>(row + h * row_head * es, row_step, qq.out,
                       b * qq.out_strides[0] + s * qq.out_strides[1] + h * qq.out_strides[2], qq.out_strides[3], qq.dtype, a.dtype,
                       cache_scale(f.q_scale, h), f.q_scale.op, hd);
          }
        }
        if (o == 1 && slot >= 0 && !k_to_cache) {
          put_cache_heads<T>(row, row_head, row_step, f.k_cache, a.dtype, slot, op.heads, hd);
        }
      }
      if (f.v.in != nullptr && !f.v_norm) {
        const KernelFlat& v = f.v;
        if (f.has_v_cache && slot >= 0) {
          put_cache_heads<T>(static_cast<const unsigned char*>(v.in) + (b * v.strides[0] + s * v.strides[1]) * es,
                             v.strides[2], v.strides[3], f.v_cache, a.dtype, slot, v.heads, v.dim);
        }
      } else if (f.v.in != nullptr) {  // normalised into v_out (or, without one, into scratch for the cache)
        const KernelFlat& v = f.v;
        const int64_t v_base = f.has_v_cache && slot >= 0 ? cache_index(f.v_cache, slot, 0, 0) : 0;
        for (int64_t h = 0; h < v.heads; ++h) {
          const int64_t at = b * v.strides[0] + s * v.strides[1] + h * v.strides[2];
          const void* src = static_cast<const unsigned char*>(v.in) + at * es;
          norm_factors(a.dtype, src, 0, v.strides[3], 1, v.dim, false, f.eps, factors.data());
          normalise_row(a.dtype, NormRow{.src = src, .src_stride = v.strides[3], .dst = v_row.get(), .dst_stride = 1,
                                         .r = factors[0], .n = v.dim});
          if (v.out != nullptr) {  // v_out at its own strides
            const int64_t out_at = b * v.out_strides[0] + s * v.out_strides[1] + h * v.out_strides[2];
            put_row<T>(v_row.get(), 1, v.out, out_at, v.out_strides[3], a.dtype, a.dtype, 1.0f, ScaleOp::divide, v.dim);
          }
          if (f.has_v_cache && slot >= 0) put_cache_head<T>(v_row.get(), 1, f.v_cache, a.dtype, v_base, h, v.dim);
        }
      }
      if (f.has_k_pass && slot >= 0) {
        const KernelFlat& p = f.k_pass;
        put_cache_heads<T>(static_cast<const unsigned char*>(p.in) + (b * p.strides[0] + s * p.strides[1]) * es,
                           p.strides[2], p.strides[3], f.k_pass_cache, a.dtype, slot, p.heads, p.dim);
      }
    }
  };
  if (team <= 1) {  // decode-sized calls: no OpenMP region
    run(0, a.tokens, &error);
  } else {
#pragma omp parallel num_threads(team) reduction(| : error)
    {
      // Static, contiguous chunks: each thread one range of tokens.
      const int64_t count = omp_get_num_threads();
      const int64_t me = omp_get_thread_num();
      run(a.tokens * me / count, a.tokens * (me + 1) / count, &error);
    }
  }
  if (a.error != nullptr) *a.error |= error;
}

// rerotate_cache's rows: a slot's heads turned by apply's row kernel (rotate_pair's formula lane by
// lane, loads and stores in the cache's dtype: rerotate_item's bits), its angles (rerotate_angle) formed
// once per run of slots with the same deltas (an eviction moves every key by one delta).
template <class T>
void rerotate_rows(const RerotateKernelArgs& r, int team) {
  const KernelArgs& a = r.rope;
  const PairArrays pairs = pair_arrays(a);
  const int64_t half = a.rotary_dim / 2;
  const int64_t blocks = slice_blocks(a);
  const int64_t width = a.rotary_dim / blocks;
  const bool interleaved = a.pair_step == 2;
  const int64_t es = size_of(r.in.dtype);
  const auto slot_of = [&](int64_t i) {
    return r.slots_i64 ? static_cast<const int64_t*>(r.slots)[i]
                       : static_cast<int64_t>(static_cast<const int32_t*>(r.slots)[i]);
  };
  const auto same_deltas = [&](int64_t i, int64_t j) {
    for (int64_t stream = 0; stream < r.delta_streams; ++stream) {
      if (r.delta[stream * r.count + i] != r.delta[stream * r.count + j]) return false;
    }
    return true;
  };
  // Calls that stream from memory: each slot's step prefetches the rows of the slot `ahead` on.
  const int64_t per_slot = std::max<int64_t>(r.heads * a.head_dim * es, 1);  // one slot's rows
  const bool prefetch = 2 * r.count * per_slot >= prefetch_min_bytes();          // read and written
  if (prefetch) count_prefetched_call();
  const int64_t ahead = std::max<int64_t>((kPrefetchDistance + per_slot - 1) / per_slot, 1);
  auto run = [&](int64_t first, int64_t last) {
    std::vector<float> c(static_cast<size_t>(std::max<int64_t>(half, 1)));
    std::vector<float> s(c.size());
    std::vector<float> lanes(static_cast<size_t>(std::max<int64_t>(2 * a.rotary_dim, 1)));
    int64_t formed = -1;  // the slot index whose angles c, s and lanes hold
    for (int64_t i = first; i < last; ++i) {
      const int64_t slot = slot_of(i);
      if (slot < 0) continue;
      if (formed < 0 || r.raw || !same_deltas(formed, i)) {
        for (int64_t j = 0; j < half; ++j) {
          const AngleCell<float> cell = rerotate_angle(r, pairs, i, j);
          c[static_cast<size_t>(j)] = cell.c;
          s[static_cast<size_t>(j)] = cell.s;
        }
        for (int64_t k = 0; k < blocks; ++k) {  // as apply's prepare_angles: block k's lanes at 2 k width
          const float* ck = c.data() + k * (width / 2);
          const float* sk = s.data() + k * (width / 2);
          float* lk = lanes.data() + 2 * k * width;
          if constexpr (std::is_same_v<T, float>) prepare_lanes_f32(ck, sk, width / 2, interleaved, lk);
          if constexpr (std::is_same_v<T, F16>) prepare_lanes_f16(ck, sk, width / 2, interleaved, lk);
          if constexpr (std::is_same_v<T, BF16>) prepare_lanes_bf16(ck, sk, width / 2, interleaved, lk);
        }
        formed = i;
      }
      const int64_t in_at = cache_index(r.in, slot, 0, 0);
      const int64_t out_at = cache_index(r.out, slot, 0, 0);
      RowArgs row;
      row.in = static_cast<const unsigned char*>(r.in.data) + in_at * es;
      row.out = static_cast<unsigned char*>(r.out.data) + out_at * es;
      row.heads = r.heads;
      row.in_head_stride = r.in.strides[2];
      row.out_head_stride = r.out.strides[2];
      row.rotary_dim = a.rotary_dim;
      row.head_dim = a.head_dim;
      row.rotary_offset = a.rotary_offset;
      row.blocks = blocks;
      row.interleaved = interleaved;
      // Out of place (rerotate_item's `moved`): the channels outside the slice copied bit for bit.
      row.copy_tail = r.out.data != r.in.data || out_at != in_at;
      row.c = c.data();
      row.s = s.data();
      row.lanes = lanes.data();
      // The slot `ahead` on (a skipped one: none), as a distance from this slot's rows.
      const int64_t later = prefetch && i + ahead < last ? slot_of(i + ahead) : -1;
      if (later >= 0) {
        row.prefetch_in = (cache_index(r.in, later, 0, 0) - in_at) * es;
        if (row.copy_tail) row.prefetch_out = (cache_index(r.out, later, 0, 0) - out_at) * es;
        if (row.prefetch_in != 0 || row.prefetch_out != 0) count_prefetch_distance();
      }
      if constexpr (std::is_same_v<T, float>) rotate_heads_f32(row);
      if constexpr (std::is_same_v<T, F16>) rotate_heads_f16(row);
      if constexpr (std::is_same_v<T, BF16>) rotate_heads_bf16(row);
    }
  };
  if (team <= 1) {
    run(0, r.count);
  } else {
#pragma omp parallel num_threads(team)
    {
      const int64_t count = omp_get_num_threads();
      const int64_t me = omp_get_thread_num();
      run(r.count * me / count, r.count * (me + 1) / count);
    }
  }
}

}  // namespace

bool cpu_rerotate_rows(const RerotateKernelArgs& r, int team) {
  // The cache's own dtypes (a quantised cache takes the body's dequantise-turn-requantise), head rows
  // with contiguous channels, as apply's row kernel reads them.
  if (r.in.dtype != r.out.dtype || r.in.strides[3] != 1 || r.out.strides[3] != 1) return false;
  switch (r.in.dtype) {
    case DType::f32: rerotate_rows<float>(r, team); return true;
    case DType::f16: rerotate_rows<F16>(r, team); return true;
    case DType::bf16: rerotate_rows<BF16>(r, team); return true;
    default: return false;
  }
}

int64_t one_pass_norm_call_count() { return one_pass_calls.load(); }

bool cpu_fused_rows(const FusedKernelArgs& f, int team) {
  const KernelArgs& a = f.rope;
  if (a.dtype != DType::f32 && a.dtype != DType::f16 && a.dtype != DType::bf16) return false;
  switch (a.dtype) {
    case DType::f16: run_rows<F16>(f, team); break;
    case DType::bf16: run_rows<BF16>(f, team); break;
    default: run_rows<float>(f, team); break;
  }
  return true;
}

}  // namespace rotary::detail
