#include "rotary/doctor.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "math/half.hpp"
#include "rotary/angle.hpp"
#include "rotary/error.hpp"
#include "rotary/table.hpp"
#include "schedules/entry.hpp"

namespace rotary {
namespace {

constexpr double two_pi = 2.0 * std::numbers::pi;

// ---- float32 drift ----

// Pair j's frequency in transformers' float32 pipeline, as AngleMode::hf_float32 takes it.
float hf32_frequency(const Schedule& schedule, size_t j) {
  return schedule.inv_freq_hf32.empty() ? static_cast<float>(schedule.inv_freq[j]) : schedule.inv_freq_hf32[j];
}

// |fl32(f * fl32(p)) - p * theta| for positions p < 2^31, as hf_float32_drift forms it: the exact
// product p * theta = hi + lo, then (angle32 - hi) - lo (the first difference exact, Sterbenz). lo
// comes from Dekker's TwoProduct (Veltkamp's splits into 26-bit halves; Ogita, Rump & Oishi 2005,
// algorithm 3.3) rather than an FMA, which baseline x86-64 code would call from libm for every
// position; it is the same number, p * theta - hi exactly. The library builds with
// -ffp-contract=off, so nothing below is fused.
struct AngleError {
  float f;
  double theta, theta_hi, theta_lo;

  AngleError(float f32, double exact) : f(f32), theta(exact) { split(theta, theta_hi, theta_lo); }

  static void split(double a, double& hi, double& lo) {
    const double c = 134217729.0 * a;  // 2^27 + 1
    hi = c - (c - a);
    lo = a - hi;
  }

