#include "rotary/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "math/xpos.hpp"
#include "rotary/error.hpp"
#include "schedules/entry.hpp"

namespace rotary {
namespace {

// The explicit factor (its range checked by validate(spec)), else the schedule's, which must round
// to a normal float32 (NaN fails both comparisons).
double attention_factor_of(const Spec& spec, double computed) {
  if (spec.attention_factor) return *spec.attention_factor;
  if (computed >= min_attention_factor && computed <= max_attention_factor) return computed;
  throw Error(fmt::format("schedule {} computes attention_factor={} from factor={}, mscale={}, "
                          "mscale_all_dim={}: it must round to a normal float32, in [2^-126, 3.40282347e+38]",
                          to_string(spec.schedule), computed, spec.factor.value_or(0.0),
                          spec.mscale.value_or(0.0), spec.mscale_all_dim.value_or(0.0)), "schedule");
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
    throw Error(fmt::format("xpos_scale_base={} must be finite and > 0 (0: no xPos)", scale_base), "xpos_scale_base");
  }
  if (!std::isfinite(center)) throw Error(fmt::format("xpos_center={} must be finite", center), "xpos_center");
  if (scale_base == 0 && center != 0) {
    // As validate(Spec): a centre without a scale base is a setting that would do nothing.
    throw Error(fmt::format("xpos_center={} is set but xpos_scale_base is 0 (no xPos)", center), "xpos_center");
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

Schedule make_schedule(const Spec& spec, std::optional<int64_t> seq_len) {
  validate(spec);
  if (seq_len && (*seq_len < 0 || *seq_len > max_position_limit)) {
    throw Error(fmt::format("seq_len={} must be in [0, 2^31]", *seq_len), "seq_len");
  }
  const detail::ScheduleEntry& entry = detail::schedule_entry(spec.schedule);
  Schedule out;
  out.head_dim = spec.head_dim;
  out.rotary_dim = spec.resolved_rotary_dim();
  out.pairing = spec.pairing;
  out.type = spec.schedule;
  out.rotary_offset = spec.rotary_offset;
  out.blocks = spec.blocks;
  out.streams = spec.stream_layout == StreamLayout::single ? 1 : static_cast<int>(spec.sections.size());
  out.pair_stream = pair_streams(spec, out.pairs());
  detail::Frequencies derived = entry.derive(spec, seq_len);
  out.inv_freq = std::move(derived.inv_freq);
  out.attention_factor = attention_factor_of(spec, derived.attention_factor);
  if (spec.xpos_scale_base) {
    out.xpos_scale_base = *spec.xpos_scale_base;
    out.xpos_center = spec.xpos_center.value_or(0.0);
    out.xpos_log_zeta = xpos_log_zeta(out.rotary_dim);
  }
  validate(out);
  out.inv_freq_hf32 = entry.hf_float32(spec, seq_len, out.inv_freq);
  return out;
}

}  // namespace rotary
