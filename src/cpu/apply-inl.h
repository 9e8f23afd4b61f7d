// Per-target RoPE kernels (Highway). Included once per target by foreach_target.h from the
// per-dtype .cc files. Dtype only at the edges: widen to float32, rotate with detail::rotate_minus
// lane by lane (the larger product fused, see src/rotate.hpp), narrow once.
#if defined(ROTARY_CPU_APPLY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ROTARY_CPU_APPLY_INL_H_
#undef ROTARY_CPU_APPLY_INL_H_
#else
#define ROTARY_CPU_APPLY_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hwy/highway.h"
#include "rotary/angle.hpp"
#include "src/cpu/bf16_lanes-inl.h"
#include "src/cpu/cpu.hpp"
#include "src/math/half.hpp"
#include "src/math/exact_angle.hpp"
#include "src/math/rotate.hpp"

HWY_BEFORE_NAMESPACE();
namespace rotary::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

struct F32Tag {};
struct F16Tag {};
struct BF16Tag {};

template <class Tag>
struct StorageOf {
  using type = uint16_t;
};
template <>
struct StorageOf<F32Tag> {
  using type = float;
};

// Scalar edges, bit-exact with detail:: conversions (nearest even, one rounding at the store).
template <class Tag>
struct ScalarIo;
template <>
struct ScalarIo<F32Tag> {
  static float Load(const float* p) { return *p; }
  static void Store(float v, float* p) { *p = v; }
};
template <>
struct ScalarIo<BF16Tag> {
  static float Load(const uint16_t* p) { return bf16_to_f32(*p); }
  static void Store(float v, uint16_t* p) { *p = f32_to_bf16(v); }
};
template <>
struct ScalarIo<F16Tag> {
  static float Load(const uint16_t* p) { return f16_to_f32(*p); }
  static void Store(float v, uint16_t* p) { *p = f32_to_f16(v); }
};

// The fused norm inside the rows (RowArgs::norm): body.hpp's normalise of each value as it is
// loaded. kNorm: kNormNone (the value as it is), kNormPlain fl_T(x r), kNormLlama
// fl_T(fl32(fl_T(x r) w)), kNormGemma fl_T(fl32(x r w)); every product one float32 rounding.
constexpr int kNormNone = 0;
constexpr int kNormPlain = 1;
constexpr int kNormLlama = 2;
constexpr int kNormGemma = 3;

// One head's factor, and its weights from the first channel of the span a body reads (kNormLlama
// and kNormGemma only: w is read only then, and may be null otherwise).
struct HeadNorm {
  float r = 1.0f;
  const float* w = nullptr;
};

template <class Tag>
HWY_INLINE float RoundScalar(float v) {
  typename StorageOf<Tag>::type bits;
  ScalarIo<Tag>::Store(v, &bits);
  return ScalarIo<Tag>::Load(&bits);
}

// x normalised; channel c of the span `norm` describes.
template <class Tag, int kNorm>
HWY_INLINE float NormScalar(float x, const HeadNorm& norm, int64_t c) {
  if constexpr (kNorm == kNormNone) {
    (void)norm, (void)c;
    return x;
  } else {
    const float y = x * norm.r;
    if constexpr (kNorm == kNormPlain) {
      (void)c;
      return RoundScalar<Tag>(y);
    } else if constexpr (kNorm == kNormGemma) {
      return RoundScalar<Tag>(y * norm.w[c]);
    } else {
      return RoundScalar<Tag>(RoundScalar<Tag>(y) * norm.w[c]);
    }
  }
}

// Pairs [first, last) of one head, scalar: the reference's formula exactly (each value normalised
// first, kNorm).
template <class Tag, int kNorm = kNormNone, class T>
HWY_INLINE void RotatePairsScalar(const T* in, T* out, const RowArgs& args, int64_t first, int64_t last,
                                  const HeadNorm& norm = {}) {
  const int64_t h = args.rotary_dim / 2;
  for (int64_t i = first; i < last; ++i) {
    const int64_t ia = args.interleaved ? 2 * i : i;
    const int64_t ib = args.interleaved ? 2 * i + 1 : i + h;
    const float a = NormScalar<Tag, kNorm>(ScalarIo<Tag>::Load(in + ia), norm, ia);
    const float b = NormScalar<Tag, kNorm>(ScalarIo<Tag>::Load(in + ib), norm, ib);
    const float c = args.c[i];
    const float s = args.s[i];
    ScalarIo<Tag>::Store(rotate_minus(a, c, b, s), out + ia);
    ScalarIo<Tag>::Store(rotate_minus(b, c, a, -s), out + ib);
  }
}

#undef ROTARY_VECTOR_BODY
#undef ROTARY_VECTOR_F16
// Vector bodies need a fused multiply-add (the formula's single rounding); elsewhere (SSE4, SSSE3,
// the scalar target) every pair takes RotatePairsScalar, whose fma is emulated exactly.
#if HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR
#define ROTARY_VECTOR_BODY 1
// f16 <-> f32 in hardware, nearest even (F16C on x86): only where Highway uses the instruction.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
#define ROTARY_VECTOR_F16 1
#else
#define ROTARY_VECTOR_F16 0
#endif

using bf16_lanes::DF;  // bf16_lanes-inl.h: f32 lanes, u32 lanes (DU), their bytes as u16 (DU16)
using bf16_lanes::VF;
using bf16_lanes::DU;
using bf16_lanes::VU;
using bf16_lanes::DU16;
using bf16_lanes::Bf16Even;
using bf16_lanes::Bf16Odd;
using bf16_lanes::PackBf16;
using bf16_lanes::LoadBf16Words;
using DH = hn::Rebind<hwy::float16_t, DF>;  // L binary16 values (half a vector)

