// Per-target RoPE kernels (Highway). Included once per target by foreach_target.h from the
// per-dtype .cc files. Dtype only at the edges: load and widen to double, rotate, narrow once.
#if defined(ROTARY_CPU_APPLY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ROTARY_CPU_APPLY_INL_H_
#undef ROTARY_CPU_APPLY_INL_H_
#else
#define ROTARY_CPU_APPLY_INL_H_
#endif

#include <cmath>
#include <cstring>

#include "hwy/highway.h"
#include "rotary/angle.hpp"
#include "src/cpu/cpu.hpp"
#include "src/half.hpp"

HWY_BEFORE_NAMESPACE();
namespace rotary::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<double>;
using V = hn::Vec<D>;

struct F32Tag {};
struct F16Tag {};
struct BF16Tag {};

// ---- edges: storage <-> double, one rounding at the store (to float, then to 16 bits) ----
// Conversions run at full float width (2N lanes): widen once, split into two double halves,
// rotate, demote both halves to float, join, narrow once.

// Scalar edges (every target): the same conversions as detail::, one rounding at the store.
template <class Tag>
struct ScalarIo;
template <>
struct ScalarIo<F32Tag> {
  static double Load(const float* p) { return *p; }
  static void Store(double v, float* p) { *p = static_cast<float>(v); }
};
template <>
struct ScalarIo<BF16Tag> {
  static double Load(const uint16_t* p) { return bf16_to_f32(*p); }
  static void Store(double v, uint16_t* p) { *p = f32_to_bf16(static_cast<float>(v)); }
};
template <>
struct ScalarIo<F16Tag> {
  static double Load(const uint16_t* p) { return f16_to_f32(*p); }
  static void Store(double v, uint16_t* p) { *p = f32_to_f16(static_cast<float>(v)); }
};
template <class Tag>
struct StorageOf {
  using type = uint16_t;
};
template <>
struct StorageOf<F32Tag> {
  using type = float;
};

#if HWY_TARGET != HWY_SCALAR
using DFF = hn::Repartition<float, D>;  // full float vector: 2N lanes
using DFH = hn::Half<DFF>;              // N floats
using DUF = hn::RebindToUnsigned<DFF>;
using DIF = hn::RebindToSigned<DFF>;
using DU16F = hn::Rebind<uint16_t, DFF>;

template <class Tag>
struct Io;

template <>
struct Io<F32Tag> {
  static hn::Vec<DFF> Load(const float* p) { return hn::LoadU(DFF(), p); }
  static void Store(hn::Vec<DFF> v, float* p) { hn::StoreU(v, DFF(), p); }
};

// float32 bits -> bfloat16 bits, nearest even (Highway 1.0.3's DemoteTo truncates).
HWY_INLINE hn::Vec<DUF> Bf16Bits(hn::Vec<DFF> f) {
  const DUF du;
  const auto u = hn::BitCast(du, f);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), lsb)));
  const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
  return hn::IfThenElse(hn::RebindMask(du, hn::Ne(f, f)), quiet, rounded);  // NaN: quiet it
}

// float32 bits -> binary16 bits, nearest even, subnormals included (the emulated DemoteTo
// truncates). Mirrors detail::f32_to_f16.
HWY_INLINE hn::Vec<DUF> F16Bits(hn::Vec<DFF> f) {
  const DUF du;
  const DIF di;
  const DFF df;
  const auto u = hn::BitCast(du, f);
  const auto sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u));
  const auto a = hn::And(u, hn::Set(du, 0x7fffffffu));
  const auto lsb = hn::And(hn::ShiftRight<13>(a), hn::Set(du, 1u));
  const auto normal = hn::ShiftRight<13>(
      hn::Sub(hn::Add(a, hn::Add(hn::Set(du, 0xfffu), lsb)), hn::Set(du, 112u << 23)));
  const auto ai = hn::BitCast(di, a);  // a < 2^31: signed comparisons are exact
  // Below 2^-14: m * 2^-24 with m = rint(|f| * 2^24); the scaling is exact.
  const auto small = hn::RebindMask(du, hn::Lt(ai, hn::Set(di, 0x38800000)));
  const auto scaled = hn::Mul(hn::BitCast(df, hn::IfThenElseZero(small, a)), hn::Set(df, 0x1p24f));
  const auto sub = hn::BitCast(du, hn::NearestInt(scaled));
  const auto nan = hn::Or(hn::Set(du, 0x7e00u), hn::And(hn::ShiftRight<13>(a), hn::Set(du, 0x3ffu)));
  auto bits = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x38800000 - 1))), normal, sub);
  bits = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x477ff000 - 1))), hn::Set(du, 0x7c00u), bits);
  bits = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x7f800000))), nan, bits);
  return hn::Or(bits, sign);
}

