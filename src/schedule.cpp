#include "rotary/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include <fmt/format.h>

#include "math/xpos.hpp"
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

// YaRN's ramp runs from pair `low` (ramp 0: extrapolation) to pair `high` (ramp 1: interpolation).
struct YarnRange {
  double low;
  double high;
};

YarnRange yarn_range(const Spec& spec) {
  const int64_t r = spec.resolved_rotary_dim();
  const double original = static_cast<double>(spec.original_length());
  double low = yarn_correction_dim(spec.beta_fast.value_or(32.0), r, spec.base, original);
  double high = yarn_correction_dim(spec.beta_slow.value_or(1.0), r, spec.base, original);
  if (spec.truncate.value_or(true)) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(r - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  return {low, high};
}

void apply_yarn(const Spec& spec, std::vector<double>& inv_freq, double& attention_factor) {
  const double s = *spec.factor;
  const auto [low, high] = yarn_range(spec);
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

// proportional: the pairs that turn, int(p * head_dim // 2) as transformers writes it.
size_t proportional_turning(const Spec& spec, int64_t rotary_dim) {
  const double p = *spec.partial_rotary_factor;
  const auto turning = static_cast<size_t>(std::floor(p * static_cast<double>(rotary_dim) / 2.0));
  return std::min(turning, static_cast<size_t>(rotary_dim / 2));
}

// longrope: the long factors when the sequence is longer than L, else the short ones.
const std::vector<double>& longrope_factors(const Spec& spec, std::optional<int64_t> seq_len) {
  const bool long_context = seq_len && *seq_len > spec.original_length();
  return long_context ? spec.long_factor : spec.short_factor;
}

// Pixtral's axial_even_odd order: f's even elements to axis 0 (the first `half`), its odd ones to
// axis 1 (both the double frequencies and transformers' float32 powers are laid out this way).
template <typename T>
std::vector<T> even_then_odd(const std::vector<T>& f, size_t half) {
  std::vector<T> out(f.size());
  for (size_t k = 0; k < half; ++k) {
    out[k] = f[2 * k];
    out[half + k] = f[2 * k + 1];
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
      return even_then_odd(default_inv_freq(base, rotary_dim), static_cast<size_t>(sections[0]));
    }
    default:
      break;
  }
  if (spec.schedule == ScheduleType::proportional) {
    // transformers' _compute_proportional_rope_parameters: rope_angles = int(p * head_dim // 2)
    // frequencies base^(-2j/head_dim), then zeros to head_dim/2 (rotary_dim == head_dim).
    const size_t turning = proportional_turning(spec, rotary_dim);
    std::vector<double> out = default_inv_freq(base, rotary_dim);
    std::fill(out.begin() + static_cast<std::ptrdiff_t>(turning), out.end(), 0.0);
    return out;
  }
  return default_inv_freq(base, rotary_dim);
}

// ---- transformers' float32 inv_freq (Schedule::inv_freq_hf32) ----
// transformers 5.23 computes inv_freq in float32 tensors (modeling_rope_utils.py's
// _compute_*_parameters; the models' compute_default_rope_parameters for default). Each float
// operation below is one torch operation on CPU, in its order: IEEE float32, correctly rounded.
// pow too: base ** x is the float32 nearest base^x (a double pow rounded once). torch's own CPU
// pow is not correctly rounded on about 1.6% of these inputs (its vectorised 1-ulp pow runs over
// whole vector blocks, libm's powf over the rest, so its result depends on the machine and on
// the tensor's length): there rotary keeps the correctly rounded power, one ulp from torch's. A Python number meeting a float32 tensor is first rounded to float32
// (f32()), in comparisons too; `number / tensor` is tensor.reciprocal() * number (torch's
// __rtruediv__), so 1.0 / t is one correctly rounded reciprocal. The library is compiled with
// -ffp-contract=off: no product below is fused into a sum.

float f32(double x) { return static_cast<float>(x); }

// base ** (torch.arange(0, 2n, 2).float() / dim): one float32 tensor of n powers (pos_freqs).
std::vector<float> hf_powers(float base, int64_t dim, int64_t n) {
  std::vector<float> exponents(static_cast<size_t>(n));
  for (size_t i = 0; i < exponents.size(); ++i) {
    exponents[i] = static_cast<float>(2 * i) / static_cast<float>(dim);
  }
  std::vector<float> out(exponents.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = f32(std::pow(static_cast<double>(base), static_cast<double>(exponents[i])));
  }
  return out;
}

// The powers of the rotated slice, laid out as unscaled_inv_freq lays out its frequencies: one
// tensor per axis (Qwen and Gemma 4 vision towers: dim 2 * s_a), Pixtral's even/odd split of one
// tensor, proportional's turning pairs followed by +inf (1/inf = 0, transformers' zeros), or one
// tensor over the slice.
std::vector<float> hf_powers_of(const Spec& spec, float base, int64_t rotary_dim) {
  switch (spec.stream_layout) {
    case StreamLayout::axial: {
      std::vector<float> out;
      for (const int64_t s : spec.sections) {
        const std::vector<float> axis = hf_powers(base, 2 * s, s);
        out.insert(out.end(), axis.begin(), axis.end());
      }
      return out;
    }
    case StreamLayout::axial_even_odd: {
      return even_then_odd(hf_powers(base, rotary_dim, rotary_dim / 2), static_cast<size_t>(spec.sections[0]));
    }
    default:
      break;
  }
  if (spec.schedule == ScheduleType::proportional) {
    const auto turning = static_cast<int64_t>(proportional_turning(spec, rotary_dim));
    std::vector<float> out = hf_powers(base, rotary_dim, turning);
    out.resize(static_cast<size_t>(rotary_dim / 2), std::numeric_limits<float>::infinity());
    return out;
  }
  return hf_powers(base, rotary_dim, rotary_dim / 2);
}

// _compute_dynamic_ntk_parameters' base: at init (no sequence length; transformers also restores
// the init frequencies below L) in Python doubles, factor * L / L - (factor - 1) == 1 for the usual
// factors; past L from a tensor seq_len, so in float32, the power of a float32 tensor by a Python
// float being torch's std::pow(float, double), i.e. a double pow rounded once.
float hf_dynamic_base(const Spec& spec, std::optional<int64_t> seq_len, int64_t rotary_dim) {
  const double s = *spec.factor;
  const auto original = spec.original_length();
  const double exponent = static_cast<double>(rotary_dim) / static_cast<double>(rotary_dim - 2);
  if (!seq_len || *seq_len <= original) {
    const double L = static_cast<double>(original);
    return f32(spec.base * std::pow(s * L / L - (s - 1.0), exponent));
  }
  float growth = f32(s) * static_cast<float>(*seq_len);
  growth = growth / static_cast<float>(original);
  growth = growth - f32(s - 1.0);
  return f32(spec.base) * f32(std::pow(static_cast<double>(growth), exponent));
}

// _compute_yarn_parameters: 1/pos_freqs and 1/(factor * pos_freqs) mixed by a float32 ramp over
// arange(r/2), whose ends are the Python doubles of yarn_range.
std::vector<float> hf_yarn(const Spec& spec, const std::vector<float>& powers) {
  const float s = f32(*spec.factor);
  const auto [low, high] = yarn_range(spec);
  const float low32 = f32(low);
  const float width = f32(high - low);
  std::vector<float> out(powers.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const float extrapolation = 1.0f / powers[i];
    const float interpolation = 1.0f / (s * powers[i]);
    const float ramp = std::clamp((static_cast<float>(i) - low32) / width, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    out[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return out;
}

// _compute_llama3_parameters on float32 inv_freq: wavelengths (1/f) * 2π, the bands by float32
// comparisons with the band edges rounded to float32, the smoothing in float32.
std::vector<float> hf_llama3(const Spec& spec, std::vector<float> inv_freq) {
  const double original = static_cast<double>(spec.original_length());
  const float s = f32(*spec.factor);
  const float lf = f32(*spec.low_freq_factor);
  const float width = f32(*spec.high_freq_factor - *spec.low_freq_factor);
  const float low_freq_wavelength = f32(original / *spec.low_freq_factor);
  const float high_freq_wavelength = f32(original / *spec.high_freq_factor);
  for (float& f : inv_freq) {
    const float wavelength = (1.0f / f) * f32(two_pi);
    const float scaled = wavelength > low_freq_wavelength ? f / s : f;
    const float smooth = ((1.0f / wavelength) * f32(original) - lf) / width;
    const float smoothed = (1.0f - smooth) * scaled / s + smooth * scaled;
    const bool medium = !(wavelength < high_freq_wavelength) && !(wavelength > low_freq_wavelength);
    f = medium ? smoothed : scaled;
  }
  return inv_freq;
}

std::vector<float> reciprocals(std::vector<float> values) {
  for (float& v : values) v = 1.0f / v;
  return values;
}

// transformers' float32 inv_freq for this Spec at this sequence length; `exact` is the double
// schedule (for ntk and monotone, which transformers lacks: its float32 nearest).
std::vector<float> hf_float32_inv_freq(const Spec& spec, std::optional<int64_t> seq_len,
                                       const std::vector<double>& exact) {
  using enum ScheduleType;
  const int64_t r = spec.resolved_rotary_dim();
  const float base = spec.schedule == dynamic ? hf_dynamic_base(spec, seq_len, r) : f32(spec.base);
  std::vector<float> out;
  switch (spec.schedule) {
    case default_:
    case dynamic:
      return reciprocals(hf_powers_of(spec, base, r));
    case linear:
    case proportional:  // transformers divides by factor (default 1: unchanged)
      out = reciprocals(hf_powers_of(spec, base, r));
      if (spec.factor) {
        for (float& f : out) f = f / f32(*spec.factor);
      }
      return out;
    case yarn:
      return hf_yarn(spec, hf_powers_of(spec, base, r));
    case llama3:
      return hf_llama3(spec, reciprocals(hf_powers_of(spec, base, r)));
    case longrope: {
      out = hf_powers_of(spec, base, r);
      const std::vector<double>& factors = longrope_factors(spec, seq_len);
      for (size_t i = 0; i < out.size(); ++i) out[i] = 1.0f / (f32(factors[i]) * out[i]);
      return out;
    }
    case ntk:
    case monotone:
      break;
  }
  for (const double f : exact) out.push_back(f32(f));
  return out;
}

}  // namespace

// The same function the CUDA kernels call (src/math/xpos.hpp): the same bits everywhere.
std::vector<double> xpos_log_zeta(int64_t rotary_dim) {
  std::vector<double> log_zeta(static_cast<size_t>(rotary_dim / 2));
  for (size_t j = 0; j < log_zeta.size(); ++j) {
    log_zeta[j] = detail::xpos_log_zeta_of(static_cast<int64_t>(j), rotary_dim);
  }
  return log_zeta;
}

Schedule with_xpos(Schedule schedule, double scale_base, double center) {
  if (!(scale_base >= 0) || !std::isfinite(scale_base)) {
    throw Error(fmt::format("xpos_scale_base={} must be finite and > 0 (0: no xPos)", scale_base));
  }
  if (!std::isfinite(center)) throw Error(fmt::format("xpos_center={} must be finite", center));
  if (scale_base == 0 && center != 0) {
    // As validate(Spec): a centre without a scale base is a setting that would do nothing.
    throw Error(fmt::format("xpos_center={} is set but xpos_scale_base is 0 (no xPos)", center));
  }
  schedule.xpos_scale_base = scale_base;
  schedule.xpos_center = scale_base == 0 ? 0.0 : center;
  schedule.xpos_log_zeta = scale_base == 0 ? std::vector<double>{} : xpos_log_zeta(schedule.rotary_dim);
  validate(schedule);
  return schedule;
}

double xpos_reach(const Schedule& schedule) {
  if (!schedule.xpos()) return 0;
  double largest = 0;
  for (const double l : schedule.xpos_log_zeta) largest = std::max(largest, std::fabs(l));
  return largest > 0 ? xpos_max_log * schedule.xpos_scale_base / largest : 0;
}

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
      const auto& factors = longrope_factors(spec, seq_len);
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
  if (spec.xpos_scale_base) {
    out.xpos_scale_base = *spec.xpos_scale_base;
    out.xpos_center = spec.xpos_center.value_or(0.0);
    out.xpos_log_zeta = xpos_log_zeta(r);
  }
  validate(out);
  out.inv_freq_hf32 = hf_float32_inv_freq(spec, seq_len, out.inv_freq);
  return out;
}

}  // namespace rotary
