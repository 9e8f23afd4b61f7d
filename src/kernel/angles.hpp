// Internal: the angle semantics of a call, written once as ROTARY_HD code over KernelArgs, for
// every backend: which position each token has in each stream, which of them a source can use,
// and each pair's (cos, sin) from a Table, the caller's tensors, or exact angles on the fly, with
// xPos's scale. The reference and the CPU's rows call these pair by pair (the CPU keeps its
// vectorised exact rows as a fast path with the same bits, src/cpu/angle_row.cpp), the CUDA
// kernels thread by thread (src/cuda/rope_body.hpp, fast_body.hpp).
//
// Numerics are the shared math headers': exact angles detail::cos_sin_of_product
// (math/exact_angle.hpp) times the attention factor in double, rounded once to float for
// f32/f16/bf16 data; xPos's σ from math/xpos.hpp, rounded once more. Device branches use
// explicitly rounded intrinsics only.
#pragma once

#include <cstdint>

#include "../math/exact_angle.hpp"
#include "../math/half.hpp"
#include "../math/hd.hpp"
#include "../math/ieee.hpp"
#include "../math/xpos.hpp"
#include "args.hpp"

namespace rotary::detail {

/// One pair's angle values: cos and sin times the attention factor (and xPos's σ), sin negated
/// for the inverse.
template <class Value>
struct AngleCell {
  Value c;
  Value s;
};

/// The per-pair arrays the angle functions read: KernelArgs::inv_freq and pair_stream on the host;
/// on a device, copies in the kernel's own parameters (src/cuda/apply.cu), so that a kernel reads
/// its KernelArgs where they lie.
struct PairArrays {
  const double* inv_freq = nullptr;  ///< rotary_dim / 2 values (hf_float32 without inv_freq_hf32:
                                     ///< the float32 frequencies, each a float's exact double)
  const int* pair_stream = nullptr;  ///< rotary_dim / 2 stream indices, or null: all stream 0
  const float* inv_freq_hf32 = nullptr;  ///< hf_float32: the float32 frequencies, or null: read
                                         ///< inv_freq rounded to float
};

/// The host's PairArrays of args.
inline PairArrays pair_arrays(const KernelArgs& args) {
  return PairArrays{.inv_freq = args.inv_freq, .pair_stream = args.pair_stream, .inv_freq_hf32 = args.inv_freq_hf32};
}

/// The entry of the positions that token (b, s) (token = b * seq + s) reads in stream k: per token,
/// (streams == 1 ? 0 : k) * count + (token, or s for one row serving every batch row); sequential
/// positions have no entries and give s (the index TableRows::row_index uses for them).
ROTARY_HD inline int64_t position_entry(const KernelPositions& p, int64_t token, int64_t s, int stream) {
  if (p.kind == KernelPositions::Kind::sequential) return s;
  return (p.streams == 1 ? 0 : stream) * p.count + (token < p.count ? token : s);
}

/// The position of token (b, s) in stream k, as a double (exact: whole numbers below 2^53, floats,
/// doubles), as Positions::value reads it.
ROTARY_HD inline double position_of(const KernelPositions& p, int64_t token, int64_t s, int stream) {
  using Kind = KernelPositions::Kind;
  if (p.kind == Kind::sequential) return static_cast<double>(p.offset + s);
  const int64_t i = position_entry(p, token, s, stream);
  switch (p.kind) {
    case Kind::i32: return static_cast<double>(static_cast<const int32_t*>(p.data)[i]);
    case Kind::i64: return static_cast<double>(static_cast<const int64_t*>(p.data)[i]);
    case Kind::f32: return static_cast<double>(static_cast<const float*>(p.data)[i]);
    default: return static_cast<const double*>(p.data)[i];
  }
}

/// The table row of token (b, s)'s position in stream k: through TableRows::row_index (a list
/// table, resolved once per call by the host), else position - first; -1 when the table has none.
ROTARY_HD inline int64_t table_row(const KernelArgs& args, int64_t token, int64_t s, int stream) {
  const double v = position_of(args.positions, token, s, stream);
  if (args.table.row_index != nullptr) return args.table.row_index[position_entry(args.positions, token, s, stream)];
  const auto whole = static_cast<int64_t>(v);
  if (static_cast<double>(whole) != v || whole < args.table.first || whole - args.table.first >= args.table.rows) {
    return -1;
  }
  return whole - args.table.first;
}

/// The kPosition* bit of token (b, s)'s position in stream k when the angle source cannot use it,
/// or 0. Usable: in [0, 2^31) and, where rows are indexed by it (a table, per_position caller
/// angles), a whole number whose row exists; under xPos within the reach of the centre.
ROTARY_HD inline uint32_t position_error(const KernelArgs& args, int64_t token, int64_t s, int stream) {
  const double v = position_of(args.positions, token, s, stream);
  if (!(v >= 0.0 && v < static_cast<double>(max_position_limit))) return kPositionOutOfRange;
  const auto whole = static_cast<int64_t>(v);
  const bool fractional = static_cast<double>(whole) != v;
  if (args.angle_source == KernelAngleSource::table && table_row(args, token, s, stream) < 0) {
    return kPositionNotInTable;
  }
  if (args.angle_source == KernelAngleSource::hf_float32 && fractional) return kPositionNotInTable;
  if (args.angle_source == KernelAngleSource::caller && args.angles.per_position &&
      (fractional || whole >= args.angles.rows)) {
    return kPositionNotInAngles;
  }
  if (args.xpos_scale_base != 0) {
    const double from_center = ieee::sub(v, args.xpos_center);
    if (!(from_center <= args.xpos_reach && -from_center <= args.xpos_reach)) return kPositionBeyondXposReach;
  }
  return 0;
}

/// The kPosition* bit of the first unusable position of token `token` (sequence index s) over every
/// stream the schedule reads, or 0 when all are usable.
ROTARY_HD inline uint32_t token_error(const KernelArgs& args, int64_t token, int64_t s) {
  for (int k = 0; k < args.streams; ++k) {
    const uint32_t error = position_error(args, token, s, k);
    if (error != 0) return error;
  }
  return 0;
}
ROTARY_HD inline uint32_t token_error(const KernelArgs& args, int64_t token) {
  return token_error(args, token, token % args.seq);
}

/// cos and sin of the real number position * inv_freq (math/exact_angle.hpp): on the host through
/// rotary::exact_cos_sin_real, which runs a copy compiled for FMA hardware where the CPU has it
/// (src/angle.cpp; baseline x86-64 code would call libm's fma 22 times), on a device inline. The
/// same bits either way.
ROTARY_HD inline CosSin exact_angle(double position, double inv_freq) {
#if defined(__CUDA_ARCH__)
  return cos_sin_of_product(position, inv_freq);
#else
  return exact_cos_sin_real(position, inv_freq);
#endif
}

/// One element of the caller's cos or sin, widened to double.
ROTARY_HD inline double load_angle(DType dtype, const void* base, int64_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<double>(static_cast<const float*>(base)[i]);
    case DType::f64: return static_cast<const double*>(base)[i];
    case DType::f16: return static_cast<double>(f16_to_f32(static_cast<const uint16_t*>(base)[i]));
    default: return static_cast<double>(bf16_to_f32(static_cast<const uint16_t*>(base)[i]));
  }
}