// rotate_minus, lane by lane: MulSub(x, m, q) = fma(x, m, -q), NegMulAdd(w, n, p) = fma(-w, n, p).
HWY_INLINE VF RotMinus(VF x, VF m, VF w, VF n) {
  const VF p = hn::Mul(x, m);
  const VF q = hn::Mul(w, n);
  return hn::IfThenElse(hn::Ge(hn::Abs(p), hn::Abs(q)), hn::MulSub(x, m, q), hn::NegMulAdd(w, n, p));
}

// A vector store; kStream: non-temporal (the destination must be aligned to the vector's size),
// which writes a whole line without reading it first (RowArgs::stream).
template <bool kStream, class D>
HWY_INLINE void Put(hn::VFromD<D> v, D d, hn::TFromD<D>* p) {
  if constexpr (kStream) {
    hn::Stream(v, d, p);
  } else {
    hn::StoreU(v, d, p);
  }
}

template <bool kStream>
HWY_INLINE void StoreBf16Words(VU w, uint16_t* p) { Put<kStream>(hn::BitCast(DU16(), w), DU16(), p); }

// Widen/narrow L values of f32 or f16 storage (f16 only where ROTARY_VECTOR_F16).
template <class Tag>
struct VecIo;
template <>
struct VecIo<F32Tag> {
  static VF Load(const float* p) { return hn::LoadU(DF(), p); }
  template <bool kStream>
  static void Store(VF v, float* p) { Put<kStream>(v, DF(), p); }
};
#if ROTARY_VECTOR_F16
template <>
struct VecIo<F16Tag> {
  static VF Load(const uint16_t* p) {
    return hn::PromoteTo(DF(), hn::LoadU(DH(), reinterpret_cast<const hwy::float16_t*>(p)));
  }
  template <bool kStream>
  static void Store(VF v, uint16_t* p) {
    Put<kStream>(hn::DemoteTo(DH(), v), DH(), reinterpret_cast<hwy::float16_t*>(p));
  }
};
#endif

// The value of a load, kept in its register: GCC 12 otherwise folds the same load into several
// instructions as memory operands, which costs the interleaved loop 7 zmm loads where 3 suffice
// (Zen 4 retires one 512-bit load a cycle). An empty asm the compiler must assume changed the
// register; no instruction is emitted.
HWY_INLINE VF InRegister(VF v) {
#if HWY_ARCH_X86 && (defined(__GNUC__) || defined(__clang__))
  asm("" : "+v"(v.raw));
#endif
  return v;
}

// v rounded to the storage's dtype and widened back (round_to<T> lane by lane).
template <class Tag>
HWY_INLINE VF RoundTo(VF v) {
  if constexpr (std::is_same_v<Tag, BF16Tag>) {
    return bf16_lanes::RoundToBf16(v);
  } else if constexpr (std::is_same_v<Tag, F16Tag>) {
#if ROTARY_VECTOR_F16
    return hn::PromoteTo(DF(), hn::DemoteTo(DH(), v));
#else
    static_assert(!std::is_same_v<Tag, F16Tag>, "f16 vectors need ROTARY_VECTOR_F16");
    return v;
#endif
  } else {
    return v;
  }
}

// NormScalar lane by lane: x's lanes normalised by r with weights w[at..] (kNormLlama, kNormGemma).
// bf16: a NaN among the values has a zero low half (bf16 data, a factor formed from it, or the
// caller's NaN weight with its low half cleared, as cpu_rows.cpp's effective_weights clears it), so
// RoundToBf16 needs no NaN-safe rounding.
template <class Tag, int kNorm>
HWY_INLINE VF NormWith(VF x, VF r, VF w) {
  if constexpr (kNorm == kNormNone) {
    (void)r, (void)w;
    return x;
  } else {
    VF y = hn::Mul(x, r);
    if constexpr (kNorm == kNormLlama) y = hn::Mul(RoundTo<Tag>(y), w);
    if constexpr (kNorm == kNormGemma) y = hn::Mul(y, w);
    if constexpr (kNorm == kNormPlain) (void)w;
    return RoundTo<Tag>(y);
  }
}
template <class Tag, int kNorm>
HWY_INLINE VF Norm(VF x, VF r, const float* w, int64_t at) {
  if constexpr (kNorm == kNormLlama || kNorm == kNormGemma) {
    return NormWith<Tag, kNorm>(x, r, hn::LoadU(DF(), w + at));
  } else {
    (void)w, (void)at;
    return NormWith<Tag, kNorm>(x, r, r);
  }
}

// f32 and f16, half pairing: a = x[i..], b = x[h+i..], natural angles (each value normalised
// first, kNorm: weights in channel order).
template <class Tag, bool kStream, int kNorm, class T>
HWY_INLINE int64_t RotateHalfNatural(const T* in, T* out, const RowArgs& args, const HeadNorm& norm) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t h = args.rotary_dim / 2;
  const VF r = hn::Set(DF(), norm.r);
  int64_t i = 0;
  HWY_UNROLL(2)  // two vectors a step: a decode row (64 pairs) is 2-4 steps, and the loop's own
                 // instructions were a tenth of the call (the same operations per lane: the same bits)
  for (; i + L <= h; i += L) {
    const VF a = Norm<Tag, kNorm>(InRegister(VecIo<Tag>::Load(in + i)), r, norm.w, i);
    const VF b = Norm<Tag, kNorm>(InRegister(VecIo<Tag>::Load(in + h + i)), r, norm.w, h + i);
    const VF c = InRegister(hn::LoadU(DF(), args.c + i));
    const VF s = InRegister(hn::LoadU(DF(), args.s + i));
    VecIo<Tag>::template Store<kStream>(RotMinus(a, c, b, s), out + i);
    VecIo<Tag>::template Store<kStream>(RotMinus(b, c, a, hn::Neg(s)), out + h + i);
  }
  return i;
}

