#include "rotary/spec.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "rotary/error.hpp"
#include "rotary/spec_fields.hpp"
#include "schedules/registry.hpp"
#include "text.hpp"

namespace rotary {
namespace {

// sections as an error message shows them: "[16,24,20]", at most ~100 characters of them.
std::string describe_sections(const std::vector<int64_t>& sections) {
  std::string out = "[";
  for (size_t a = 0; a < sections.size(); ++a) {
    if (out.size() > 100) return out + fmt::format("...] ({} values)", sections.size());
    out += fmt::format("{}{}", a == 0 ? "" : ",", sections[a]);
  }
  return out + "]";
}

// "a, b, c" of the schedules that compose with the axial layouts.
std::string per_frequency_schedules() {
  std::string out;
  for (const ScheduleInfo& info : schedules()) {
    if (info.per_frequency) out += fmt::format("{}{}", out.empty() ? "" : ", ", info.name);
  }
  return out;
}

void check_stream_counts(const Spec& spec, int64_t pairs) {
  const StreamLayout layout = spec.stream_layout;
  const auto& sections = spec.sections;
  const auto count = static_cast<int64_t>(sections.size());
  const std::string shown = describe_sections(sections);
  if (layout == StreamLayout::alternating_sections && count != 3) {
    throw Error(fmt::format("sections={} must list 3 streams [height, width, time] for stream_layout "
                            "alternating_sections", shown), "sections");
  }
  if (layout == StreamLayout::axial_even_odd && count != 2) {
    throw Error(fmt::format("sections={} must list 2 streams [height, width] for stream_layout axial_even_odd",
                            shown), "sections");
  }
  if (count < 2 || count > max_streams) {
    throw Error(fmt::format("sections={} lists {} streams; stream_layout {} needs 2 to {}", shown, count,
                            to_string(layout), max_streams), "sections");
  }
  int64_t sum = 0;
  for (const int64_t s : sections) {
    if (__builtin_add_overflow(sum, s, &sum)) {
      throw Error(fmt::format("sections={} sum past 2^63 but rotary_dim/2={}", shown, pairs), "sections");
    }
  }
  if (sum != pairs) throw Error(fmt::format("sections={} sum to {} but rotary_dim/2={}", shown, sum, pairs), "sections");
}

// Qwen3-VL's overwrite gives stream a >= 1 the pairs j % S == a below S * s_a (clipped to P): each
// stream must get exactly its section's count, or the sections do not describe the map.
void check_interleaved_counts(const Spec& spec, int64_t pairs) {
  const auto streams = static_cast<int64_t>(spec.sections.size());
  for (int64_t a = 1; a < streams; ++a) {
    const int64_t wanted = spec.sections[static_cast<size_t>(a)];
    const int64_t end = std::min(pairs, streams * wanted);  // wanted <= pairs: the sum was checked
    const int64_t got = end > a ? (end - a + streams - 1) / streams : 0;
    if (got != wanted) {
      throw Error(fmt::format("sections={} do not interleave over rotary_dim/2={}: stream {} (pairs j % {} == {} "
                              "below {}*{}) gets {} pairs, not {}",
                              describe_sections(spec.sections), pairs, a, streams, a, streams, wanted, got,
                              wanted), "sections");
    }
  }
}

// The stream layout's rules on sections (their values are checked as a field).
void check_stream_layout_rules(const Spec& spec) {
  const StreamLayout layout = spec.stream_layout;
  if (layout == StreamLayout::single) return;
  if (spec.sections.empty()) throw Error(fmt::format("stream_layout {} needs sections", to_string(layout)), "stream_layout");
  const int64_t pairs = spec.resolved_rotary_dim() / 2;
  check_stream_counts(spec, pairs);
  const auto& s = spec.sections;
  if (layout == StreamLayout::interleaved_sections) check_interleaved_counts(spec, pairs);
  if (layout == StreamLayout::alternating_sections && s[0] != s[1]) {
    throw Error(fmt::format("sections={}: height {} and width {} must be equal for stream_layout "
                            "alternating_sections (their pairs alternate)",
                            describe_sections(s), s[0], s[1]), "sections");
  }
  if (layout == StreamLayout::axial_even_odd && s[0] != s[1]) {
    throw Error(fmt::format("sections={}: stream_layout axial_even_odd needs two equal sections (even "
                            "frequencies to one axis, odd to the other)",
                            describe_sections(s)), "sections");
  }
  const ScheduleInfo& info = schedule_info(spec.schedule);
  if ((layout == StreamLayout::axial || layout == StreamLayout::axial_even_odd) && !info.per_frequency) {
    throw Error(fmt::format("schedule {} cannot be used with stream_layout {}: it does not scale each "
                            "frequency on its own (those that do: {})",
                            info.name, to_string(layout), per_frequency_schedules()), "schedule");
  }
}

// "schedule S needs A" or "... needs A or B".
void check_required(const Spec& spec, const ScheduleInfo& info) {
  for (const auto& any_of : info.required) {
    bool given = false;
    for (std::string_view name : any_of) given = given || find_spec_field(name)->is_set(spec);
    if (given) continue;
    std::string names;
    for (std::string_view name : any_of) names += fmt::format("{}{}", names.empty() ? "" : " or ", name);
    throw Error(fmt::format("schedule {} needs {}", info.name, names), "schedule");
  }
}

}  // namespace

int64_t Spec::original_length() const {
  if (original_max_position) return *original_max_position;
  if (max_position) return *max_position;
  return 0;
}

std::string_view to_string(Pairing pairing) {
  return pairing == Pairing::interleaved ? "interleaved" : "half";
}

std::string_view to_string(ScheduleType schedule) {
  const auto index = static_cast<int64_t>(schedule);
  if (index < 0 || index >= static_cast<int64_t>(detail::kScheduleEntries.size())) return "?";
  return detail::kScheduleEntries[static_cast<size_t>(index)]().info.name;
}

std::string_view to_string(StreamLayout layout) {
  switch (layout) {
    case StreamLayout::single: return "single";
    case StreamLayout::sections: return "sections";
    case StreamLayout::interleaved_sections: return "interleaved_sections";
    case StreamLayout::alternating_sections: return "alternating_sections";
    case StreamLayout::axial: return "axial";
    case StreamLayout::axial_even_odd: return "axial_even_odd";
  }
  return "?";
}

Pairing parse_pairing(std::string_view text, std::string_view what) {
  if (text == "interleaved") return Pairing::interleaved;
  if (text == "half") return Pairing::half;
  throw Error(fmt::format("{}='{}' must be interleaved or half", what, detail::excerpt(text)));
}

ScheduleType parse_schedule(std::string_view text, std::string_view what) {
  std::string names;
  for (const ScheduleInfo& info : schedules()) {
    if (text == info.name) return info.type;
    names += fmt::format("{}{}", names.empty() ? "" : ", ", info.name);
  }
  throw Error(fmt::format("{}='{}' must be one of {}", what, detail::excerpt(text), names));
}

StreamLayout parse_stream_layout(std::string_view text, std::string_view what) {
  std::string names;
  for (int i = 0; i <= static_cast<int>(StreamLayout::axial_even_odd); ++i) {
    const auto layout = static_cast<StreamLayout>(i);
    if (text == to_string(layout)) return layout;
    names += fmt::format("{}{}", names.empty() ? "" : ", ", to_string(layout));
  }
  throw Error(fmt::format("{}='{}' must be one of {}", what, detail::excerpt(text), names));
}

void validate(const Spec& spec) {
  const auto& fields = spec_fields();
  for (const SpecField& field : fields) {
    if (field.scope == FieldScope::common && field.check) field.check(spec, field.name);
  }
  const ScheduleInfo& info = schedule_info(spec.schedule);
  for (const SpecField& field : fields) {
    if (field.scope == FieldScope::common || !field.is_set(spec)) continue;
    if (field.scope == FieldScope::streams && spec.stream_layout == StreamLayout::single) {
      throw Error(fmt::format("{} is set but stream_layout single does not use it", field.name), std::string(field.name));
    }
    if (!schedule_uses(info, field)) {
      throw Error(fmt::format("{} is set but schedule {} does not use it", field.name, info.name), std::string(field.name));
    }
  }
  for (const SpecField& field : fields) {
    if (field.scope != FieldScope::common && field.check && field.is_set(spec)) field.check(spec, field.name);
  }
  check_required(spec, info);
  if (info.check) info.check(spec);
  check_stream_layout_rules(spec);
}

}  // namespace rotary
