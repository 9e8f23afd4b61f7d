// The fused operations' norm rows (src/fused/cpu_rows.cpp) compiled once per Highway target and
// dispatched at run time: plain loops over the body's own scalar steps (src/fused/body.hpp:
// square_add, norm_factor, the rounding points of normalise), which each target's compiler
// vectorises as wide as it can. No step is reassociated (-ffp-contract=off, no fast-math): every
// target gives the body's bits (tests/test_fused.cpp, FusedRowsTargets).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/norm_rows.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "src/cpu/cpu.hpp"
#include "src/fused/body.hpp"

HWY_BEFORE_NAMESPACE();
namespace rotary::detail::HWY_NAMESPACE {
namespace {

#if HWY_TARGET != HWY_SCALAR
namespace hn = hwy::HWY_NAMESPACE;
using DD = hn::ScalableTag<double>;
using VD = hn::Vec<DD>;
constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(DD()));

// Channels [c, c + kLanes) of one contiguous head row as doubles: the values Storage<T>::load gives
// (f32 widened; bf16 its bits above sixteen zero bits, as bf16_to_f32), each exact in double.
template <class T>
HWY_INLINE VD LoadAsDouble(const void* row, int64_t c) {
  const DD dd;
  const hn::Rebind<float, DD> df;
  if constexpr (std::is_same_v<T, float>) {
    return hn::PromoteTo(dd, hn::LoadU(df, static_cast<const float*>(row) + c));
  } else {
    const hn::Rebind<uint16_t, DD> d16;
    const hn::Rebind<uint32_t, DD> d32;
    const auto wide = hn::PromoteTo(d32, hn::LoadU(d16, static_cast<const uint16_t*>(row) + c));
    return hn::PromoteTo(dd, hn::BitCast(df, hn::ShiftLeft<16>(wide)));
  }
}

// r[i] lane j becomes r[j] lane i. Each round pairs rows 2i and 2i+1 and splits their even and odd
// lanes (a perfect unshuffle): it rotates the bits of an element's (row | lane) address right by
// one, so log2(kLanes) rounds swap row and lane.
HWY_INLINE void Transpose(VD (&r)[kLanes]) {
  const DD dd;
  for (int64_t round = 1; round < kLanes; round *= 2) {
    VD t[kLanes];
    for (int64_t i = 0; i < kLanes / 2; ++i) {
      t[i] = hn::ConcatEven(dd, r[2 * i + 1], r[2 * i]);
      t[i + kLanes / 2] = hn::ConcatOdd(dd, r[2 * i + 1], r[2 * i]);
    }
    for (int64_t i = 0; i < kLanes; ++i) r[i] = t[i];
  }
}

// The sums of squares of heads [h0, h0 + kGroups * kLanes), each in channel order as square_add
// takes them, lane g of a vector holding head g of its group: per block of kLanes channels the
// rows are transposed so that one vector holds one channel of kLanes heads, and each lane's sum
// takes the block's channels one after another (a multiply, then an add: the body's two roundings;
// -ffp-contract=off keeps them apart). kGroups independent chains hide the add's latency.
template <class T, int kGroups>
void SumSquaresTransposed(const void* base, int64_t head_stride, int64_t h0, int64_t n, double* sums) {
  const DD dd;
  using Bits = typename Storage<T>::Bits;
  const auto row = [&](int64_t h) { return static_cast<const Bits*>(base) + h * head_stride; };
  VD sum[kGroups];
  for (int g = 0; g < kGroups; ++g) sum[g] = hn::Zero(dd);
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int g = 0; g < kGroups; ++g) {
      VD r[kLanes];
      for (int64_t i = 0; i < kLanes; ++i) r[i] = LoadAsDouble<T>(row(h0 + g * kLanes + i), c);
      Transpose(r);
      for (int64_t j = 0; j < kLanes; ++j) sum[g] = hn::Add(sum[g], hn::Mul(r[j], r[j]));
    }
  }
  for (int g = 0; g < kGroups; ++g) hn::StoreU(sum[g], dd, sums + g * kLanes);
  for (int64_t i = 0; i < kGroups * kLanes; ++i) {  // the channels after the last whole block
    for (int64_t t = c; t < n; ++t) sums[i] = square_add(sums[i], Storage<T>::load(row(h0 + i), t));
  }
}

// Head scope, channels contiguous: the factors of heads [0, done), by transposed blocks; returns done.
template <class T>
int64_t NormFactorsTransposed(const void* base, int64_t head_stride, int64_t heads, int64_t n, float eps, float* r) {
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, BF16>) {
    return 0;  // f16: the loop below
  } else {
    // kLanes is the most lanes a vector may have; a scalable target (SVE, RVV) may have fewer: the
    // loop below then.
    if (kLanes < 2 || n < kLanes || static_cast<int64_t>(hn::Lanes(DD())) != kLanes) return 0;
    double sums[4 * kLanes];
    int64_t h = 0;
    const auto finish = [&](int64_t count) {
      for (int64_t i = 0; i < count; ++i) r[h + i] = norm_factor(sums[i], n, eps);
      h += count;
    };
    for (; h + 4 * kLanes <= heads;) {
      SumSquaresTransposed<T, 4>(base, head_stride, h, n, sums);
      finish(4 * kLanes);
    }
    if (h + 2 * kLanes <= heads) {
      SumSquaresTransposed<T, 2>(base, head_stride, h, n, sums);
      finish(2 * kLanes);
    }
    if (h + kLanes <= heads) {
      SumSquaresTransposed<T, 1>(base, head_stride, h, n, sums);
      finish(kLanes);
    }
    return h;
  }
}
#endif  // HWY_TARGET != HWY_SCALAR