// f32 and f16, interleaved: x = [a0 b0 a1 b1 ..], swapped = [b0 a0 b1 a1 ..],
// y = x C2 - swapped S2 with C2 = [c0 c0 c1 c1 ..], S2 = [s0 -s0 s1 -s1 ..] (args.lanes):
// even lanes a c - b s, odd lanes b c - a (-s): the scalar formula lane by lane.
template <class Tag, bool kStream, int kNorm, class T>
HWY_INLINE int64_t RotateInterleavedDuplicated(const T* in, T* out, const RowArgs& args, const HeadNorm& norm) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t r = args.rotary_dim;
  const float* c2 = args.lanes;
  const float* s2 = args.lanes + r;
  const VF factor = hn::Set(DF(), norm.r);
  int64_t j = 0;
  HWY_UNROLL(2)
  for (; j + L <= r; j += L) {
    const VF x = Norm<Tag, kNorm>(InRegister(VecIo<Tag>::Load(in + j)), factor, norm.w, j);
    const VF c = InRegister(hn::LoadU(DF(), c2 + j));
    const VF s = InRegister(hn::LoadU(DF(), s2 + j));
    VecIo<Tag>::template Store<kStream>(RotMinus(x, c, hn::Shuffle2301(x), s), out + j);
  }
  return j / 2;  // L is even: whole pairs
}

// bf16, interleaved: u32 lane i holds the pair (a_i, b_i); natural angles. kNanSafe: the angles
// are the caller's (RowArgs::caller_angles), whose NaNs may carry payload bits (RoundAtBit16).
// kNorm: each value normalised first, the weights of each 2L channels from 2i as [even | odd]
// (prepare_norm_weights_bf16).
template <bool kStream, bool kNanSafe, int kNorm>
HWY_INLINE int64_t RotateBf16Interleaved(const uint16_t* in, uint16_t* out, const RowArgs& args,
                                         const HeadNorm& norm) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t h = args.rotary_dim / 2;
  const VF r = hn::Set(DF(), norm.r);
  int64_t i = 0;
  HWY_UNROLL(2)
  for (; i + L <= h; i += L) {
    const VU w = LoadBf16Words(in + 2 * i);
    const VF a = Norm<BF16Tag, kNorm>(Bf16Even(w), r, norm.w, 2 * i);
    const VF b = Norm<BF16Tag, kNorm>(Bf16Odd(w), r, norm.w, 2 * i + L);
    const VF c = InRegister(hn::LoadU(DF(), args.c + i));
    const VF s = InRegister(hn::LoadU(DF(), args.s + i));
    StoreBf16Words<kStream>(PackBf16<kNanSafe>(RotMinus(a, c, b, s), RotMinus(b, c, a, hn::Neg(s))), out + 2 * i);
  }
  return i;
}

// bf16, half pairing: blocks of 2L pairs; one load of x[i..i+2L) gives pairs i, i+2, .. (even)
// and i+1, i+3, .. (odd), so args.lanes holds per block [c_even | c_odd | s_even | s_odd]. kNorm:
// each value normalised first, the weights of x[i..i+2L) and x[h+i..h+i+2L) as [even | odd]
// (prepare_norm_weights_bf16).
template <bool kStream, bool kNanSafe, int kNorm>
HWY_INLINE int64_t RotateBf16Half(const uint16_t* in, uint16_t* out, const RowArgs& args, const HeadNorm& norm) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t h = args.rotary_dim / 2;
  const VF r = hn::Set(DF(), norm.r);
  int64_t i = 0;
  for (; i + 2 * L <= h; i += 2 * L) {
    const VU wa = LoadBf16Words(in + i);
    const VU wb = LoadBf16Words(in + h + i);
    const VF ae = Norm<BF16Tag, kNorm>(Bf16Even(wa), r, norm.w, i);
    const VF ao = Norm<BF16Tag, kNorm>(Bf16Odd(wa), r, norm.w, i + L);
    const VF be = Norm<BF16Tag, kNorm>(Bf16Even(wb), r, norm.w, h + i);
    const VF bo = Norm<BF16Tag, kNorm>(Bf16Odd(wb), r, norm.w, h + i + L);
    const float* block = args.lanes + 2 * i;
    const VF ce = InRegister(hn::LoadU(DF(), block)), co = InRegister(hn::LoadU(DF(), block + L));
    const VF se = InRegister(hn::LoadU(DF(), block + 2 * L)), so = InRegister(hn::LoadU(DF(), block + 3 * L));
    StoreBf16Words<kStream>(PackBf16<kNanSafe>(RotMinus(ae, ce, be, se), RotMinus(ao, co, bo, so)), out + i);
    StoreBf16Words<kStream>(PackBf16<kNanSafe>(RotMinus(be, ce, ae, hn::Neg(se)), RotMinus(bo, co, ao, hn::Neg(so))),
                   out + h + i);
  }
  return i;
}
#else
#define ROTARY_VECTOR_BODY 0
#define ROTARY_VECTOR_F16 0
#endif  // HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR

