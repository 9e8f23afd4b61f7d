// RoPE kernel for f16 storage: per-target code from apply-inl.h, dispatched at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/apply_f16.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "src/cpu/apply-inl.h"

HWY_BEFORE_NAMESPACE();
namespace rotary::detail::HWY_NAMESPACE {
void RotateHeadsF16(const RowArgs& args) { RotateHeads<F16Tag>(args); }
void PrepareLanesF16(const float* c, const float* s, int64_t pairs, bool interleaved, float* lanes) {
  PrepareLanesImpl<F16Tag>(c, s, pairs, interleaved, lanes);
}
}  // namespace rotary::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary::detail {
HWY_EXPORT(RotateHeadsF16);
HWY_EXPORT(PrepareLanesF16);
void rotate_heads_f16(const RowArgs& args) { HWY_DYNAMIC_DISPATCH(RotateHeadsF16)(args); }
void prepare_lanes_f16(const float* c, const float* s, int64_t pairs, bool interleaved, float* lanes) {
  HWY_DYNAMIC_DISPATCH(PrepareLanesF16)(c, s, pairs, interleaved, lanes);
}
}  // namespace rotary::detail
#endif