  double at(int32_t p) const {
    const auto angle32 = static_cast<double>(f * static_cast<float>(p));
    const auto pd = static_cast<double>(p);
    double p_hi, p_lo;
    split(pd, p_hi, p_lo);
    const double hi = pd * theta;
    const double lo = p_lo * theta_lo - (((hi - p_hi * theta_hi) - p_lo * theta_hi) - p_hi * theta_lo);
    return std::fabs((angle32 - hi) - lo);
  }
};

// Half a float32 ulp of a positive x's binade: the largest rounding error of fl32 there.
double half_ulp32(double x) { return x > 0 ? std::ldexp(1.0, std::max(std::ilogb(x), -126) - 24) : 0x1p-150; }

// An upper bound on pair's error at p, nondecreasing in p:
//   |fl32(f fl32(p)) - p theta| <= p |f - theta| + f |fl32(p) - p| + |rounding of the product|,
// |fl32(p) - p| <= half_ulp32(p) (0 below 2^24) and the product's rounding <= half_ulp32 of its binade.
double error_bound(const AngleError& e, int64_t p) {
  const auto pd = static_cast<double>(p);
  const double f = e.f;
  const double slope = std::fabs(f - e.theta) * (1 + 0x1p-50);
  const double position_rounding = p > (int64_t{1} << 24) ? f * half_ulp32(pd) : 0.0;
  const double product_rounding = half_ulp32(f * pd * (1 + 0x1p-22));
  return (pd * slope + position_rounding + product_rounding) * (1 + 0x1p-20);
}

// The first position in [0, positions) where the pair's error exceeds threshold: below the first p
// whose bound exceeds it (a binary search) none can; from there a scan in blocks.
std::optional<int64_t> first_stray(const AngleError& e, double threshold, int64_t positions) {
  int64_t lo = 0, hi = positions;  // the first p with error_bound(p) > threshold lies in [lo, hi]
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (error_bound(e, mid) > threshold) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  constexpr int64_t kBlock = 256;
  double errors[kBlock];
  for (int64_t start = lo; start < positions; start += kBlock) {
    const int64_t n = std::min(kBlock, positions - start);
    for (int64_t i = 0; i < n; ++i) errors[i] = e.at(static_cast<int32_t>(start + i));
    for (int64_t i = 0; i < n; ++i) {
      if (errors[i] > threshold) return start + i;
    }
  }
  return std::nullopt;
}

Float32DriftReport float32_drift(const Schedule& schedule, int64_t positions) {
  Float32DriftReport out;
  out.last_position = positions - 1;
  const Float32Drift at_end = hf_float32_drift(schedule, out.last_position);  // checks inv_freq_hf32
  out.max_rad_at_context = at_end.max_angle_error;
  out.worst_pair_at_context = at_end.worst_pair;
  out.max_ulps_at_context = at_end.max_ulps;
  for (size_t j = 0; j < static_cast<size_t>(schedule.pairs()); ++j) {
    const AngleError e(hf32_frequency(schedule, j), schedule.inv_freq[j]);
    out.rad_at_context_per_pair.push_back(e.at(static_cast<int32_t>(out.last_position)));
    out.first_position_per_pair.push_back(first_stray(e, out.threshold_rad, positions));
    const auto& first = out.first_position_per_pair.back();
    if (first && (!out.first_position || *first < *out.first_position)) {
      out.first_position = first;
      out.first_pair = static_cast<int64_t>(j);
    }
  }
  return out;
}

// ---- bf16 resolution ----

struct Bf16CosSin {
  uint16_t cos, sin;
  bool operator==(const Bf16CosSin&) const = default;
};

// cos and sin times factor as the exact Table holds them (one rounding to float32), then to bf16.
Bf16CosSin bf16_at(int64_t p, double theta, double factor) {
  const CosSin cs = exact_cos_sin(p, theta);
  return {detail::f32_to_bf16(static_cast<float>(cs.cos * factor)),
          detail::f32_to_bf16(static_cast<float>(cs.sin * factor))};
}

// Two reals x1, x2 that round (via float32, as the table stores them) to one bf16 value b differ by
// at most the width of b's rounding cell, ulp(b) = 2^(max(ilogb(b), -126) - 7) <= 2^-7 |b| + 2^-133,
// plus the float32 roundings (<= 2^-24 |x| + 2^-150 each). A pair whose cos and sin (times g) both
// repeat thus turns by a chord 2 |sin(theta/2)| of at most 2^-7 (1 + 2^-4) + 2^-130 / g: pairs turning
// further per position never repeat.
double largest_repeating_chord(double factor) { return 0x1p-7 * (1 + 0x1p-4) + 0x1p-130 / factor; }

// The necessary condition above for approximations a, b within eta of x1, x2 (false: x1 and x2
// round to different bf16 values for certain).
bool may_share_bf16(double a, double b, double eta) {
  const double largest = std::max(std::fabs(a), std::fabs(b)) + eta;
  // 2^ilogb(x) for a positive normal double: its exponent bits alone (no libm call in this loop)
  const double binade = std::bit_cast<double>(std::bit_cast<uint64_t>(largest * (1 + 0x1p-7)) & 0x7ff0000000000000u);
  const double cell = std::max(binade, 0x1p-126) * 0x1p-7;
  return std::fabs(a - b) <= cell + 0x1p-22 * largest + 0x1p-148 + 2 * eta;
}

// The first p in [0, last] at which the pair's bf16 cos and sin equal those of p + 1. Positions are
// screened in blocks: cos and sin of b + i from the exact values at b and at i (one rotation, error
// far below eta), and only those may_share_bf16 admits are checked with the table's own values.
std::optional<int64_t> first_repeat(double theta, double factor, int64_t last) {
  constexpr int64_t kBlock = 1024;
  const int64_t width = std::min(kBlock, last + 1);
  std::vector<double> step_cos(static_cast<size_t>(width + 1)), step_sin(step_cos.size());
  for (size_t i = 0; i < step_cos.size(); ++i) {
    const CosSin cs = exact_cos_sin(static_cast<int64_t>(i), theta);
    step_cos[i] = cs.cos;
    step_sin[i] = cs.sin;
  }
  const double eta = 0x1p-40 * factor;
  std::vector<double> c(step_cos.size()), s(step_cos.size());
  for (int64_t b = 0; b <= last; b += width) {
    const int64_t n = std::min(width, last + 1 - b);  // p = b + i, i < n, and p + 1
    const CosSin at = exact_cos_sin(b, theta);
    for (int64_t i = 0; i <= n; ++i) {
      c[i] = (at.cos * step_cos[i] - at.sin * step_sin[i]) * factor;
      s[i] = (at.sin * step_cos[i] + at.cos * step_sin[i]) * factor;
    }
    for (int64_t i = 0; i < n; ++i) {
      if (!may_share_bf16(c[i], c[i + 1], eta) || !may_share_bf16(s[i], s[i + 1], eta)) continue;
      if (bf16_at(b + i, theta, factor) == bf16_at(b + i + 1, theta, factor)) return b + i;
    }
  }
  return std::nullopt;
}

Bf16Resolution bf16_resolution(const Schedule& schedule, int64_t positions) {
  struct Candidate {
    double chord;
    int64_t pair;
  };
  std::vector<Candidate> candidates;
  for (int64_t j = 0; j < schedule.pairs(); ++j) {
    const double theta = schedule.inv_freq[static_cast<size_t>(j)];
    const double chord = 2 * std::fabs(exact_cos_sin_real(0.5, theta).sin);
    if (theta > 0 && chord <= largest_repeating_chord(schedule.attention_factor)) candidates.push_back({chord, j});
  }
  // The shortest steps repeat first: they bound the scan of the others.
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.chord < b.chord; });
  Bf16Resolution out;
  for (const Candidate& c : candidates) {
    // p + 1 < positions, and no later than the best so far (there only for a lower pair)
    const int64_t last = out.first_position ? *out.first_position - (c.pair < out.pair ? 0 : 1) : positions - 2;
    const auto p = first_repeat(schedule.inv_freq[static_cast<size_t>(c.pair)], schedule.attention_factor, last);
    if (p) {
      out.first_position = p;
      out.pair = c.pair;
    }
  }
  return out;
}