/// Angle layouts the vector bodies read (RowArgs::lanes), built once per token from the natural
/// rows c[i], s[i] (i < pairs) and shared by every head of q and k. Needs 2 * rotary_dim floats.
///   f32/f16 interleaved: C2 = [c0 c0 c1 c1 ..] (r values), then S2 = [s0 -s0 s1 -s1 ..] (r values)
///   bf16 half:           per block of 2L pairs, [c_even | c_odd | s_even | s_odd] (L values each)
///   otherwise:           nothing (the bodies read c and s directly)
template <class Tag>
void PrepareLanesImpl(const float* c, const float* s, int64_t pairs, bool interleaved, float* lanes) {
#if ROTARY_VECTOR_BODY
  constexpr bool kBf16 = std::is_same_v<Tag, BF16Tag>;
  constexpr bool kVector = !std::is_same_v<Tag, F16Tag> || ROTARY_VECTOR_F16;
  if (!kVector) return;
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  if (interleaved && !kBf16) {
    // Each value into both halves of a u64 lane: [c c], and [s -s] (low half first in memory).
    using DU64 = hn::Repartition<uint64_t, DF>;
    using DFHalf = hn::Rebind<float, DU64>;  // L/2 floats
    const DU64 d64;
    const DFHalf dh;
    const hn::RebindToUnsigned<DFHalf> duh;
    auto pack = [&](hn::Vec<DFHalf> lo, hn::Vec<DFHalf> hi) {
      const auto wide_lo = hn::PromoteTo(d64, hn::BitCast(duh, lo));
      const auto wide_hi = hn::PromoteTo(d64, hn::BitCast(duh, hi));
      return hn::BitCast(df, hn::Or(wide_lo, hn::ShiftLeft<32>(wide_hi)));
    };
    float* c2 = lanes;
    float* s2 = lanes + 2 * pairs;
    const int64_t half = L / 2;
    int64_t i = 0;
    for (; i + half <= pairs; i += half) {
      const auto cv = hn::LoadU(dh, c + i);
      const auto sv = hn::LoadU(dh, s + i);
      hn::StoreU(pack(cv, cv), df, c2 + 2 * i);
      hn::StoreU(pack(sv, hn::Neg(sv)), df, s2 + 2 * i);
    }
    for (; i < pairs; ++i) {
      c2[2 * i] = c[i];
      c2[2 * i + 1] = c[i];
      s2[2 * i] = s[i];
      s2[2 * i + 1] = -s[i];
    }
  } else if (!interleaved && kBf16) {
    for (int64_t i = 0; i + 2 * L <= pairs; i += 2 * L) {
      float* block = lanes + 2 * i;
      const VF c_lo = hn::LoadU(df, c + i), c_hi = hn::LoadU(df, c + i + L);
      const VF s_lo = hn::LoadU(df, s + i), s_hi = hn::LoadU(df, s + i + L);
      hn::StoreU(hn::ConcatEven(df, c_hi, c_lo), df, block);
      hn::StoreU(hn::ConcatOdd(df, c_hi, c_lo), df, block + L);
      hn::StoreU(hn::ConcatEven(df, s_hi, s_lo), df, block + 2 * L);
      hn::StoreU(hn::ConcatOdd(df, s_hi, s_lo), df, block + 3 * L);
    }
  }
#else
  (void)c, (void)s, (void)pairs, (void)interleaved, (void)lanes;
#endif
}

// RowNorm::w for bf16 (prepare_norm_weights_bf16): head_dim weights, those of each 2L channels a
// vector body loads as u32 words laid out [even channels | odd channels] (where the body reads
// them), the others in channel order (the scalar tail, the channels beside the slice).
inline void PrepareNormWeightsBf16Impl(const float* w, int64_t head_dim, int64_t rotary_offset, int64_t rotary_dim,
                                       bool interleaved, float* out) {
  std::memcpy(out, w, static_cast<size_t>(head_dim) * sizeof(float));
#if ROTARY_VECTOR_BODY
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const auto split = [&](int64_t c) {
    const VF w0 = hn::LoadU(df, w + c), w1 = hn::LoadU(df, w + c + L);
    hn::StoreU(hn::ConcatEven(df, w1, w0), df, out + c);
    hn::StoreU(hn::ConcatOdd(df, w1, w0), df, out + c + L);
  };
  const int64_t h = rotary_dim / 2;
  if (interleaved) {
    for (int64_t i = 0; i + L <= h; i += L) split(rotary_offset + 2 * i);  // RotateBf16Interleaved's loads
  } else {
    for (int64_t i = 0; i + 2 * L <= h; i += 2 * L) {  // RotateBf16Half's
      split(rotary_offset + i);
      split(rotary_offset + h + i);
    }
  }
#else
  (void)rotary_offset, (void)rotary_dim, (void)interleaved;
#endif
}

// One rotated slice (or one block of a block_half slice) of one head: in and out point at its
// first channel; args.rotary_dim, c, s and lanes describe it; norm (kNorm) its factor and weights.
template <class Tag, bool kStream, int kNorm = kNormNone, class T>
HWY_INLINE int64_t RotateSliceVectors(const T* in, T* out, const RowArgs& args, const HeadNorm& norm = {}) {
#if ROTARY_VECTOR_BODY
  if constexpr (std::is_same_v<Tag, BF16Tag>) {
    if (args.caller_angles) {
      return args.interleaved ? RotateBf16Interleaved<kStream, true, kNorm>(in, out, args, norm)
                              : RotateBf16Half<kStream, true, kNorm>(in, out, args, norm);
    }
    return args.interleaved ? RotateBf16Interleaved<kStream, false, kNorm>(in, out, args, norm)
                            : RotateBf16Half<kStream, false, kNorm>(in, out, args, norm);
  } else if constexpr (std::is_same_v<Tag, F32Tag> || ROTARY_VECTOR_F16) {
    return args.interleaved ? RotateInterleavedDuplicated<Tag, kStream, kNorm>(in, out, args, norm)
                            : RotateHalfNatural<Tag, kStream, kNorm>(in, out, args, norm);
  }
#endif
  (void)in, (void)out, (void)args, (void)norm;
  return 0;
}

