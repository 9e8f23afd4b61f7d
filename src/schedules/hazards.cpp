#include "schedules/hazards.hpp"

#include <fmt/format.h>

namespace rotary::detail {
namespace {

// "0-17", or "5" for one pair.
std::string pair_run(int64_t first, int64_t last) {
  return first == last ? fmt::format("{}", first) : fmt::format("{}-{}", first, last);
}

}  // namespace

std::string frequency_bands(const Spec& spec, const Schedule& schedule) {
  Spec plain{.head_dim = spec.head_dim, .rotary_dim = spec.rotary_dim, .base = spec.base, .pairing = spec.pairing,
             .rotary_offset = spec.rotary_offset, .blocks = spec.blocks, .stream_layout = spec.stream_layout,
             .sections = spec.sections};
  const std::vector<double> unscaled = make_schedule(plain).inv_freq;
  const double s = *spec.factor;
  auto band = [&](size_t j) {
    const double f = schedule.inv_freq[j];
    return f == unscaled[j] ? 0 : f == unscaled[j] / s ? 2 : 1;
  };
  static constexpr const char* names[] = {"keep their frequencies", "blend", "are divided by factor"};
  std::string out;
  for (size_t j = 0; j < unscaled.size();) {
    size_t end = j;
    while (end + 1 < unscaled.size() && band(end + 1) == band(j)) ++end;
    out += fmt::format("{}pairs {} {}{}", out.empty() ? "" : ", ", pair_run(static_cast<int64_t>(j), static_cast<int64_t>(end)),
                       names[band(j)], band(j) == 2 ? fmt::format(" {}", s) : "");
    j = end + 1;
  }
  return out;
}

std::string one_schedule_fix(const DoctorReport& report) {
  return fmt::format("resolve one schedule for the whole sequence: seq_len={} (rotary --seq-len, "
                     "Rope.from_hf_config(..., seq_len=...))",
                     report.positions);
}

}  // namespace rotary::detail