// ---- wrap distance ----

std::vector<std::optional<double>> wrap_distances(const Schedule& schedule) {
  std::vector<std::optional<double>> out;
  for (const double theta : schedule.inv_freq) {
    const double distance = std::ceil(two_pi / theta);  // inf for 0 and for a subnormal inv_freq
    out.push_back(std::isfinite(distance) ? std::optional(distance) : std::nullopt);
  }
  return out;
}

// ---- hazards ----

void add_float32_hazard(const DoctorReport& r, std::vector<Hazard>& out) {
  const Float32DriftReport& d = r.float32_drift;
  if (!d.first_position) return;
  out.push_back({"float32_drift", d.first_position,
                 fmt::format("transformers' float32 angles stray more than {:g} rad from the exact ones from position {} "
                             "(pair {}); at the last position {}: by {:.3g} rad (pair {}); use rotary's exact angles "
                             "(angles='exact', the default; not 'hf-float32')",
                             d.threshold_rad, *d.first_position, d.first_pair, d.last_position, d.max_rad_at_context,
                             d.worst_pair_at_context)});
}

void add_bf16_hazard(const DoctorReport& r, std::vector<Hazard>& out) {
  const Bf16Resolution& b = r.bf16_resolution;
  if (!b.first_position) return;
  out.push_back({"bf16_resolution", b.first_position,
                 fmt::format("a bf16 cos/sin cache gives positions {} and {} the same cos and sin on pair {} (inv_freq "
                             "{:.3g}): it cannot tell them apart; keep cos/sin in float32 (rotary's tables are float32, "
                             "apply rounds once at the store)",
                             *b.first_position, *b.first_position + 1, b.pair, r.schedule.inv_freq[static_cast<size_t>(b.pair)])});
}

void add_wrap_hazard(const DoctorReport& r, std::vector<Hazard>& out) {
  if (r.wrapping_pairs.empty()) return;
  int64_t first = r.wrapping_pairs[0], slowest = first;
  for (const int64_t j : r.wrapping_pairs) {
    const auto at = [&](int64_t k) { return *r.wrap_distance[static_cast<size_t>(k)]; };
    if (at(j) < at(first)) first = j;
    if (at(j) > at(slowest)) slowest = j;
  }
  const double shortest = *r.wrap_distance[static_cast<size_t>(first)];
  out.push_back({"wrap", static_cast<int64_t>(shortest),
                 fmt::format("{} of {} pairs complete a turn within the context, from distance {} (pair {}) to {} (pair "
                             "{}): their angle difference is not monotone in distance (He & Xu's c3); the monotone "
                             "schedule (schedule='monotone', max_length={}) keeps every pair under one turn",
                             r.wrapping_pairs.size(), r.schedule.pairs(), shortest, first,
                             *r.wrap_distance[static_cast<size_t>(slowest)], slowest, r.positions)});
}