// Whether the vector bodies may store `out` non-temporally: every vector store of this slice
// lands on a whole aligned vector (the slice starts aligned and its half, h elements, is a whole
// number of vectors).
template <class T>
HWY_INLINE bool StreamAligned(const T* out, const RowArgs& args) {
#if ROTARY_VECTOR_BODY
  const size_t vector_bytes = hn::Lanes(DF()) * sizeof(float);
  const size_t half_bytes = static_cast<size_t>(args.rotary_dim / 2) * sizeof(T);
  return reinterpret_cast<uintptr_t>(out) % vector_bytes == 0 && half_bytes % vector_bytes == 0;
#else
  (void)out, (void)args;
  return false;
#endif
}

// kMayStream: args.stream is set, and each slice streams where StreamAligned allows; else every
// store is a plain one (the common case, decided once per call rather than per head).
template <class Tag, bool kMayStream, class T>
HWY_INLINE void RotateSlice(const T* in, T* out, const RowArgs& args) {
  // pairs rotated by a vector body
  int64_t done = 0;
  if constexpr (kMayStream) {
    done = StreamAligned(out, args) ? RotateSliceVectors<Tag, true>(in, out, args)
                                    : RotateSliceVectors<Tag, false>(in, out, args);
  } else {
    done = RotateSliceVectors<Tag, false>(in, out, args);
  }
  const int64_t h = args.rotary_dim / 2;
  if (done < h) RotatePairsScalar<Tag>(in, out, args, done, h);
}

// RotateSlice with the fused norm (RowArgs::norm): plain stores.
template <class Tag, int kNorm, class T>
HWY_INLINE void RotateSliceNormalised(const T* in, T* out, const RowArgs& args, const HeadNorm& norm) {
  const int64_t done = RotateSliceVectors<Tag, false, kNorm>(in, out, args, norm);
  const int64_t h = args.rotary_dim / 2;
  if (done < h) RotatePairsScalar<Tag, kNorm>(in, out, args, done, h, norm);
}

// n channels beside the rotated slice normalised from in to out (either may be the other), weights
// in channel order.
template <class Tag, int kNorm, class T>
HWY_INLINE void NormaliseSpan(const T* in, T* out, int64_t n, const HeadNorm& norm) {
  int64_t c = 0;
#if ROTARY_VECTOR_BODY
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const VF r = hn::Set(df, norm.r);
  if constexpr (std::is_same_v<Tag, BF16Tag>) {
    for (; c + 2 * L <= n; c += 2 * L) {  // 2L values as u32 words (bf16_lanes-inl.h)
      const VU words = LoadBf16Words(in + c);
      VF even = Bf16Even(words);
      VF odd = Bf16Odd(words);
      if constexpr (kNorm == kNormLlama || kNorm == kNormGemma) {
        const VF w0 = hn::LoadU(df, norm.w + c), w1 = hn::LoadU(df, norm.w + c + L);
        even = NormWith<Tag, kNorm>(even, r, hn::ConcatEven(df, w1, w0));
        odd = NormWith<Tag, kNorm>(odd, r, hn::ConcatOdd(df, w1, w0));
      } else {
        even = NormWith<Tag, kNorm>(even, r, r);
        odd = NormWith<Tag, kNorm>(odd, r, r);
      }
      StoreBf16Words<false>(PackBf16(even, odd), out + c);  // values of bf16 already: exact
    }
  } else if constexpr (std::is_same_v<Tag, F32Tag> || ROTARY_VECTOR_F16) {
    for (; c + L <= n; c += L) {
      VecIo<Tag>::template Store<false>(Norm<Tag, kNorm>(VecIo<Tag>::Load(in + c), r, norm.w, c), out + c);
    }
  }
#endif
  for (; c < n; ++c) ScalarIo<Tag>::Store(NormScalar<Tag, kNorm>(ScalarIo<Tag>::Load(in + c), norm, c), out + c);
}

// Every cache line of [p, p + bytes) (bytes > 0) prefetched; a hint, which never faults. kWrite: the
// lines are then written (a store-intent prefetch where the target has one; Highway's x86 targets
// do not enable PREFETCHW, so there it is prefetcht0 like a read). Always inlined (HWY_INLINE) into
// the loop that stores: GCC 12 takes a function whose only effects are prefetches for one without
// side effects, and removes its calls.
template <bool kWrite>
HWY_INLINE void PrefetchSpan(const void* p, int64_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
  const auto* first = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(first + b, kWrite ? 1 : 0, 3);
  __builtin_prefetch(first + bytes - 1, kWrite ? 1 : 0, 3);  // the last line, when p is not line-aligned
#else
  (void)p, (void)bytes;
#endif
}

