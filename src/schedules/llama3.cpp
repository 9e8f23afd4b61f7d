// llama3 (Llama 3.1, factor s, low_freq_factor lf, high_freq_factor hf, L): wavelength bands kept,
// smoothed, or divided by s (DESIGN.md §2).
#include <fmt/format.h>

#include "rotary/error.hpp"
#include "schedules/common.hpp"
#include "schedules/entry.hpp"
#include "schedules/hazards.hpp"

namespace rotary::detail {
namespace {

// Equal factors are allowed (Llama 4 Scout): two bands, no smoothing (see derive).
void check(const Spec& spec) {
  if (*spec.low_freq_factor > *spec.high_freq_factor) {
    throw Error(fmt::format("low_freq_factor={} must be <= high_freq_factor={}", *spec.low_freq_factor,
                            *spec.high_freq_factor), "low_freq_factor");
  }
}

// transformers' _compute_llama3_parameters, band by band, with its comparisons (λ = 2π/f):
//   λ < L/hf (strict): kept;  λ > L/lf (strict): divided by s;  L/hf <= λ <= L/lf: smoothed.
// A wavelength equal to L/lf is smoothed with t = 0, i.e. divided by s like the band above it; one
// equal to L/hf has t = 1, i.e. kept. With lf == hf the smoothing band shrinks to λ == L/lf alone,
// where transformers divides 0 by 0 (NaN) and Meta's reference asserts: that exact case is refused.
Frequencies derive(const Spec& spec, std::optional<int64_t>) {
  std::vector<double> inv_freq = unscaled_inv_freq(spec, spec.base);
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
          lf, i, low_freq_wavelength), "low_freq_factor");
    }
    const double t = (original / wavelength - lf) / (hf - lf);
    f = (1.0 - t) * f / s + t * f;
  }
  return {inv_freq};
}

// _compute_llama3_parameters on float32 inv_freq: wavelengths (1/f) * 2π, the bands by float32
// comparisons with the band edges rounded to float32, the smoothing in float32.
std::vector<float> hf_float32(const Spec& spec, std::optional<int64_t>, const std::vector<double>&) {
  std::vector<float> inv_freq = reciprocals(hf_powers_of(spec, f32(spec.base)));
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

// transformers requires the four keys in the dict (L too: not max_position_embeddings).
void read_config(RopeDict& dict, Spec& spec) {
  static constexpr const char* fields[] = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position"};
  for (const char* field : fields) {
    const std::string_view key = find_spec_field(field)->config_key;
    if (!dict.has(key)) throw Error(fmt::format("{}{} is required for rope_type llama3", dict.prefix(), key));
  }
  for (const char* field : fields) dict.read(spec, field);
}

void hazards(const Spec& spec, const DoctorReport& r, std::vector<Hazard>& out) {
  const int64_t original = spec.original_length();
  out.push_back({"llama3_bands", original,
                 fmt::format("Llama 3 scaling of the original length {} by factor {}: {}; static, no switch inside "
                             "the context", original, *spec.factor, frequency_bands(spec, r.schedule))});
}

}  // namespace

const ScheduleEntry& llama3_schedule() {
  static const ScheduleEntry entry{
      .info = {.name = "llama3", .type = ScheduleType::llama3,
               .doc = "Llama 3.1: wavelength bands kept, smoothed, divided by factor",
               .required = {{"factor"}, {"original_max_position", "max_position"}, {"low_freq_factor"},
                            {"high_freq_factor"}},
               .optional = {}, .per_frequency = true, .check = check},
      .derive = derive,
      .hf_float32 = hf_float32,
      .rope_types = {"llama3"},
      .rope_keys = {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
      .read_config = read_config,
      .hazards = hazards,
  };
  return entry;
}

}  // namespace rotary::detail
