#include "rotary/angle.hpp"

#include <cmath>

namespace rotary {
namespace {

// π/2 = kPio2Hi + kPio2Mid + kPio2Lo + O(2^-164).
constexpr double kPio2Hi = 0x1.921fb54442d18p+0;
constexpr double kPio2Mid = 0x1.1a62633145c07p-54;
constexpr double kPio2Lo = -0x1.f1976b7ed8fbcp-110;
constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;

struct DoubleDouble {
  double hi;
  double lo;
};

// Exact: a + b == s + e (Knuth's TwoSum, no ordering requirement).
DoubleDouble two_sum(double a, double b) {
  const double s = a + b;
  const double bb = s - a;
  const double e = (a - (s - bb)) + (b - bb);
  return {s, e};
}

// Exact: a * b == p + e, using the fused multiply-add.
DoubleDouble two_prod(double a, double b) {
  const double p = a * b;
  return {p, std::fma(a, b, -p)};
}

// (x.hi + x.lo) + b with a relative error near 2^-104.
DoubleDouble add(DoubleDouble x, double b) {
  DoubleDouble s = two_sum(x.hi, b);
  s.lo += x.lo;
  return two_sum(s.hi, s.lo);
}

}  // namespace

CosSin cos_sin_of_dd(DoubleDouble x);

CosSin exact_cos_sin(int64_t position, double inv_freq) {
  const double p = static_cast<double>(position);  // exact: |position| < 2^53
  return cos_sin_of_dd(two_prod(p, inv_freq));     // the angle, exactly
}

CosSin exact_cos_sin_real(double position, double inv_freq) {
  return cos_sin_of_dd(two_prod(position, inv_freq));
}

CosSin cos_sin_of(double angle) { return cos_sin_of_dd({angle, 0.0}); }

CosSin cos_sin_of_dd(DoubleDouble x) {
  // Quadrant: x = k π/2 + r, |r| <~ π/4. k < 2^53 is exact in double.
  const double k = std::nearbyint(x.hi * kTwoOverPi);
  // r = x - k(π/2) in double-double; each k*part is split exactly so that the cancellation of
  // x.hi against k*kPio2Hi loses nothing.
  const DoubleDouble k_hi = two_prod(k, kPio2Hi);
  const DoubleDouble k_mid = two_prod(k, kPio2Mid);
  DoubleDouble r = two_sum(x.hi, -k_hi.hi);
  r = add(r, x.lo);
  r = add(r, -k_hi.lo);
  r = add(r, -k_mid.hi);
  r = add(r, -k_mid.lo);
  r = add(r, -k * kPio2Lo);
  // sin(r_hi + r_lo) = sin r_hi + r_lo cos r_hi + O(r_lo^2), and |r_lo| <= 2^-53 |r_hi|.
  double s = 0;
  double c = 0;
  ::sincos(r.hi, &s, &c);
  const double sin_r = s + r.lo * c;
  const double cos_r = c - r.lo * s;
  switch (static_cast<int64_t>(k) & 3) {
    case 0: return {cos_r, sin_r};
    case 1: return {-sin_r, cos_r};
    case 2: return {-cos_r, -sin_r};
    default: return {sin_r, -cos_r};
  }
}

}  // namespace rotary