// A later token's head (RowArgs::prefetch_in, prefetch_out): the span the kernel reads and writes
// (the input's lines are written too when the call is in place).
template <class T>
HWY_INLINE void PrefetchHead(const T* in, T* out, const RowArgs& args) {
  const int64_t first = args.copy_tail ? 0 : args.rotary_offset;
  const int64_t bytes = (args.copy_tail ? args.head_dim : args.rotary_dim) * static_cast<int64_t>(sizeof(T));
  const auto* in_first = reinterpret_cast<const char*>(in + first);
  if (args.prefetch_in != 0 && args.in == args.out) PrefetchSpan<true>(in_first + args.prefetch_in, bytes);
  if (args.prefetch_in != 0 && args.in != args.out) PrefetchSpan<false>(in_first + args.prefetch_in, bytes);
  if (args.prefetch_out != 0) PrefetchSpan<true>(reinterpret_cast<const char*>(out + first) + args.prefetch_out, bytes);
}

template <class Tag, bool kMayStream>
HWY_INLINE void RotateHeadsAs(const RowArgs& args) {
  using T = typename StorageOf<Tag>::type;
  const auto* in_base = static_cast<const T*>(args.in);
  auto* out_base = static_cast<T*>(args.out);
  const int64_t off = args.rotary_offset;
  const int64_t slice_end = off + args.rotary_dim;
  // block_half: each block is a half-paired slice of its own.
  RowArgs block = args;
  const int64_t w = args.rotary_dim / args.blocks;
  block.rotary_dim = w;
  const bool prefetch = args.prefetch_in != 0 || args.prefetch_out != 0;
  if (args.blocks == 1 && !args.copy_tail) {  // the common case (in place, one slice): a tight loop
    for (int64_t head = 0; head < args.heads; ++head) {
      if (prefetch) {
        PrefetchHead(in_base + head * args.in_head_stride, out_base + head * args.out_head_stride, args);
      }
      RotateSlice<Tag, kMayStream>(in_base + head * args.in_head_stride + off,
                                   out_base + head * args.out_head_stride + off, args);
    }
    return;
  }
  for (int64_t head = 0; head < args.heads; ++head) {
    const T* in = in_base + head * args.in_head_stride;
    T* out = out_base + head * args.out_head_stride;
    if (prefetch) PrefetchHead(in, out, args);
    if (args.blocks == 1) {
      RotateSlice<Tag, kMayStream>(in + off, out + off, args);
    } else {
      for (int64_t k = 0; k < args.blocks; ++k) {
        block.c = args.c + k * (w / 2);
        block.s = args.s + k * (w / 2);
        block.lanes = args.lanes != nullptr ? args.lanes + 2 * k * w : nullptr;
        RotateSlice<Tag, kMayStream>(in + off + k * w, out + off + k * w, block);
      }
    }
    if (args.copy_tail) {
      if (off > 0) std::memcpy(out, in, static_cast<size_t>(off) * sizeof(T));
      if (args.head_dim > slice_end) {
        std::memcpy(out + slice_end, in + slice_end,
                    static_cast<size_t>(args.head_dim - slice_end) * sizeof(T));
      }
    }
  }
}

// RotateHeadsAs with the fused norm (RowArgs::norm; one slice): each head's rotated slice
// normalised as it is loaded, then the channels beside it.
template <class Tag, int kNorm>
HWY_INLINE void RotateNormalisedHeads(const RowArgs& args) {
  using T = typename StorageOf<Tag>::type;
  const auto* in_base = static_cast<const T*>(args.in);
  auto* out_base = static_cast<T*>(args.out);
  const int64_t off = args.rotary_offset;
  const int64_t slice_end = off + args.rotary_dim;
  const bool prefetch = args.prefetch_in != 0 || args.prefetch_out != 0;
  constexpr bool kWeights = kNorm == kNormLlama || kNorm == kNormGemma;
  for (int64_t head = 0; head < args.heads; ++head) {
    const T* in = in_base + head * args.in_head_stride;
    T* out = out_base + head * args.out_head_stride;
    if (prefetch) PrefetchHead(in, out, args);
    const float r = args.norm.r[head * args.norm.r_stride];
    const float* w = kWeights ? args.norm.w + head * args.norm.w_head_stride : nullptr;
    RotateSliceNormalised<Tag, kNorm>(in + off, out + off, args, HeadNorm{r, kWeights ? w + off : nullptr});
    if (off > 0) NormaliseSpan<Tag, kNorm>(in, out, off, HeadNorm{r, w});
    if (args.head_dim > slice_end) {
      NormaliseSpan<Tag, kNorm>(in + slice_end, out + slice_end, args.head_dim - slice_end,
                                HeadNorm{r, kWeights ? w + slice_end : nullptr});
    }
  }
}

template <class Tag>
void RotateHeads(const RowArgs& args) {
  if (args.norm.r != nullptr) {
    if (args.norm.w == nullptr) {
      RotateNormalisedHeads<Tag, kNormPlain>(args);
    } else if (args.norm.gemma) {
      RotateNormalisedHeads<Tag, kNormGemma>(args);
    } else {
      RotateNormalisedHeads<Tag, kNormLlama>(args);
    }
    return;
  }
  if (args.stream) {
    RotateHeadsAs<Tag, true>(args);
  } else {
    RotateHeadsAs<Tag, false>(args);
  }
}

// ---- exact angles, vectorised ----

#if HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR
using D = hn::ScalableTag<double>;
using V = hn::Vec<D>;

struct DD {
  V hi;
  V lo;
};

HWY_INLINE DD TwoSum(V a, V b) {
  const V s = hn::Add(a, b);
  const V bb = hn::Sub(s, a);
  const V e = hn::Add(hn::Sub(a, hn::Sub(s, bb)), hn::Sub(b, bb));
  return {s, e};
}