/// Pair j's (c, s) for token `token` = b * seq + s_index (all of whose positions are usable:
/// token_error 0), sin negated for the inverse; Value float (f32/f16/bf16 data: one rounding to
/// float, the values a Table holds) or double (f64 data).
///   table:  the row of the pair's stream's position, widened
///   caller: the caller's value as given (multi-stream: the caller merged the streams), widened
///   exact:  cos and sin of position * inv_freq[j] in double, times the factor in double, rounded
template <class Value>
ROTARY_HD inline AngleCell<Value> pair_angle(const KernelArgs& args, const PairArrays& pairs, int64_t token,
                                             int64_t b, int64_t s_index, int64_t j) {
  const int stream = pairs.pair_stream == nullptr ? 0 : pairs.pair_stream[j];
  Value c;
  Value s;
  if (args.angle_source == KernelAngleSource::caller) {
    const KernelCallerAngles& a = args.angles;
    const int64_t first = a.per_position || a.broadcast ? 0 : b;
    const int64_t row = a.per_position
                            ? static_cast<int64_t>(position_of(args.positions, token, s_index, stream))
                            : s_index;
    const int64_t column = j * a.column_step;
    const int64_t ci = first * a.cos_strides[0] + row * a.cos_strides[1] + column * a.cos_strides[2];
    const int64_t si = first * a.sin_strides[0] + row * a.sin_strides[1] + column * a.sin_strides[2];
    c = static_cast<Value>(load_angle(a.dtype, a.cos, ci));
    s = static_cast<Value>(load_angle(a.dtype, a.sin, si));
  } else if (args.angle_source == KernelAngleSource::table) {
    const int64_t at = table_row(args, token, s_index, stream) * (args.rotary_dim / 2) + j;
    ROTARY_DASSERT(at >= 0);  // validate found every row (a device skips a token without one before this)
    c = static_cast<Value>(args.table.cos[at]);
    s = static_cast<Value>(args.table.sin[at]);
  } else if (args.angle_source == KernelAngleSource::hf_float32) {
    // transformers' float32 pipeline, as Table::at(..., hf_float32) fills a row (whole positions).
    const double position = position_of(args.positions, token, s_index, stream);
    const float f = pairs.inv_freq_hf32 != nullptr ? pairs.inv_freq_hf32[j] : static_cast<float>(pairs.inv_freq[j]);
    const float angle = ieee::mulf(f, static_cast<float>(position));
    const CosSin cs = exact_angle(static_cast<double>(angle), 1.0);
    const auto g = static_cast<float>(args.attention_factor);
    c = static_cast<Value>(ieee::mulf(static_cast<float>(cs.cos), g));
    s = static_cast<Value>(ieee::mulf(static_cast<float>(cs.sin), g));
  } else {
    const double position = position_of(args.positions, token, s_index, stream);
    const CosSin cs = exact_angle(position, pairs.inv_freq[j]);
    c = static_cast<Value>(ieee::mul(cs.cos, args.attention_factor));
    s = static_cast<Value>(ieee::mul(cs.sin, args.attention_factor));
  }
  return {c, args.inverse ? -s : s};
}
template <class Value>
ROTARY_HD inline AngleCell<Value> pair_angle(const KernelArgs& args, const PairArrays& pairs, int64_t token,
                                             int64_t j) {
  return pair_angle<Value>(args, pairs, token, token / args.seq, token % args.seq, j);
}

