// Exact on-the-fly angles, vectorised: per-target code from apply-inl.h.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/angles.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "src/cpu/apply-inl.h"

HWY_BEFORE_NAMESPACE();
namespace rotary::detail::HWY_NAMESPACE {
void CosSinRow(double position, const double* pair_position, const double* inv_freq, int64_t pairs,
               double factor, double* cos_out, double* sin_out) {
  CosSinRowImpl(position, pair_position, inv_freq, pairs, factor, cos_out, sin_out);
}
void CosSinRowF32(double position, const double* pair_position, const double* inv_freq,
                  int64_t pairs, double factor, float sign, float* cos_out, float* sin_out) {
  CosSinRowF32Impl(position, pair_position, inv_freq, pairs, factor, sign, cos_out, sin_out);
}
// This target's name: what dispatched_target() returns from the target the dispatch picks.
const char* TargetNameOfThisTarget() { return hwy::TargetName(HWY_TARGET); }
}  // namespace rotary::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary::detail {
HWY_EXPORT(CosSinRow);
HWY_EXPORT(CosSinRowF32);
HWY_EXPORT(TargetNameOfThisTarget);
const char* dispatched_target() { return HWY_DYNAMIC_DISPATCH(TargetNameOfThisTarget)(); }
void cos_sin_row(double position, const double* pair_position, const double* inv_freq,
                 int64_t pairs, double factor, double* cos_out, double* sin_out) {
  HWY_DYNAMIC_DISPATCH(CosSinRow)(position, pair_position, inv_freq, pairs, factor, cos_out, sin_out);
}
void cos_sin_row_f32(double position, const double* pair_position, const double* inv_freq,
                     int64_t pairs, double factor, float sign, float* cos_out, float* sin_out) {
  HWY_DYNAMIC_DISPATCH(CosSinRowF32)(position, pair_position, inv_freq, pairs, factor, sign, cos_out,
                                     sin_out);
}
}  // namespace rotary::detail
#endif