// cos, sin of p[j] * f[j] for K vectors of lanes at once (j < K): lane by lane the operations of
// detail::cos_sin_of_product (src/math/exact_angle.hpp; change both together, test_exact_angle
// holds them bit-identical): exact product, k = the nearest quarter turn, π/2 in three parts
// (absolute error below 2^-106), then Taylor polynomials of the reduced angle (|r| <= π/4 + tiny:
// the first omitted terms are below 2^-62 relative). The K evaluations are independent and
// written step by step side by side, so that their dependency chains overlap. Every lane's
// operations are the same whatever K, so the results are too.
#define ROTARY_EACH _Pragma("GCC unroll 8") for (int j = 0; j < K; ++j)
template <int K>
HWY_INLINE void CosSinLanes(const V* p, const V* f, V* cos_out, V* sin_out) {
  namespace constants = ::rotary::detail::angle_constants;  // cos_sin_of_product's, shared
  const D d;
  const V pio2_hi = hn::Set(d, constants::kPio2Hi);
  const V pio2_mid = hn::Set(d, constants::kPio2Mid);
  const V pio2_lo = hn::Set(d, constants::kPio2Lo);
  V k[K];
  DD r[K];
  ROTARY_EACH {
    const V x_hi = hn::Mul(p[j], f[j]);
    const V x_lo = hn::MulSub(p[j], f[j], x_hi);  // exact remainder of the product (fused)
    k[j] = hn::Round(hn::Mul(x_hi, hn::Set(d, constants::kTwoOverPi)));
    // x_hi - k pio2_hi in one fused operation, exact: both are multiples of 2^-53 (k pio2_hi of
    // 2^-49; x_hi of its ulp, >= 2^-53 once k >= 1) and the difference is below 2 (below 1/4
    // when x_hi < 1), so it has at most 53 significant bits.
    const V r0 = hn::NegMulAdd(k[j], pio2_hi, x_hi);
    // r = r0 + x_lo - k pio2_mid - k pio2_lo: the two large terms by exact TwoSums, the errors
    // and the small terms (each below 2^-55) summed in plain double (absolute error < 2^-106),
    // then renormalised.
    const V k_mid = hn::Mul(k[j], pio2_mid);
    const V k_mid_lo = hn::MulSub(k[j], pio2_mid, k_mid);
    const DD a = TwoSum(r0, x_lo);
    const DD b = TwoSum(a.hi, hn::Neg(k_mid));
    const V lo = hn::NegMulAdd(k[j], pio2_lo, hn::Sub(hn::Add(a.lo, b.lo), k_mid_lo));
    r[j] = TwoSum(b.hi, lo);
  }
  V r2[K], ps[K], pc[K];
  ROTARY_EACH {
    r2[j] = hn::Mul(r[j].hi, r[j].hi);
    ps[j] = hn::Set(d, constants::kInvFact17);
    pc[j] = hn::Set(d, constants::kInvFact16);
  }
  // sin r = r (1 - r^2/3! + r^4/5! - ... - r^16/17!), cos r = 1 - r^2/2! + r^4/4! - ... + r^16/16!
  constexpr double kSin[] = {-constants::kInvFact15, constants::kInvFact13, -constants::kInvFact11,
                             constants::kInvFact9,   -constants::kInvFact7, constants::kInvFact5,
                             -constants::kInvFact3};
  constexpr double kCos[] = {-constants::kInvFact14, constants::kInvFact12, -constants::kInvFact10,
                             constants::kInvFact8,   -constants::kInvFact6, constants::kInvFact4,
                             -constants::kInvFact2,  1.0};
  for (double coefficient : kSin) {
    ROTARY_EACH { ps[j] = hn::MulAdd(ps[j], r2[j], hn::Set(d, coefficient)); }
  }
  for (double coefficient : kCos) {
    ROTARY_EACH { pc[j] = hn::MulAdd(pc[j], r2[j], hn::Set(d, coefficient)); }
  }
  ROTARY_EACH {
    const V s = hn::MulAdd(hn::Mul(ps[j], r2[j]), r[j].hi, r[j].hi);
    const V c = pc[j];
    // r_lo correction, first order.
    const V sin_r = hn::MulAdd(r[j].lo, c, s);
    const V cos_r = hn::NegMulAdd(r[j].lo, s, c);
    // Quadrant q = k mod 4 (k is an exact integer below 2^53).
    const V q = hn::Sub(k[j], hn::Mul(hn::Floor(hn::Mul(k[j], hn::Set(d, 0.25))), hn::Set(d, 4.0)));
    const auto odd = hn::Or(hn::Eq(q, hn::Set(d, 1.0)), hn::Eq(q, hn::Set(d, 3.0)));
    const V base_c = hn::IfThenElse(odd, sin_r, cos_r);
    const V base_s = hn::IfThenElse(odd, cos_r, sin_r);
    const auto negate_c = hn::Or(hn::Eq(q, hn::Set(d, 1.0)), hn::Eq(q, hn::Set(d, 2.0)));
    const auto negate_s = hn::Ge(q, hn::Set(d, 2.0));
    cos_out[j] = hn::IfThenElse(negate_c, hn::Neg(base_c), base_c);
    sin_out[j] = hn::IfThenElse(negate_s, hn::Neg(base_s), base_s);
  }
}
#undef ROTARY_EACH

HWY_INLINE void CosSinLanes(V p, V f, V& cos_out, V& sin_out) { CosSinLanes<1>(&p, &f, &cos_out, &sin_out); }

// Vectors evaluated side by side in a row (CosSinLanes<K>).
constexpr int kAngleChains = 4;
#endif

