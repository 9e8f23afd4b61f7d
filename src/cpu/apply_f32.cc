// RoPE kernel for f32 storage: per-target code from apply-inl.h, dispatched at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/apply_f32.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "src/cpu/apply-inl.h"

HWY_BEFORE_NAMESPACE();
namespace rotary::detail::HWY_NAMESPACE {
void RotateHeadsF32(const RowArgs& args) { RotateHeads<F32Tag>(args); }
void PrepareLanesF32(const float* c, const float* s, int64_t pairs, bool interleaved, float* lanes) {
  PrepareLanesImpl<F32Tag>(c, s, pairs, interleaved, lanes);
}
}  // namespace rotary::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary::detail {
HWY_EXPORT(RotateHeadsF32);
HWY_EXPORT(PrepareLanesF32);
void rotate_heads_f32(const RowArgs& args) { HWY_DYNAMIC_DISPATCH(RotateHeadsF32)(args); }
void prepare_lanes_f32(const float* c, const float* s, int64_t pairs, bool interleaved, float* lanes) {
  HWY_DYNAMIC_DISPATCH(PrepareLanesF32)(c, s, pairs, interleaved, lanes);
}
}  // namespace rotary::detail
#endif
