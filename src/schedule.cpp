#include "rotary/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "rotary/error.hpp"

namespace rotary {
namespace {

constexpr double two_pi = 2.0 * std::numbers::pi;

// YaRN's get_mscale: 1 for s <= 1, else 0.1 * m * ln(s) + 1.
double yarn_get_mscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

// YaRN: the (fractional) pair index whose wavelength completes `rotations` turns over L tokens.
double yarn_correction_dim(double rotations, int64_t rotary_dim, double base, double original) {
  return static_cast<double>(rotary_dim) * std::log(original / (rotations * two_pi)) /
         (2.0 * std::log(base));
}

void apply_yarn(const Spec& spec, std::vector<double>& inv_freq, double& attention_factor) {
  const int64_t r = spec.resolved_rotary_dim();
  const double s = *spec.factor;
  const double original = static_cast<double>(spec.original_length());
  const bool truncate = spec.truncate.value_or(true);
  double low = yarn_correction_dim(spec.beta_fast.value_or(32.0), r, spec.base, original);
  double high = yarn_correction_dim(spec.beta_slow.value_or(1.0), r, spec.base, original);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(r - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation_weight = 1.0 - ramp;
    const double d = inv_freq[i];
    inv_freq[i] = (d / s) * (1.0 - extrapolation_weight) + d * extrapolation_weight;
  }
  // Hugging Face tests `if mscale and mscale_all_dim`: a zero counts as absent.
  if (spec.mscale && spec.mscale_all_dim && *spec.mscale != 0 && *spec.mscale_all_dim != 0) {
    attention_factor =
        yarn_get_mscale(s, *spec.mscale) / yarn_get_mscale(s, *spec.mscale_all_dim);
  } else {
    attention_factor = yarn_get_mscale(s, 1.0);
  }
}

// transformers' _compute_llama3_parameters, band by band, with its comparisons (λ = 2π/f):
//   λ < L/hf (strict): kept;  λ > L/lf (strict): divided by s;  L/hf <= λ <= L/lf: smoothed.
// A wavelength equal to L/lf is smoothed with t = 0, i.e. divided by s like the band above it; one
// equal to L/hf has t = 1, i.e. kept. With lf == hf the smoothing band shrinks to λ == L/lf alone,
// where transformers divides 0 by 0 (NaN) and Meta's reference asserts: that exact case is refused.
void apply_llama3(const Spec& spec, std::vector<double>& inv_freq) {
  const double s = *spec.factor;
  const double lf = *spec.low_freq_factor;
  const double hf = *spec.high_freq_factor;
  const double original = static_cast<double>(spec.original_length());
  const double low_freq_wavelength = original / lf;
  const double high_freq_wavelength = original / hf;
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    double& f = inv_freq[i];
    const double wavelength = two_pi / f;
    if (wavelength < high_freq_wavelength) continue;  // high frequency: kept
    if (wavelength > low_freq_wavelength) {
      f = f / s;  // low frequency: interpolated
      continue;
    }
    if (lf == hf) {
      throw Error(fmt::format(
          "low_freq_factor={} equals high_freq_factor and pair {}'s wavelength 2*pi/inv_freq equals "
          "original_max_position/low_freq_factor={} exactly: transformers' llama3 smoothing divides 0 "
          "by 0 there (NaN)",
          lf, i, low_freq_wavelength));
    }
    const double t = (original / wavelength - lf) / (hf - lf);
    f = (1.0 - t) * f / s + t * f;
  }
}

// NaN fails both comparisons.
bool attention_factor_in_range(double factor) {
  return factor >= min_attention_factor && factor <= max_attention_factor;
}

double ntk_base(double base, double scale, int64_t rotary_dim) {
  const double r = static_cast<double>(rotary_dim);
  return base * std::pow(scale, r / (r - 2.0));
}

}  // namespace

