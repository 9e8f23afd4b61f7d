#include "rotary/angle.hpp"

#include "math/exact_angle.hpp"

namespace rotary {
namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__FMA__)
// Baseline x86-64 code has no FMA instruction: each of the 22 fused operations would be a call to
// libm's fma (1.4 times the time of the former sincos-based evaluation). Where the CPU has FMA,
// a copy compiled for it; fma is correctly rounded either way, so both copies give the same bits.
__attribute__((target("fma"))) CosSin product_with_fma(double position, double inv_freq) {
  return detail::cos_sin_of_product(position, inv_freq);
}
CosSin product(double position, double inv_freq) {
  static const bool has_fma = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("fma") != 0;
  }();
  return has_fma ? product_with_fma(position, inv_freq)
                 : detail::cos_sin_of_product(position, inv_freq);
}
#else
CosSin product(double position, double inv_freq) {
  return detail::cos_sin_of_product(position, inv_freq);
}
#endif

}  // namespace

CosSin exact_cos_sin(int64_t position, double inv_freq) {
  return product(static_cast<double>(position), inv_freq);  // exact: |position| < 2^53
}

CosSin exact_cos_sin_real(double position, double inv_freq) { return product(position, inv_freq); }

CosSin cos_sin_of(double angle) { return product(angle, 1.0); }

}  // namespace rotary