// cos and sin of p_i * inv_freq[i] times factor (double), i < pairs, p_i = pair_position[i] when
// given, else position; see cpu.hpp.
inline void CosSinRowImpl(double position, const double* pair_position, const double* inv_freq,
                          int64_t pairs, double factor, double* cos_out, double* sin_out) {
#if HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR
  const D d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const V p = hn::Set(d, position);
  const V g = hn::Set(d, factor);
  int64_t i = 0;
  constexpr int K = kAngleChains;
  for (; i + K * N <= pairs; i += K * N) {
    V pv[K], f[K], c[K], s[K];
    for (int j = 0; j < K; ++j) {
      pv[j] = pair_position != nullptr ? hn::LoadU(d, pair_position + i + j * N) : p;
      f[j] = hn::LoadU(d, inv_freq + i + j * N);
    }
    CosSinLanes<K>(pv, f, c, s);
    for (int j = 0; j < K; ++j) {
      hn::StoreU(hn::Mul(c[j], g), d, cos_out + i + j * N);
      hn::StoreU(hn::Mul(s[j], g), d, sin_out + i + j * N);
    }
  }
  for (; i + N <= pairs; i += N) {
    V c, s;
    const V pv = pair_position != nullptr ? hn::LoadU(d, pair_position + i) : p;
    CosSinLanes(pv, hn::LoadU(d, inv_freq + i), c, s);
    hn::StoreU(hn::Mul(c, g), d, cos_out + i);
    hn::StoreU(hn::Mul(s, g), d, sin_out + i);
  }
  if (i < pairs) {  // the tail through the same vector code, padded
    constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(double);
    HWY_ALIGN double f[kMaxLanes] = {};
    HWY_ALIGN double pp[kMaxLanes] = {};
    HWY_ALIGN double c_tail[kMaxLanes];
    HWY_ALIGN double s_tail[kMaxLanes];
    for (int64_t j = 0; j < N; ++j) {
      f[j] = i + j < pairs ? inv_freq[i + j] : 1.0;
      pp[j] = i + j < pairs && pair_position != nullptr ? pair_position[i + j] : position;
    }
    V c, s;
    CosSinLanes(hn::Load(d, pp), hn::Load(d, f), c, s);
    hn::Store(hn::Mul(c, g), d, c_tail);
    hn::Store(hn::Mul(s, g), d, s_tail);
    for (int64_t j = 0; i + j < pairs; ++j) {
      cos_out[i + j] = c_tail[j];
      sin_out[i + j] = s_tail[j];
    }
  }
#else
  for (int64_t i = 0; i < pairs; ++i) {
    const CosSin cs =
        cos_sin_of_product(pair_position != nullptr ? pair_position[i] : position, inv_freq[i]);
    cos_out[i] = cs.cos * factor;
    sin_out[i] = cs.sin * factor;
  }
#endif
}

// The same angles rounded once to float, as a Table stores them: c = fl(cos * factor),
// s = sign * fl(sin * factor) (sign +1 or -1, exact). Vector targets round in-register.
inline void CosSinRowF32Impl(double position, const double* pair_position, const double* inv_freq,
                             int64_t pairs, double factor, float sign, float* cos_out,
                             float* sin_out) {
  int64_t i = 0;
#if HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR
  const D d;
  const hn::Rebind<float, D> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const V p = hn::Set(d, position);
  const V g = hn::Set(d, factor);
  const auto sign_v = hn::Set(df, sign);
  constexpr int K = kAngleChains;
  for (; i + K * N <= pairs; i += K * N) {
    V pv[K], f[K], c[K], s[K];
    for (int j = 0; j < K; ++j) {
      pv[j] = pair_position != nullptr ? hn::LoadU(d, pair_position + i + j * N) : p;
      f[j] = hn::LoadU(d, inv_freq + i + j * N);
    }
    CosSinLanes<K>(pv, f, c, s);
    for (int j = 0; j < K; ++j) {
      hn::StoreU(hn::DemoteTo(df, hn::Mul(c[j], g)), df, cos_out + i + j * N);
      hn::StoreU(hn::Mul(hn::DemoteTo(df, hn::Mul(s[j], g)), sign_v), df, sin_out + i + j * N);
    }
  }
  for (; i + N <= pairs; i += N) {
    V c, s;
    const V pv = pair_position != nullptr ? hn::LoadU(d, pair_position + i) : p;
    CosSinLanes(pv, hn::LoadU(d, inv_freq + i), c, s);
    hn::StoreU(hn::DemoteTo(df, hn::Mul(c, g)), df, cos_out + i);
    hn::StoreU(hn::Mul(hn::DemoteTo(df, hn::Mul(s, g)), sign_v), df, sin_out + i);
  }
  if (i < pairs) {
    constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(double);
    HWY_ALIGN double c_tail[kMaxLanes];
    HWY_ALIGN double s_tail[kMaxLanes];
    CosSinRowImpl(position, pair_position != nullptr ? pair_position + i : nullptr, inv_freq + i,
                  pairs - i, factor, c_tail, s_tail);
    for (int64_t j = 0; i + j < pairs; ++j) {
      cos_out[i + j] = static_cast<float>(c_tail[j]);
      sin_out[i + j] = sign * static_cast<float>(s_tail[j]);
    }
  }
#else
  for (; i < pairs; ++i) {
    const CosSin cs =
        cos_sin_of_product(pair_position != nullptr ? pair_position[i] : position, inv_freq[i]);
    cos_out[i] = static_cast<float>(cs.cos * factor);
    sin_out[i] = sign * static_cast<float>(cs.sin * factor);
  }
#endif
}

}  // namespace rotary::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ROTARY_CPU_APPLY_INL_H_
