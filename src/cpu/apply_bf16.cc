// RoPE kernel for bf16 storage: per-target code from apply-inl.h, dispatched at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/apply_bf16.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "src/cpu/apply-inl.h"

HWY_BEFORE_NAMESPACE();
namespace rotary::detail::HWY_NAMESPACE {
void RotateHeadsBF16(const RowArgs& args) { RotateHeads<BF16Tag>(args); }
void PrepareLanesBF16(const float* c, const float* s, int64_t pairs, bool interleaved, float* lanes) {
  PrepareLanesImpl<BF16Tag>(c, s, pairs, interleaved, lanes);
}
void PrepareNormWeightsBF16(const float* w, int64_t head_dim, int64_t rotary_offset, int64_t rotary_dim,
                            bool interleaved, float* out) {
  PrepareNormWeightsBf16Impl(w, head_dim, rotary_offset, rotary_dim, interleaved, out);
}
}  // namespace rotary::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary::detail {
HWY_EXPORT(RotateHeadsBF16);
HWY_EXPORT(PrepareLanesBF16);
HWY_EXPORT(PrepareNormWeightsBF16);
void rotate_heads_bf16(const RowArgs& args) { HWY_DYNAMIC_DISPATCH(RotateHeadsBF16)(args); }
void prepare_lanes_bf16(const float* c, const float* s, int64_t pairs, bool interleaved, float* lanes) {
  HWY_DYNAMIC_DISPATCH(PrepareLanesBF16)(c, s, pairs, interleaved, lanes);
}
void prepare_norm_weights_bf16(const float* w, int64_t head_dim, int64_t rotary_offset, int64_t rotary_dim,
                               bool interleaved, float* out) {
  HWY_DYNAMIC_DISPATCH(PrepareNormWeightsBF16)(w, head_dim, rotary_offset, rotary_dim, interleaved, out);
}
}  // namespace rotary::detail
#endif