// The schedule's own findings (ScheduleEntry::hazards: LongRoPE's and dynamic NTK's switch, YaRN's
// and Llama 3's bands).
void add_schedule_hazards(const Spec& spec, const DoctorReport& r, std::vector<Hazard>& out) {
  if (const auto hazards = detail::schedule_entry(spec.schedule).hazards) hazards(spec, r, out);
}

// xPos: positions further than xpos_reach from the centre are refused by apply.
void add_xpos_hazard(const DoctorReport& r, std::vector<Hazard>& out) {
  const Schedule& schedule = r.schedule;
  if (!schedule.xpos()) return;
  const double reach = xpos_reach(schedule);
  const double c = schedule.xpos_center;
  const auto last = static_cast<double>(r.positions - 1);
  const double lowest = std::ceil(c - reach);   // the first position served
  const double highest = std::floor(c + reach);  // the last
  if (lowest <= 0 && highest >= last) return;
  const auto first_refused = static_cast<int64_t>(lowest > 0 ? 0.0 : highest + 1);
  const std::string served = lowest > last || highest < 0
                                 ? std::string("none of the context")
                                 : fmt::format("positions {} to {}", std::max(lowest, 0.0), std::min(highest, last));
  const std::string fix =
      last <= 2 * reach
          ? fmt::format("xpos_center={} serves the whole context", last / 2)
          : fmt::format("no one centre serves {} positions (more than 2*{:.0f}): shift cached keys back with "
                        "rerotate as the sequence grows (a context shift), or raise xpos_scale_base",
                        r.positions, reach);
  out.push_back({"xpos_range", first_refused,
                 fmt::format("xPos (xpos_scale_base={}, xpos_center={}) reaches |position - centre| <= {:.1f}: apply "
                             "serves {} and refuses the rest (the scale zeta^((p - c)/gamma) would leave float range); {}",
                             schedule.xpos_scale_base, c, reach, served, fix)});
}

int64_t checked_context(const Spec& spec, const DoctorOptions& options, std::string& source) {
  if (options.context) {
    if (*options.context < 1 || *options.context > max_position_limit) {
      throw Error(fmt::format("context={} must be in [1, 2^31] (positions 0 .. context-1)", *options.context));
    }
    source = "given";
    return *options.context;
  }
  const ContextLength stated = context_length(spec, options.max_position_embeddings);
  if (stated.length <= 0) {
    throw Error("context is needed: the settings state no length (max_position_embeddings, "
                "original_max_position_embeddings or max_length)");
  }
  source = stated.source;
  return stated.length;
}

}  // namespace

DoctorReport doctor(const Spec& spec, const DoctorOptions& options) {
  validate(spec);
  DoctorReport r;
  r.context = checked_context(spec, options, r.context_source);
  r.positions = std::min(r.context, max_position_limit);
  r.schedule = make_schedule(spec, r.positions);
  r.float32_drift = float32_drift(r.schedule, r.positions);
  r.bf16_resolution = bf16_resolution(r.schedule, r.positions);
  r.wrap_distance = wrap_distances(r.schedule);
  for (size_t j = 0; j < r.wrap_distance.size(); ++j) {
    if (r.wrap_distance[j] && *r.wrap_distance[j] <= static_cast<double>(r.positions - 1)) {
      r.wrapping_pairs.push_back(static_cast<int64_t>(j));
    }
  }
  add_float32_hazard(r, r.hazards);
  add_bf16_hazard(r, r.hazards);
  add_wrap_hazard(r, r.hazards);
  add_schedule_hazards(spec, r, r.hazards);
  add_xpos_hazard(r, r.hazards);
  return r;
}

