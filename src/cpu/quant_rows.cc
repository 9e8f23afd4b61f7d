// The fused operations' quantised cache rows (src/fused/cpu_rows.cpp) compiled once per Highway
// target and dispatched at run time: a contiguous row of f32, f16 or bf16 values scaled (one IEEE
// division or product, math/quant.hpp's scale_for_code) and encoded as fp8 e4m3, fp8 e5m2 or int8
// codes, lane by lane the steps of float_to_fp8 and float_to_i8: the same codes (quant.hpp's are
// checked against an oracle; these against quant.hpp in tests/test_fused.cpp, every target).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/quant_rows.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "src/cpu/cpu.hpp"
#include "src/kernel/storage.hpp"
#include "src/math/quant.hpp"

HWY_BEFORE_NAMESPACE();
namespace rotary::detail::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;

// Values [i, i + lanes) of a contiguous row as floats: Storage<T>::load's values.
template <class T>
HWY_INLINE VF LoadValues(const void* src, int64_t i) {
  const DF df;
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, static_cast<const float*>(src) + i);
  } else if constexpr (std::is_same_v<T, BF16>) {  // the bits above sixteen zero bits (bf16_to_f32)
    const hn::RebindToUnsigned<DF> du;
    const hn::Rebind<uint16_t, DF> d16;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, static_cast<const uint16_t*>(src) + i))));
  } else {  // f16: the scalar decoder (exact), a vector's worth at a time
    HWY_ALIGN float values[hn::MaxLanes(DF())];
    for (size_t l = 0; l < hn::Lanes(df); ++l) values[l] = Storage<F16>::load(src, i + static_cast<int64_t>(l));
    return hn::Load(df, values);
  }
}

// float_to_fp8 lane by lane: the magnitude saturated as bits (NaN and infinity lie above max's),
// the quantum's binade (at least the normal range's lowest), the exact quotient by the quantum
// rounded to the nearest integer (ties to even: Round), the code ((e + bias - 1) << m) + n capped
// at max, NaN last, the sign. Magnitudes are below 2^31: signed lanes compare them.
template <int kMantissa, int kBias>
HWY_INLINE VI EncodeFp8(VF x, const Fp8Format& f) {
  const DF df;
  const DI di;
  const VI bits = hn::BitCast(di, x);
  const VI sign = hn::And(hn::ShiftRight<24>(bits), hn::Set(di, 0x80));  // arithmetic shift: the low byte's top bit
  const VI magnitude = hn::And(bits, hn::Set(di, 0x7fffffff));
  const VI a = hn::Min(magnitude, hn::Set(di, static_cast<int32_t>(float_bits(f.max_value))));
  const VI e = hn::Max(hn::Sub(hn::ShiftRight<23>(a), hn::Set(di, 127)), hn::Set(di, 1 - kBias));
  const VF inverse_quantum = hn::BitCast(df, hn::ShiftLeft<23>(hn::Sub(hn::Set(di, kMantissa + 127), e)));
  const VI n = hn::ConvertTo(di, hn::Round(hn::Mul(hn::BitCast(df, a), inverse_quantum)));
  VI code = hn::Add(hn::ShiftLeft<kMantissa>(hn::Add(e, hn::Set(di, kBias - 1))), n);
  code = hn::Min(code, hn::Set(di, f.max_code));
  code = hn::IfThenElse(hn::Gt(magnitude, hn::Set(di, 0x7f800000)), hn::Set(di, f.nan_code), code);
  return hn::Or(code, sign);
}

// float_to_i8 lane by lane: |x| capped at 127 (127.5 and above saturate; below, nearest with ties
// to even never passes 127), the sign, NaN as 0.
HWY_INLINE VI EncodeI8(VF x) {
  const DF df;
  const DI di;
  const VI n = hn::ConvertTo(di, hn::Round(hn::Min(hn::Abs(x), hn::Set(df, 127.0f))));
  const VI value = hn::IfThenElse(hn::RebindMask(di, hn::Lt(x, hn::Zero(df))), hn::Neg(n), n);
  return hn::IfThenZeroElse(hn::RebindMask(di, hn::IsNaN(x)), value);
}

