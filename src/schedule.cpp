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

// Pair j's stream (DESIGN.md §5; the StreamLayout doc in spec.hpp). Empty for one stream.
std::vector<int> pair_streams(const Spec& spec, int64_t pairs) {
  if (spec.stream_layout == StreamLayout::single) return {};
  const auto& sections = spec.sections;  // validated: each > 0, summing to pairs
  const auto streams = static_cast<int64_t>(sections.size());
  std::vector<int> out(static_cast<size_t>(pairs), 0);
  switch (spec.stream_layout) {
    case StreamLayout::interleaved_sections:
      // transformers' apply_interleaved_mrope: freqs_t[..., a:S*s_a:S] = freqs[a, ..., a:S*s_a:S]
      for (int64_t j = 0; j < pairs; ++j) {
        const int64_t a = j % streams;
        if (a >= 1 && j < streams * sections[static_cast<size_t>(a)]) out[static_cast<size_t>(j)] = static_cast<int>(a);
      }
      break;
    case StreamLayout::alternating_sections: {
      // ERNIE-4.5-VL's recomposition_to_3d: [h0 w0 h1 w1 ...] then t; positions are [t, h, w].
      const int64_t spatial = sections[0] + sections[1];
      for (int64_t j = 0; j < pairs; ++j) out[static_cast<size_t>(j)] = j >= spatial ? 0 : j % 2 == 0 ? 1 : 2;
      break;
    }
    default: {  // sections, axial, axial_even_odd: contiguous runs
      size_t j = 0;
      for (size_t a = 0; a < sections.size(); ++a) {
        for (int64_t k = 0; k < sections[a]; ++k) out[j++] = static_cast<int>(a);
      }
    }
  }
  return out;
}

// The frequencies before the schedule scales them: base^(-2j/r) over the rotated slice, unless the
// stream layout or the schedule spaces them otherwise.
std::vector<double> unscaled_inv_freq(const Spec& spec, double base, int64_t rotary_dim) {
  const auto& sections = spec.sections;
  switch (spec.stream_layout) {
    case StreamLayout::axial: {  // Qwen ViT: each axis base^(-2k / (2 s_a)), k < s_a
      std::vector<double> out;
      for (const int64_t s : sections) {
        const std::vector<double> axis = default_inv_freq(base, 2 * s);
        out.insert(out.end(), axis.begin(), axis.end());
      }
      return out;
    }
    case StreamLayout::axial_even_odd: {  // Pixtral: f_2k to axis 0, f_(2k+1) to axis 1
      const std::vector<double> f = default_inv_freq(base, rotary_dim);
      std::vector<double> out(f.size());
      const auto half = static_cast<size_t>(sections[0]);
      for (size_t k = 0; k < half; ++k) {
        out[k] = f[2 * k];
        out[half + k] = f[2 * k + 1];
      }
      return out;
    }
    default:
      break;
  }
  if (spec.schedule == ScheduleType::proportional) {
    // transformers' _compute_proportional_rope_parameters: rope_angles = int(p * head_dim // 2)
    // frequencies base^(-2j/head_dim), then zeros to head_dim/2 (rotary_dim == head_dim).
    const double p = *spec.partial_rotary_factor;
    const auto turning = static_cast<size_t>(std::floor(p * static_cast<double>(rotary_dim) / 2.0));
    std::vector<double> out = default_inv_freq(base, rotary_dim);
    std::fill(out.begin() + static_cast<std::ptrdiff_t>(std::min(turning, out.size())), out.end(), 0.0);
    return out;
  }
  return default_inv_freq(base, rotary_dim);
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
  out.rotary_offset = spec.rotary_offset;
  out.blocks = spec.blocks;
  out.streams = spec.stream_layout == StreamLayout::single ? 1 : static_cast<int>(spec.sections.size());
  const int64_t r = out.rotary_dim;
  out.pair_stream = pair_streams(spec, r / 2);
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
  out.inv_freq = unscaled_inv_freq(spec, base, r);

  switch (spec.schedule) {
    case linear:
      for (double& f : out.inv_freq) f /= *spec.factor;
      break;
    case proportional:  // transformers divides by factor (default 1) after the zeros
      if (spec.factor) {
        for (double& f : out.inv_freq) f /= *spec.factor;
      }
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

}  // namespace rotary
