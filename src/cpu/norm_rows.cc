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

template <class T>
void NormFactorsImpl(const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n, bool all_heads,
                     float eps, float* r) {
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
  int64_t h = 0;
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