template <class T, DType kCode, bool kDivide>
void QuantiseRowAs(const void* src, uint8_t* dst, int64_t n, float scale) {
  const DF df;
  const hn::Rebind<uint8_t, DI> d8u;
  const hn::Rebind<int8_t, DI> d8s;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const VF s = hn::Set(df, scale);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const VF v = LoadValues<T>(src, i);
    const VF x = kDivide ? hn::Div(v, s) : hn::Mul(v, s);
    if constexpr (kCode == DType::i8) {
      hn::StoreU(hn::DemoteTo(d8s, EncodeI8(x)), d8s, reinterpret_cast<int8_t*>(dst) + i);
    } else if constexpr (kCode == DType::fp8_e4m3) {
      hn::StoreU(hn::DemoteTo(d8u, EncodeFp8<3, 7>(x, kE4M3)), d8u, dst + i);
    } else {
      hn::StoreU(hn::DemoteTo(d8u, EncodeFp8<2, 15>(x, kE5M2)), d8u, dst + i);
    }
  }
  for (; i < n; ++i) {  // the tail: quant.hpp's own steps
    const float v = Storage<T>::load(src, i);
    const float x = kDivide ? div_rn(v, scale) : mul_rn(v, scale);
    if constexpr (kCode == DType::i8) {
      dst[i] = static_cast<uint8_t>(float_to_i8(x));
    } else {
      dst[i] = float_to_fp8(x, kCode == DType::fp8_e4m3 ? kE4M3 : kE5M2);
    }
  }
}

template <class T, DType kCode>
void QuantiseRowCode(const void* src, uint8_t* dst, int64_t n, float scale, ScaleOp op) {
  if (op == ScaleOp::divide) {
    QuantiseRowAs<T, kCode, true>(src, dst, n, scale);
  } else {
    QuantiseRowAs<T, kCode, false>(src, dst, n, scale);
  }
}

template <class T>
void QuantiseRowImpl(const void* src, DType code, void* dst, int64_t n, float scale, ScaleOp op) {
  auto* out = static_cast<uint8_t*>(dst);
  switch (code) {
    case DType::fp8_e4m3: QuantiseRowCode<T, DType::fp8_e4m3>(src, out, n, scale, op); break;
    case DType::fp8_e5m2: QuantiseRowCode<T, DType::fp8_e5m2>(src, out, n, scale, op); break;
    default: QuantiseRowCode<T, DType::i8>(src, out, n, scale, op); break;
  }
}

}  // namespace

void QuantiseRowF32(const void* src, DType code, void* dst, int64_t n, float scale, ScaleOp op) {
  QuantiseRowImpl<float>(src, code, dst, n, scale, op);
}
void QuantiseRowF16(const void* src, DType code, void* dst, int64_t n, float scale, ScaleOp op) {
  QuantiseRowImpl<F16>(src, code, dst, n, scale, op);
}
void QuantiseRowBF16(const void* src, DType code, void* dst, int64_t n, float scale, ScaleOp op) {
  QuantiseRowImpl<BF16>(src, code, dst, n, scale, op);
}

}  // namespace rotary::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary::detail {
HWY_EXPORT(QuantiseRowF32);
HWY_EXPORT(QuantiseRowF16);
HWY_EXPORT(QuantiseRowBF16);

void quantise_row(DType data, const void* src, DType code, void* dst, int64_t n, float scale, ScaleOp op) {
  switch (data) {
    case DType::f16: HWY_DYNAMIC_DISPATCH(QuantiseRowF16)(src, code, dst, n, scale, op); break;
    case DType::bf16: HWY_DYNAMIC_DISPATCH(QuantiseRowBF16)(src, code, dst, n, scale, op); break;
    default: HWY_DYNAMIC_DISPATCH(QuantiseRowF32)(src, code, dst, n, scale, op); break;
  }
}
}  // namespace rotary::detail
#endif