// binary16 bits (in u32 lanes) -> float32, exact. Mirrors detail::f16_to_f32.
HWY_INLINE hn::Vec<DFF> F16ToF32(hn::Vec<DUF> h) {
  const DUF du;
  const DIF di;
  const DFF df;
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const auto exponent = hn::And(hn::ShiftRight<10>(h), hn::Set(du, 0x1fu));
  const auto mantissa = hn::And(h, hn::Set(du, 0x3ffu));
  const auto normal = hn::Or(hn::ShiftLeft<23>(hn::Add(exponent, hn::Set(du, 112u))),
                             hn::ShiftLeft<13>(mantissa));
  const auto special = hn::Or(hn::Set(du, 0x7f800000u), hn::ShiftLeft<13>(mantissa));
  const auto tiny = hn::BitCast(du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, mantissa)),
                                            hn::Set(df, 0x1p-24f)));
  auto bits = hn::IfThenElse(hn::Eq(exponent, hn::Zero(du)), tiny, normal);
  bits = hn::IfThenElse(hn::Eq(exponent, hn::Set(du, 0x1fu)), special, bits);
  return hn::BitCast(df, hn::Or(bits, sign));
}

HWY_INLINE void StoreBits16(hn::Vec<DUF> bits, uint16_t* p) {
  hn::StoreU(hn::DemoteTo(DU16F(), hn::BitCast(DIF(), bits)), DU16F(), p);
}

template <>
struct Io<BF16Tag> {
  static hn::Vec<DFF> Load(const uint16_t* p) {
    return hn::BitCast(DFF(), hn::ShiftLeft<16>(hn::PromoteTo(DUF(), hn::LoadU(DU16F(), p))));
  }
  static void Store(hn::Vec<DFF> v, uint16_t* p) { StoreBits16(Bf16Bits(v), p); }
};

template <>
struct Io<F16Tag> {
  static hn::Vec<DFF> Load(const uint16_t* p) {
    return F16ToF32(hn::PromoteTo(DUF(), hn::LoadU(DU16F(), p)));
  }
  static void Store(hn::Vec<DFF> v, uint16_t* p) { StoreBits16(F16Bits(v), p); }
};

HWY_INLINE V Lower(hn::Vec<DFF> v) { return hn::PromoteTo(D(), hn::LowerHalf(DFH(), v)); }
HWY_INLINE V Upper(hn::Vec<DFF> v) { return hn::PromoteTo(D(), hn::UpperHalf(DFH(), v)); }
HWY_INLINE hn::Vec<DFF> Join(V lower, V upper) {
  return hn::Combine(DFF(), hn::DemoteTo(DFH(), upper), hn::DemoteTo(DFH(), lower));
}
#endif  // HWY_TARGET != HWY_SCALAR

// ---- the rotation ----
// a' = a c - b s and b' = a s + b c, each with one fused multiply-add (MulSub/MulAdd: fused on
// FMA targets, mul + add elsewhere). With a Table both products are exact in double, so either
// way the double result is the correctly rounded a c - b s, as in the reference.

// Scalar pairs [first, last), the same operations (std::fma where the target fuses).
template <class Tag, class T>
HWY_INLINE void RotateScalar(const T* in, T* out, const RowArgs& args, int64_t first, int64_t last) {
  const int64_t h = args.rotary_dim / 2;
  for (int64_t i = first; i < last; ++i) {
    const int64_t ia = args.interleaved ? 2 * i : i;
    const int64_t ib = args.interleaved ? 2 * i + 1 : i + h;
    const double c = args.interleaved ? args.c[2 * i] : args.c[i];
    const double s = args.interleaved ? args.c[2 * i + 1] : args.s[i];
    const double a = ScalarIo<Tag>::Load(in + ia);
    const double b = ScalarIo<Tag>::Load(in + ib);
#if HWY_NATIVE_FMA
    ScalarIo<Tag>::Store(std::fma(a, c, -(b * s)), out + ia);
    ScalarIo<Tag>::Store(std::fma(a, s, b * c), out + ib);
#else
    ScalarIo<Tag>::Store(a * c - b * s, out + ia);
    ScalarIo<Tag>::Store(a * s + b * c, out + ib);
#endif
  }
}