/// xPos: pair j's value for a query or a key (`key`) at the token's position in the pair's stream:
/// the row value times σ (math/xpos.hpp, ln ζ_j computed from j and rotary_dim), rounded once more
/// for float values, one double product for double ones.
template <class Value>
ROTARY_HD inline AngleCell<Value> xpos_angle(const KernelArgs& args, const PairArrays& pairs, int64_t token,
                                             int64_t s_index, int64_t j, bool key, AngleCell<Value> angle) {
  const int stream = pairs.pair_stream == nullptr ? 0 : pairs.pair_stream[j];
  const double position = position_of(args.positions, token, s_index, stream);
  const double sigma = xpos_scale(xpos_log_zeta_of(j, args.rotary_dim), position, args.xpos_center,
                                  args.xpos_scale_base, key);
  if constexpr (sizeof(Value) == sizeof(double)) {
    return {ieee::mul(angle.c, sigma), ieee::mul(angle.s, sigma)};
  } else {
    return {xpos_scaled(angle.c, sigma), xpos_scaled(angle.s, sigma)};
  }
}
template <class Value>
ROTARY_HD inline AngleCell<Value> xpos_angle(const KernelArgs& args, const PairArrays& pairs, int64_t token,
                                             int64_t j, bool key, AngleCell<Value> angle) {
  return xpos_angle(args, pairs, token, token % args.seq, j, key, angle);
}

}  // namespace rotary::detail
