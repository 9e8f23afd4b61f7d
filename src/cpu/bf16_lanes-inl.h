// bfloat16 in u32 lanes, per Highway target: shared by apply's bf16 rows (apply-inl.h) and the
// fused norm rows (norm_rows.cc). Included once per target by foreach_target.h.
//
// On a little-endian machine element 2j of a bf16 array is the low half of u32 lane j and element
// 2j+1 the high half, so widening is a shift or a mask (no cross-lane moves), and narrowing rounds
// each float at bit 16 and packs the two halves with one Or:
//   memory  [e0 o0 e1 o1 ...]  ->  even = [e0 e1 ...] (f32), odd = [o0 o1 ...] (f32)
#if defined(ROTARY_CPU_BF16_LANES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ROTARY_CPU_BF16_LANES_INL_H_
#undef ROTARY_CPU_BF16_LANES_INL_H_
#else
#define ROTARY_CPU_BF16_LANES_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace rotary::detail::HWY_NAMESPACE {
#if HWY_TARGET != HWY_SCALAR
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the bfloat16 lane tricks below assume a little-endian target"
#endif
namespace bf16_lanes {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DU = hn::RebindToUnsigned<DF>;         // u32 lanes, one per float
using VU = hn::Vec<DU>;
using DU16 = hn::Repartition<uint16_t, DF>;  // the same bytes as 2L u16 lanes

HWY_INLINE VF Bf16Even(VU w) { return hn::BitCast(DF(), hn::ShiftLeft<16>(w)); }
HWY_INLINE VF Bf16Odd(VU w) { return hn::BitCast(DF(), hn::And(w, hn::Set(DU(), 0xffff0000u))); }
// The float's bf16 in the high half of its lane (the low half is not part of the result): float
// bits + 0x7fff + lsb, nearest even at bit 16 (a carry into the exponent gives inf, as it must).
// A NaN must not carry: kNanSafe keeps its top payload bits and makes it quiet, as
// detail::f32_to_bf16 does. Without kNanSafe, every NaN must have its low 16 bits zero, as the NaNs
// of bf16 inputs and of arithmetic on them and on computed angles do; a float32 NaN of the caller's
// (a weight, a cos/sin of its own) may have payload bits there and would carry into the sign.
template <bool kNanSafe = false>
HWY_INLINE VU RoundAtBit16(VF v) {
  const DU du;
  const VU u = hn::BitCast(du, v);
  const VU rounded = hn::Add(hn::Add(u, hn::Set(du, 0x7fffu)), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u)));
  if constexpr (kNanSafe) {
    return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), hn::Or(u, hn::Set(du, 0x00400000u)), rounded);
  } else {
    return rounded;
  }
}
// v rounded to bf16 and widened back (round_to<BF16> lane by lane).
template <bool kNanSafe = false>
HWY_INLINE VF RoundToBf16(VF v) {
  return hn::BitCast(DF(), hn::And(RoundAtBit16<kNanSafe>(v), hn::Set(DU(), 0xffff0000u)));
}
template <bool kNanSafe = false>
HWY_INLINE VU PackBf16(VF even, VF odd) {
  return hn::Or(hn::ShiftRight<16>(RoundAtBit16<kNanSafe>(even)),
                hn::And(RoundAtBit16<kNanSafe>(odd), hn::Set(DU(), 0xffff0000u)));
}
HWY_INLINE VU LoadBf16Words(const uint16_t* p) { return hn::BitCast(DU(), hn::LoadU(DU16(), p)); }
}  // namespace bf16_lanes
#endif  // HWY_TARGET != HWY_SCALAR
}  // namespace rotary::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