template <class Tag>
void RotateHeads(const RowArgs& args) {
  using T = typename StorageOf<Tag>::type;
  const D d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));  // doubles per vector; 2N floats
  const int64_t h = args.rotary_dim / 2;
  const auto* in_base = static_cast<const T*>(args.in);
  auto* out_base = static_cast<T*>(args.out);
  for (int64_t head = 0; head < args.heads; ++head) {
    const T* in = in_base + head * args.in_head_stride;
    T* out = out_base + head * args.out_head_stride;
    int64_t done = 0;  // pairs rotated by the vector body
#if HWY_TARGET != HWY_SCALAR
    if (args.interleaved) {
      // x = [a0 b0 a1 b1 ..]: even lanes a c + b (-s), odd lanes a s + b c.
      for (int64_t j = 0; j + 2 * N <= args.rotary_dim; j += 2 * N) {
        const auto x = Io<Tag>::Load(in + j);
        const V lo = Lower(x);
        const V hi = Upper(x);
        const V y_lo = hn::MulAdd(hn::DupEven(lo), hn::LoadU(d, args.c + j),
                                  hn::Mul(hn::DupOdd(lo), hn::LoadU(d, args.s + j)));
        const V y_hi = hn::MulAdd(hn::DupEven(hi), hn::LoadU(d, args.c + j + N),
                                  hn::Mul(hn::DupOdd(hi), hn::LoadU(d, args.s + j + N)));
        Io<Tag>::Store(Join(y_lo, y_hi), out + j);
        done = (j + 2 * N) / 2;
      }
    } else {
      for (int64_t i = 0; i + 2 * N <= h; i += 2 * N) {
        const auto a = Io<Tag>::Load(in + i);
        const auto b = Io<Tag>::Load(in + h + i);
        const V a_lo = Lower(a), a_hi = Upper(a), b_lo = Lower(b), b_hi = Upper(b);
        const V c_lo = hn::LoadU(d, args.c + i), c_hi = hn::LoadU(d, args.c + i + N);
        const V s_lo = hn::LoadU(d, args.s + i), s_hi = hn::LoadU(d, args.s + i + N);
        Io<Tag>::Store(Join(hn::MulSub(a_lo, c_lo, hn::Mul(b_lo, s_lo)),
                            hn::MulSub(a_hi, c_hi, hn::Mul(b_hi, s_hi))),
                       out + i);
        Io<Tag>::Store(Join(hn::MulAdd(a_lo, s_lo, hn::Mul(b_lo, c_lo)),
                            hn::MulAdd(a_hi, s_hi, hn::Mul(b_hi, c_hi))),
                       out + h + i);
        done = i + 2 * N;
      }
    }
#endif
    (void)N;
    RotateScalar<Tag>(in, out, args, done, h);
    if (args.copy_tail && args.head_dim > args.rotary_dim) {
      std::memcpy(out + args.rotary_dim, in + args.rotary_dim,
                  static_cast<size_t>(args.head_dim - args.rotary_dim) * sizeof(T));
    }
  }
}

// ---- exact angles, vectorised ----

#if HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR
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

HWY_INLINE DD AddDD(DD x, V b) {
  DD s = TwoSum(x.hi, b);
  s.lo = hn::Add(s.lo, x.lo);
  return TwoSum(s.hi, s.lo);
}