template <class T>
void NormFactorsImpl(const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n, bool all_heads,
                     float eps, float* r) {
  int64_t first = 0;  // heads before `first` done by the transposed blocks
#if HWY_TARGET != HWY_SCALAR
  if (!all_heads && stride == 1) first = NormFactorsTransposed<T>(base, head_stride, heads, n, eps, r);
#endif
  if (all_heads) {
    double sum = 0;
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t c = 0; c < n; ++c) sum = square_add(sum, Storage<T>::load(base, h * head_stride + c * stride));
    }
    r[0] = norm_factor(sum, heads * n, eps);
    return;
  }
  // Eight heads side by side, each summed in channel order (independent chains: the order of each
  // sum is the body's).
  constexpr int64_t kSide = 8;
  int64_t h = first;
  for (; h + kSide <= heads; h += kSide) {
    double sum[kSide] = {};
    for (int64_t c = 0; c < n; ++c) {
      for (int64_t g = 0; g < kSide; ++g) {
        sum[g] = square_add(sum[g], Storage<T>::load(base, (h + g) * head_stride + c * stride));
      }
    }
    for (int64_t g = 0; g < kSide; ++g) r[h + g] = norm_factor(sum[g], n, eps);
  }
  for (; h < heads; ++h) {
    double sum = 0;
    for (int64_t c = 0; c < n; ++c) sum = square_add(sum, Storage<T>::load(base, h * head_stride + c * stride));
    r[h] = norm_factor(sum, n, eps);
  }
}

// One row: kWeight false: fl_T(x r); gemma: fl_T(x r w); llama: fl_T(fl_T(x r) w).
template <class T, bool kWeight, bool kGemma, bool kUnit>
void NormaliseRow(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, float r, const float* w,
                  int64_t n) {
  const int64_t si = kUnit ? 1 : src_stride;
  const int64_t di = kUnit ? 1 : dst_stride;
  for (int64_t c = 0; c < n; ++c) {
    const float y = mul_rn(Storage<T>::load(src, c * si), r);
    float out;
    if constexpr (!kWeight) {
      out = y;
    } else if constexpr (kGemma) {
      out = mul_rn(y, w[c]);
    } else {
      out = mul_rn(round_to<T>(y), w[c]);
    }
    Storage<T>::store(dst, c * di, out);
  }
}

template <class T, bool kWeight, bool kGemma>
void NormaliseRowAnyStride(const NormRow& row) {
  if (row.src_stride == 1 && row.dst_stride == 1) {
    NormaliseRow<T, kWeight, kGemma, true>(row.src, 1, row.dst, 1, row.r, row.w, row.n);
  } else {
    NormaliseRow<T, kWeight, kGemma, false>(row.src, row.src_stride, row.dst, row.dst_stride, row.r, row.w, row.n);
  }
}

template <class T>
void NormaliseRowImpl(const NormRow& row) {
  if (row.w == nullptr) {
    NormaliseRowAnyStride<T, false, false>(row);
  } else if (row.gemma) {
    NormaliseRowAnyStride<T, true, true>(row);
  } else {
    NormaliseRowAnyStride<T, true, false>(row);
  }
}

}  // namespace

void NormFactorsF32(const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n, bool all_heads,
                    float eps, float* r) {
  NormFactorsImpl<float>(base, head_stride, stride, heads, n, all_heads, eps, r);
}
void NormFactorsF16(const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n, bool all_heads,
                    float eps, float* r) {
  NormFactorsImpl<F16>(base, head_stride, stride, heads, n, all_heads, eps, r);
}
void NormFactorsBF16(const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n, bool all_heads,
                     float eps, float* r) {
  NormFactorsImpl<BF16>(base, head_stride, stride, heads, n, all_heads, eps, r);
}
void NormaliseRowF32(const NormRow& row) { NormaliseRowImpl<float>(row); }
void NormaliseRowF16(const NormRow& row) { NormaliseRowImpl<F16>(row); }
void NormaliseRowBF16(const NormRow& row) { NormaliseRowImpl<BF16>(row); }

}  // namespace rotary::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary::detail {
HWY_EXPORT(NormFactorsF32);
HWY_EXPORT(NormFactorsF16);
HWY_EXPORT(NormFactorsBF16);
HWY_EXPORT(NormaliseRowF32);
HWY_EXPORT(NormaliseRowF16);
HWY_EXPORT(NormaliseRowBF16);

void norm_factors(DType dtype, const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n,
                  bool all_heads, float eps, float* r) {
  switch (dtype) {
    case DType::f16: HWY_DYNAMIC_DISPATCH(NormFactorsF16)(base, head_stride, stride, heads, n, all_heads, eps, r); break;
    case DType::bf16: HWY_DYNAMIC_DISPATCH(NormFactorsBF16)(base, head_stride, stride, heads, n, all_heads, eps, r); break;
    default: HWY_DYNAMIC_DISPATCH(NormFactorsF32)(base, head_stride, stride, heads, n, all_heads, eps, r); break;
  }
}

void normalise_row(DType dtype, const NormRow& row) {
  switch (dtype) {
    case DType::f16: HWY_DYNAMIC_DISPATCH(NormaliseRowF16)(row); break;
    case DType::bf16: HWY_DYNAMIC_DISPATCH(NormaliseRowBF16)(row); break;
    default: HWY_DYNAMIC_DISPATCH(NormaliseRowF32)(row); break;
  }
}
}  // namespace rotary::detail
#endif