std::vector<double> default_inv_freq(double base, int64_t rotary_dim) {
  std::vector<double> inv_freq(static_cast<size_t>(rotary_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double exponent = static_cast<double>(2 * i) / static_cast<double>(rotary_dim);
    inv_freq[i] = std::pow(base, -exponent);
  }
  return inv_freq;
}

double monotone_default_scale(int64_t max_length, double first_inv_freq) {
  return two_pi * (1.0 - 0x1p-10) / (static_cast<double>(max_length - 1) * first_inv_freq);
}

Schedule make_schedule(const Spec& spec, std::optional<int64_t> seq_len) {
  validate(spec);
  if (seq_len && (*seq_len < 0 || *seq_len > max_position_limit)) {
    throw Error(fmt::format("seq_len={} must be in [0, 2^31]", *seq_len));
  }
  using enum ScheduleType;
  Schedule out;
  out.head_dim = spec.head_dim;
  out.rotary_dim = spec.resolved_rotary_dim();
  out.pairing = spec.pairing;
  out.type = spec.schedule;
  const int64_t r = out.rotary_dim;
  const int64_t original = spec.original_length();
  double base = spec.base;
  double attention_factor = 1.0;

  switch (spec.schedule) {
    case ntk:
      base = ntk_base(spec.base, *spec.factor, r);
      break;
    case dynamic:
      if (seq_len && *seq_len > original) {
        const double s = *spec.factor;
        const double growth = s * static_cast<double>(*seq_len) / static_cast<double>(original) -
                              (s - 1.0);
        base = ntk_base(spec.base, growth, r);
      }
      break;
    default:
      break;
  }
  if (!std::isfinite(base)) {
    throw Error(fmt::format("base after {} scaling is {}: factor or seq_len too large",
                            to_string(spec.schedule), base));
  }
  out.inv_freq = default_inv_freq(base, r);

  switch (spec.schedule) {
    case linear:
      for (double& f : out.inv_freq) f /= *spec.factor;
      break;
    case yarn:
      apply_yarn(spec, out.inv_freq, attention_factor);
      break;
    case llama3:
      apply_llama3(spec, out.inv_freq);
      break;
    case longrope: {
      const bool long_context = seq_len && *seq_len > original;
      const auto& factors = long_context ? spec.long_factor : spec.short_factor;
      for (size_t i = 0; i < out.inv_freq.size(); ++i) out.inv_freq[i] /= factors[i];
      if (spec.max_position && *spec.max_position > original) {
        const double ratio =
            static_cast<double>(*spec.max_position) / static_cast<double>(original);
        attention_factor =
            std::sqrt(1.0 + std::log(ratio) / std::log(static_cast<double>(original)));
      }
      break;
    }
    case monotone: {
      const int64_t n = *spec.max_length;
      const double first = out.inv_freq.empty() ? 1.0 : out.inv_freq[0];
      const double c = spec.monotone_scale.value_or(monotone_default_scale(n, first));
      if (static_cast<double>(n - 1) * c * first >= two_pi) {
        throw Error(fmt::format(
            "monotone_scale={} breaks (max_length-1)*c*inv_freq[0] < 2*pi for max_length={}; "
            "the largest allowed is below {}",
            c, n, two_pi / (static_cast<double>(n - 1) * first)));
      }
      for (double& f : out.inv_freq) f *= c;
      break;
    }
    default:
      break;
  }
  if (spec.attention_factor) {
    attention_factor = *spec.attention_factor;  // range checked by validate(spec)
  } else if (!attention_factor_in_range(attention_factor)) {
    throw Error(fmt::format("schedule {} computes attention_factor={} from factor={}, mscale={}, "
                            "mscale_all_dim={}: it must round to a normal float32, in [2^-126, 3.40282347e+38]",
                            to_string(spec.schedule), attention_factor, spec.factor.value_or(0.0),
                            spec.mscale.value_or(0.0), spec.mscale_all_dim.value_or(0.0)));
  }
  out.attention_factor = attention_factor;
  validate(out);
  return out;
}

void validate(const Schedule& schedule) {
  if (schedule.head_dim <= 0) {
    throw Error(fmt::format("head_dim={} must be > 0", schedule.head_dim));
  }
  if (schedule.rotary_dim <= 0 || schedule.rotary_dim % 2 != 0 ||
      schedule.rotary_dim > schedule.head_dim) {
    throw Error(fmt::format("rotary_dim={} must be even, > 0 and <= head_dim={}",
                            schedule.rotary_dim, schedule.head_dim));
  }
  if (schedule.pairing != Pairing::interleaved && schedule.pairing != Pairing::half) {
    throw Error(fmt::format("pairing={} is not interleaved or half", static_cast<int>(schedule.pairing)));
  }
  if (static_cast<int>(schedule.type) < static_cast<int>(ScheduleType::default_) ||
      static_cast<int>(schedule.type) > static_cast<int>(ScheduleType::monotone)) {
    throw Error(fmt::format("type={} is not a schedule type", static_cast<int>(schedule.type)));
  }
  if (static_cast<int64_t>(schedule.inv_freq.size()) != schedule.pairs()) {
    throw Error(fmt::format("inv_freq has {} values but rotary_dim/2={}", schedule.inv_freq.size(),
                            schedule.pairs()));
  }
  // One branch-free pass (apply calls this per call); NaN fails both comparisons, inf the second.
  auto in_range = [](double f) { return f > 0 && f <= max_inv_freq; };
  bool all_in_range = true;
  for (const double f : schedule.inv_freq) all_in_range &= in_range(f);
  if (!all_in_range) {
    for (size_t i = 0; i < schedule.inv_freq.size(); ++i) {
      if (!in_range(schedule.inv_freq[i])) {
        throw Error(fmt::format("inv_freq[{}]={} must be finite, > 0 and <= 2^20 (check factor)", i,
                                schedule.inv_freq[i]));
      }
    }
  }
  if (!std::isfinite(schedule.attention_factor) || schedule.attention_factor <= 0) {
    throw Error(fmt::format("attention_factor={} must be finite and > 0",
                            schedule.attention_factor));
  }
  if (!attention_factor_in_range(schedule.attention_factor)) {
    throw Error(fmt::format("attention_factor={} must round to a normal float32, in [2^-126, 3.40282347e+38] "
                            "(cos and sin times it are stored as float32)",
                            schedule.attention_factor));
  }
}

}  // namespace rotary