// cos, sin of p * f for N lanes of f. Same algorithm as rotary::exact_cos_sin, with libm's
// sin/cos of the reduced angle replaced by Taylor polynomials (|r| <= π/4 + tiny: the first
// omitted terms are below 2^-62 relative).
HWY_INLINE void CosSinLanes(V p, V f, V& cos_out, V& sin_out) {
  const D d;
  const V x_hi = hn::Mul(p, f);
  const V x_lo = hn::MulSub(p, f, x_hi);  // exact remainder of the product (fused)
  const V k = hn::Round(hn::Mul(x_hi, hn::Set(d, 0x1.45f306dc9c883p-1)));
  const V pio2_hi = hn::Set(d, 0x1.921fb54442d18p+0);
  const V pio2_mid = hn::Set(d, 0x1.1a62633145c07p-54);
  const V pio2_lo = hn::Set(d, -0x1.f1976b7ed8fbcp-110);
  const V k_hi = hn::Mul(k, pio2_hi);
  const V k_hi_lo = hn::MulSub(k, pio2_hi, k_hi);
  const V k_mid = hn::Mul(k, pio2_mid);
  const V k_mid_lo = hn::MulSub(k, pio2_mid, k_mid);
  DD r = TwoSum(x_hi, hn::Neg(k_hi));
  r = AddDD(r, x_lo);
  r = AddDD(r, hn::Neg(k_hi_lo));
  r = AddDD(r, hn::Neg(k_mid));
  r = AddDD(r, hn::Neg(k_mid_lo));
  r = AddDD(r, hn::Neg(hn::Mul(k, pio2_lo)));
  const V r2 = hn::Mul(r.hi, r.hi);
  // sin r = r (1 - r^2/3! + r^4/5! - ... - r^16/17!)
  V ps = hn::Set(d, 1.0 / 355687428096000.0);  // 1/17!
  ps = hn::MulAdd(ps, r2, hn::Set(d, -1.0 / 1307674368000.0));
  ps = hn::MulAdd(ps, r2, hn::Set(d, 1.0 / 6227020800.0));
  ps = hn::MulAdd(ps, r2, hn::Set(d, -1.0 / 39916800.0));
  ps = hn::MulAdd(ps, r2, hn::Set(d, 1.0 / 362880.0));
  ps = hn::MulAdd(ps, r2, hn::Set(d, -1.0 / 5040.0));
  ps = hn::MulAdd(ps, r2, hn::Set(d, 1.0 / 120.0));
  ps = hn::MulAdd(ps, r2, hn::Set(d, -1.0 / 6.0));
  const V s = hn::MulAdd(hn::Mul(ps, r2), r.hi, r.hi);
  // cos r = 1 - r^2/2! + r^4/4! - ... + r^16/16!
  V pc = hn::Set(d, 1.0 / 20922789888000.0);  // 1/16!
  pc = hn::MulAdd(pc, r2, hn::Set(d, -1.0 / 87178291200.0));
  pc = hn::MulAdd(pc, r2, hn::Set(d, 1.0 / 479001600.0));
  pc = hn::MulAdd(pc, r2, hn::Set(d, -1.0 / 3628800.0));
  pc = hn::MulAdd(pc, r2, hn::Set(d, 1.0 / 40320.0));
  pc = hn::MulAdd(pc, r2, hn::Set(d, -1.0 / 720.0));
  pc = hn::MulAdd(pc, r2, hn::Set(d, 1.0 / 24.0));
  pc = hn::MulAdd(pc, r2, hn::Set(d, -0.5));
  const V c = hn::MulAdd(pc, r2, hn::Set(d, 1.0));
  // r_lo correction, first order.
  const V sin_r = hn::MulAdd(r.lo, c, s);
  const V cos_r = hn::NegMulAdd(r.lo, s, c);
  // Quadrant q = k mod 4 (k is an exact integer below 2^53).
  const V q = hn::Sub(k, hn::Mul(hn::Floor(hn::Mul(k, hn::Set(d, 0.25))), hn::Set(d, 4.0)));
  const auto odd = hn::Or(hn::Eq(q, hn::Set(d, 1.0)), hn::Eq(q, hn::Set(d, 3.0)));
  const V base_c = hn::IfThenElse(odd, sin_r, cos_r);
  const V base_s = hn::IfThenElse(odd, cos_r, sin_r);
  const auto negate_c = hn::Or(hn::Eq(q, hn::Set(d, 1.0)), hn::Eq(q, hn::Set(d, 2.0)));
  const auto negate_s = hn::Ge(q, hn::Set(d, 2.0));
  cos_out = hn::IfThenElse(negate_c, hn::Neg(base_c), base_c);
  sin_out = hn::IfThenElse(negate_s, hn::Neg(base_s), base_s);
}
#endif

inline void CosSinRowImpl(int64_t position, const double* inv_freq, int64_t pairs, double factor,
               double* cos_out, double* sin_out) {
#if HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR
  const D d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const V p = hn::Set(d, static_cast<double>(position));
  const V g = hn::Set(d, factor);
  int64_t i = 0;
  for (; i + N <= pairs; i += N) {
    V c, s;
    CosSinLanes(p, hn::LoadU(d, inv_freq + i), c, s);
    hn::StoreU(hn::Mul(c, g), d, cos_out + i);
    hn::StoreU(hn::Mul(s, g), d, sin_out + i);
  }
  if (i < pairs) {  // the tail through the same vector code, padded
    constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(double);
    HWY_ALIGN double f[kMaxLanes] = {};
    HWY_ALIGN double c_tail[kMaxLanes];
    HWY_ALIGN double s_tail[kMaxLanes];
    for (int64_t j = 0; j < N; ++j) f[j] = i + j < pairs ? inv_freq[i + j] : 1.0;
    V c, s;
    CosSinLanes(p, hn::Load(d, f), c, s);
    hn::Store(hn::Mul(c, g), d, c_tail);
    hn::Store(hn::Mul(s, g), d, s_tail);
    for (int64_t j = 0; i + j < pairs; ++j) {
      cos_out[i + j] = c_tail[j];
      sin_out[i + j] = s_tail[j];
    }
  }
#else
  for (int64_t i = 0; i < pairs; ++i) {
    const CosSin cs = exact_cos_sin(position, inv_freq[i]);
    cos_out[i] = cs.cos * factor;
    sin_out[i] = cs.sin * factor;
  }
#endif
}

}  // namespace rotary::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ROTARY_CPU_APPLY_INL_H_
