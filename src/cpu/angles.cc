// Exact on-the-fly angles, vectorised: per-target code from apply-inl.h.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/angles.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "src/cpu/apply-inl.h"

HWY_BEFORE_NAMESPACE();
namespace rotary::detail::HWY_NAMESPACE {
void CosSinRow(int64_t position, const double* inv_freq, int64_t pairs, double factor,
               double* cos_out, double* sin_out) {
  CosSinRowImpl(position, inv_freq, pairs, factor, cos_out, sin_out);
}
}  // namespace rotary::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary::detail {
HWY_EXPORT(CosSinRow);
void cos_sin_row(int64_t position, const double* inv_freq, int64_t pairs, double factor,
                 double* cos_out, double* sin_out) {
  HWY_DYNAMIC_DISPATCH(CosSinRow)(position, inv_freq, pairs, factor, cos_out, sin_out);
}
}  // namespace rotary::detail
#endif