DoctorReport doctor(const ModelRope& model, std::optional<int64_t> context) {
  return doctor(model.spec, DoctorOptions{.context = context, .max_position_embeddings = model.max_position_embeddings});
}

// ---- printing ----

namespace {

using ordered_json = nlohmann::ordered_json;

ordered_json optional_json(const std::optional<int64_t>& v) { return v ? ordered_json(*v) : ordered_json(nullptr); }

// An integral double as a JSON integer while int64 holds it exactly (2^53), else as a double.
ordered_json distance_json(const std::optional<double>& v) {
  if (!v) return nullptr;
  return *v <= 0x1p53 ? ordered_json(static_cast<int64_t>(*v)) : ordered_json(*v);
}

}  // namespace

std::string to_json(const DoctorReport& r) {
  const Float32DriftReport& d = r.float32_drift;
  ordered_json drift = {{"threshold_rad", d.threshold_rad},
                        {"first_position", optional_json(d.first_position)},
                        {"first_pair", d.first_pair},
                        {"first_position_per_pair", ordered_json::array()},
                        {"last_position", d.last_position},
                        {"max_rad_at_context", d.max_rad_at_context},
                        {"worst_pair_at_context", d.worst_pair_at_context},
                        {"max_ulps_at_context", d.max_ulps_at_context},
                        {"rad_at_context_per_pair", d.rad_at_context_per_pair}};
  for (const auto& p : d.first_position_per_pair) drift["first_position_per_pair"].push_back(optional_json(p));
  ordered_json wraps = ordered_json::array();
  for (const auto& w : r.wrap_distance) wraps.push_back(distance_json(w));
  ordered_json hazards = ordered_json::array();
  for (const Hazard& h : r.hazards) {
    hazards.push_back({{"kind", h.kind}, {"position", optional_json(h.position)}, {"detail", h.detail}});
  }
  const ordered_json out = {
      {"context", r.context},
      {"context_source", r.context_source},
      {"positions", r.positions},
      {"schedule", std::string(to_string(r.schedule.type))},
      {"float32_drift", drift},
      {"bf16_resolution", {{"first_position", optional_json(r.bf16_resolution.first_position)},
                           {"pair", r.bf16_resolution.pair}}},
      {"wrap_distance", wraps},
      {"wrapping_pairs", r.wrapping_pairs},
      {"hazards", hazards}};
  return out.dump();  // our own numbers and words; every double finite (hf_float32_drift checked them)
}

std::string to_text(const DoctorReport& r) {
  std::string out = fmt::format("rotary doctor: schedule {}, {} pairs, context {} ({}){}\n", to_string(r.schedule.type),
                                r.schedule.pairs(), r.context, r.context_source,
                                r.positions < r.context ? fmt::format(", examined to rotary's last position {}",
                                                                      r.positions - 1)
                                                        : "");
  const Float32DriftReport& d = r.float32_drift;
  // The checks in Hazard's order, each a hazard line or the line saying it found none.
  const std::pair<std::string_view, std::string> checks[] = {
      {"float32_drift", fmt::format("none: transformers' float32 angles stay within {:g} rad of the exact ones (at most "
                                    "{:.3g} rad at the last position {})",
                                    d.threshold_rad, d.max_rad_at_context, d.last_position)},
      {"bf16_resolution", "none: a bf16 cos/sin cache tells every position from the next"},
      {"wrap", "none: every pair stays under one turn over the context (He & Xu's c3 holds)"}};
  auto print = [&](const Hazard& h) {
    out += fmt::format("{} at {}: {}\n", h.kind, h.position ? std::to_string(*h.position) : "-", h.detail);
  };
  for (const auto& [kind, none] : checks) {
    const auto it = std::find_if(r.hazards.begin(), r.hazards.end(), [&](const Hazard& h) { return h.kind == kind; });
    if (it != r.hazards.end()) {
      print(*it);
    } else {
      out += fmt::format("{}: {}\n", kind, none);
    }
  }
  for (const Hazard& h : r.hazards) {  // the schedule's own
    if (std::none_of(std::begin(checks), std::end(checks), [&](const auto& c) { return c.first == h.kind; })) print(h);
  }
  return out;
}

}  // namespace rotary
