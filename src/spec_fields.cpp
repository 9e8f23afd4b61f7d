// The tables of spec_fields.hpp: every Spec field, once, and the schedules of the registry
// (src/schedules/registry.hpp).
#include "rotary/spec_fields.hpp"

#include <cmath>
#include <type_traits>

#include <fmt/format.h>

#include "rotary/error.hpp"
#include "schedules/registry.hpp"
#include "text.hpp"

namespace rotary {
namespace {

// ---- A FieldValue read as one kind ---------------------------------------------------------------

std::string_view kind_phrase(FieldKind kind) {
  switch (kind) {
    case FieldKind::integer: return "an integer";
    case FieldKind::number: return "a number";
    case FieldKind::boolean: return "true or false";
    case FieldKind::numbers: return "a list of numbers";
    case FieldKind::integers: return "a list of integers";
    case FieldKind::choice: return "a name";
  }
  return "?";
}

// What a value holds, in the words of kind_phrase (FieldValue's alternatives in order).
std::string_view value_phrase(const FieldValue& value) {
  static constexpr std::string_view phrases[] = {"an integer", "a number", "true or false",
                                                 "a list of numbers", "a list of integers", "a name"};
  return phrases[value.index()];
}

// `value` as the alternative of `kind` (an integer is a number; a list of integers a list of
// numbers); throws naming the field otherwise.
FieldValue normalized(std::string_view name, FieldKind kind, const FieldValue& value) {
  if (kind == FieldKind::number && std::holds_alternative<int64_t>(value)) {
    return static_cast<double>(std::get<int64_t>(value));
  }
  if (kind == FieldKind::numbers && std::holds_alternative<std::vector<int64_t>>(value)) {
    const auto& items = std::get<std::vector<int64_t>>(value);
    return std::vector<double>(items.begin(), items.end());
  }
  // FieldKind's members name FieldValue's alternatives in order.
  if (value.index() != static_cast<size_t>(kind)) {
    throw Error(fmt::format("{} must be {}, got {}", name, kind_phrase(kind), value_phrase(value)), std::string(name));
  }
  return value;
}

// ---- Members to and from FieldValue --------------------------------------------------------------

template <class T>
std::optional<FieldValue> to_value(const std::optional<T>& member) {
  if (!member) return std::nullopt;
  return FieldValue(std::in_place_type<T>, *member);
}
template <class T>
std::optional<FieldValue> to_value(const std::vector<T>& member) {
  if (member.empty()) return std::nullopt;
  return FieldValue(std::in_place_type<std::vector<T>>, member);
}
std::optional<FieldValue> to_value(int64_t member) { return FieldValue(std::in_place_type<int64_t>, member); }
std::optional<FieldValue> to_value(double member) { return FieldValue(std::in_place_type<double>, member); }
template <class E>
  requires std::is_enum_v<E>
std::optional<FieldValue> to_value(E member) {
  return FieldValue(std::string(to_string(member)));
}

template <class T>
void from_value(std::optional<T>& member, const FieldValue& value) { member = std::get<T>(value); }
template <class T>
void from_value(std::vector<T>& member, const FieldValue& value) {
  member = std::get<std::vector<T>>(value);
}
void from_value(int64_t& member, const FieldValue& value) { member = std::get<int64_t>(value); }
void from_value(double& member, const FieldValue& value) { member = std::get<double>(value); }
void from_value(Pairing& member, const FieldValue& value) {
  member = parse_pairing(std::get<std::string>(value));
}
void from_value(ScheduleType& member, const FieldValue& value) {
  member = parse_schedule(std::get<std::string>(value));
}
void from_value(StreamLayout& member, const FieldValue& value) {
  member = parse_stream_layout(std::get<std::string>(value));
}

template <class T>
bool has_value(const std::optional<T>& member) { return member.has_value(); }
template <class T>
bool has_value(const std::vector<T>& member) { return !member.empty(); }
template <class T>
bool has_value(const T&) { return true; }

template <auto Member>
std::optional<FieldValue> get_member(const Spec& spec) { return to_value(spec.*Member); }
template <auto Member>
bool is_set_member(const Spec& spec) { return has_value(spec.*Member); }
template <auto Member>
void set_member(Spec& spec, const FieldValue& value) { from_value(spec.*Member, value); }

// rotary_dim 0 follows head_dim: unset, and never set by name.
std::optional<FieldValue> get_rotary_dim(const Spec& spec) {
  if (spec.rotary_dim == 0) return std::nullopt;
  return FieldValue(spec.rotary_dim);
}
bool rotary_dim_is_set(const Spec& spec) { return spec.rotary_dim != 0; }
void set_rotary_dim(Spec& spec, const FieldValue& value) {
  const int64_t r = std::get<int64_t>(value);
  if (r == 0) throw Error("rotary_dim=0 must be > 0", "rotary_dim");
  spec.rotary_dim = r;
}

// ---- The fields' own rules (validate calls them; `name` is the field's) --------------------------

void require_finite(double value, std::string_view name) {
  if (!std::isfinite(value)) throw Error(fmt::format("{}={} must be finite", name, value), std::string(name));
}

// Optional fields' rules run only when the field is set: the optional holds a value.
template <auto Member>
void check_positive(const Spec& spec, std::string_view name) {
  const double value = *(spec.*Member);
  require_finite(value, name);
  if (value <= 0) throw Error(fmt::format("{}={} must be > 0", name, value), std::string(name));
}

template <auto Member>
void check_finite(const Spec& spec, std::string_view name) { require_finite(*(spec.*Member), name); }

template <auto Member>
void check_length(const Spec& spec, std::string_view name) {
  if (*(spec.*Member) < 1) throw Error(fmt::format("{}={} must be >= 1", name, *(spec.*Member)), std::string(name));
}

void check_head_dim(const Spec& spec, std::string_view) {
  if (spec.head_dim <= 0) throw Error(fmt::format("head_dim={} must be > 0", spec.head_dim), "head_dim");
  if (spec.head_dim > (int64_t{1} << 20)) {
    throw Error(fmt::format("head_dim={} exceeds 1048576", spec.head_dim), "head_dim");
  }
}

void check_rotary_dim(const Spec& spec, std::string_view) {
  if (spec.rotary_dim < 0) throw Error(fmt::format("rotary_dim={} must be > 0", spec.rotary_dim), "rotary_dim");
  const int64_t r = spec.resolved_rotary_dim();
  if (r % 2 != 0) {
    throw Error(fmt::format("rotary_dim={} must be even and <= head_dim={}", r, spec.head_dim), "rotary_dim");
  }
  if (r > spec.head_dim) throw Error(fmt::format("rotary_dim={} exceeds head_dim={}", r, spec.head_dim), "rotary_dim");
}

void check_base(const Spec& spec, std::string_view) {
  require_finite(spec.base, "base");
  if (spec.base <= 1) throw Error(fmt::format("base={} must be > 1", spec.base), "base");
}

template <class E>
void require_enum(E value, E last, std::string_view name, std::string_view what) {
  const auto v = static_cast<int64_t>(value);
  if (v < 0 || v > static_cast<int64_t>(last)) throw Error(fmt::format("{}={} is not {}", name, v, what), std::string(name));
}

void check_pairing(const Spec& spec, std::string_view name) {
  require_enum(spec.pairing, Pairing::half, name, "interleaved or half");
}
void check_schedule(const Spec& spec, std::string_view name) {
  require_enum(spec.schedule, ScheduleType::last, name, "a schedule type");
}
void check_stream_layout(const Spec& spec, std::string_view name) {
  require_enum(spec.stream_layout, StreamLayout::axial_even_odd, name, "a stream layout");
}

// cos and sin times the factor are stored as float32: it must be a normal float32.
void check_attention_factor(const Spec& spec, std::string_view name) {
  if (!spec.attention_factor) return;
  check_positive<&Spec::attention_factor>(spec, name);
  const double g = *spec.attention_factor;
  if (g >= min_attention_factor && g <= max_attention_factor) return;
  throw Error(fmt::format("{}={} must round to a normal float32, in [2^-126, 3.40282347e+38] (cos and sin "
                          "times it are stored as float32)",
                          name, g), std::string(name));
}

void check_max_length(const Spec& spec, std::string_view name) {
  const int64_t n = *spec.max_length;
  if (n < 2 || n > max_position_limit) throw Error(fmt::format("{}={} must be in [2, 2^31]", name, n), std::string(name));
}

void check_partial_rotary_factor(const Spec& spec, std::string_view name) {
  const double p = *spec.partial_rotary_factor;
  if (!(p > 0 && p <= 1)) throw Error(fmt::format("{}={} must be in (0, 1]", name, p), std::string(name));
}

// The texts of validate(Schedule) (src/descriptor.cpp), which sees the same fields.
void check_rotary_offset(const Spec& spec, std::string_view) {
  const int64_t room = spec.head_dim - spec.resolved_rotary_dim();
  if (spec.rotary_offset < 0 || spec.rotary_offset > room) {
    throw Error(fmt::format("rotary_offset={} must be in [0, head_dim - rotary_dim = {}]",
                            spec.rotary_offset, room), "rotary_offset");
  }
}

// xPos: a common field, checked whether set or not (common fields' rules always run).
void check_xpos_scale_base(const Spec& spec, std::string_view name) {
  if (spec.xpos_scale_base) check_positive<&Spec::xpos_scale_base>(spec, name);
}
void check_xpos_center(const Spec& spec, std::string_view name) {
  if (!spec.xpos_center) return;
  require_finite(*spec.xpos_center, name);
  if (!spec.xpos_scale_base) throw Error(fmt::format("{} is set but xpos_scale_base is not", name), std::string(name));
}

void check_blocks(const Spec& spec, std::string_view) {
  const int64_t blocks = spec.blocks;
  if (blocks < 1) throw Error(fmt::format("blocks={} must be >= 1", blocks), "blocks");
  if (blocks == 1) return;
  if (spec.pairing != Pairing::half) {
    throw Error(fmt::format("blocks={} needs pairing half (block_half), not {}", blocks,
                            to_string(spec.pairing)), "blocks");
  }
  const int64_t pairs = spec.resolved_rotary_dim() / 2;
  if (pairs % blocks != 0) {
    throw Error(fmt::format("blocks={} must divide rotary_dim/2={} (block_half: equal blocks of "
                            "half-paired channels)", blocks, pairs), "blocks");
  }
}

void check_sections(const Spec& spec, std::string_view name) {
  for (size_t a = 0; a < spec.sections.size(); ++a) {
    if (spec.sections[a] <= 0) throw Error(fmt::format("{}[{}]={} must be > 0", name, a, spec.sections[a]), std::string(name));
  }
}

// ---- The tables ----------------------------------------------------------------------------------

std::vector<std::string_view> schedule_names() {
  std::vector<std::string_view> names;
  for (int t = 0; t <= static_cast<int>(ScheduleType::last); ++t) {
    names.push_back(to_string(static_cast<ScheduleType>(t)));
  }
  return names;
}

std::vector<std::string_view> stream_layout_names() {
  std::vector<std::string_view> names;
  for (int t = 0; t <= static_cast<int>(StreamLayout::axial_even_odd); ++t) {
    names.push_back(to_string(static_cast<StreamLayout>(t)));
  }
  return names;
}

std::vector<SpecField> make_spec_fields() {
  using enum FieldKind;
  using enum FieldScope;
  return {
      {"head_dim", integer, common, true, "head_dim D: width of one attention head, in [1, 2^20] (required)",
       "head_dim", {}, get_member<&Spec::head_dim>, is_set_member<&Spec::head_dim>, set_member<&Spec::head_dim>, check_head_dim},
      {"rotary_dim", integer, common, false, "rotary_dim R: rotated channels, even, <= head_dim (default: head_dim)",
       "rotary_dim", {}, get_rotary_dim, rotary_dim_is_set, set_rotary_dim, check_rotary_dim},
      {"base", number, common, false, "base (rope_theta), finite and > 1 (default 10000)", "rope_theta", {},
       get_member<&Spec::base>, is_set_member<&Spec::base>, set_member<&Spec::base>, check_base},
      {"pairing", choice, common, false, "how channels pair: interleaved or half (default half)", "",
       {"interleaved", "half"}, get_member<&Spec::pairing>, is_set_member<&Spec::pairing>, set_member<&Spec::pairing>, check_pairing},
      {"schedule", choice, common, false, "how inv_freq is derived (default default)", "rope_type",
       schedule_names(), get_member<&Spec::schedule>, is_set_member<&Spec::schedule>, set_member<&Spec::schedule>, check_schedule},
      {"factor", number, schedule, false, "scaling factor s > 0", "factor", {}, get_member<&Spec::factor>, is_set_member<&Spec::factor>,
       set_member<&Spec::factor>, check_positive<&Spec::factor>},
      {"original_max_position", integer, schedule, false, "L: original_max_position_embeddings, >= 1",
       "original_max_position_embeddings", {}, get_member<&Spec::original_max_position>, is_set_member<&Spec::original_max_position>,
       set_member<&Spec::original_max_position>, check_length<&Spec::original_max_position>},
      {"max_position", integer, schedule, false, "M: max_position_embeddings, >= 1", "max_position_embeddings",
       {}, get_member<&Spec::max_position>, is_set_member<&Spec::max_position>, set_member<&Spec::max_position>, check_length<&Spec::max_position>},
      {"beta_fast", number, schedule, false, "yarn beta_fast >= beta_slow (default 32)", "beta_fast", {},
       get_member<&Spec::beta_fast>, is_set_member<&Spec::beta_fast>, set_member<&Spec::beta_fast>, check_positive<&Spec::beta_fast>},
      {"beta_slow", number, schedule, false, "yarn beta_slow > 0 (default 1)", "beta_slow", {},
       get_member<&Spec::beta_slow>, is_set_member<&Spec::beta_slow>, set_member<&Spec::beta_slow>, check_positive<&Spec::beta_slow>},
      {"mscale", number, schedule, false, "yarn mscale, finite", "mscale", {}, get_member<&Spec::mscale>, is_set_member<&Spec::mscale>,
       set_member<&Spec::mscale>, check_finite<&Spec::mscale>},
      {"mscale_all_dim", number, schedule, false, "yarn mscale_all_dim, finite", "mscale_all_dim", {},
       get_member<&Spec::mscale_all_dim>, is_set_member<&Spec::mscale_all_dim>, set_member<&Spec::mscale_all_dim>, check_finite<&Spec::mscale_all_dim>},
      {"truncate", boolean, schedule, false, "yarn: round the ramp ends (default true)", "truncate", {},
       get_member<&Spec::truncate>, is_set_member<&Spec::truncate>, set_member<&Spec::truncate>, nullptr},
      {"attention_factor", number, common, false,
       "explicit attention factor, a normal float32 > 0 (default: the schedule's)", "attention_factor", {},
       get_member<&Spec::attention_factor>, is_set_member<&Spec::attention_factor>, set_member<&Spec::attention_factor>, check_attention_factor},
      {"low_freq_factor", number, schedule, false, "llama3 low_freq_factor > 0, <= high_freq_factor",
       "low_freq_factor", {}, get_member<&Spec::low_freq_factor>, is_set_member<&Spec::low_freq_factor>, set_member<&Spec::low_freq_factor>,
       check_positive<&Spec::low_freq_factor>},
      {"high_freq_factor", number, schedule, false, "llama3 high_freq_factor > 0", "high_freq_factor", {},
       get_member<&Spec::high_freq_factor>, is_set_member<&Spec::high_freq_factor>, set_member<&Spec::high_freq_factor>,
       check_positive<&Spec::high_freq_factor>},
      {"short_factor", numbers, schedule, false, "longrope short factors (rotary_dim/2 values > 0)",
       "short_factor", {}, get_member<&Spec::short_factor>, is_set_member<&Spec::short_factor>, set_member<&Spec::short_factor>, nullptr},
      {"long_factor", numbers, schedule, false, "longrope long factors (rotary_dim/2 values > 0)", "long_factor",
       {}, get_member<&Spec::long_factor>, is_set_member<&Spec::long_factor>, set_member<&Spec::long_factor>, nullptr},
      {"max_length", integer, schedule, false, "monotone: max length N, in [2, 2^31]", "", {},
       get_member<&Spec::max_length>, is_set_member<&Spec::max_length>, set_member<&Spec::max_length>, check_max_length},
      {"monotone_scale", number, schedule, false, "monotone: the constant c > 0 (default: largest allowed)", "",
       {}, get_member<&Spec::monotone_scale>, is_set_member<&Spec::monotone_scale>, set_member<&Spec::monotone_scale>,
       check_positive<&Spec::monotone_scale>},
      {"partial_rotary_factor", number, schedule, false,
       "proportional: fraction p in (0, 1] of the head's pairs that turn", "partial_rotary_factor", {},
       get_member<&Spec::partial_rotary_factor>, is_set_member<&Spec::partial_rotary_factor>, set_member<&Spec::partial_rotary_factor>,
       check_partial_rotary_factor},
      {"rotary_offset", integer, common, false,
       "first rotated channel, in [0, head_dim - rotary_dim] (default 0; head_dim - rotary_dim: slice last)", "",
       {}, get_member<&Spec::rotary_offset>, is_set_member<&Spec::rotary_offset>, set_member<&Spec::rotary_offset>, check_rotary_offset},
      {"blocks", integer, common, false, "blocks of half-paired channels, >= 1 (default 1; 2: Gemma 4 vision)", "",
       {}, get_member<&Spec::blocks>, is_set_member<&Spec::blocks>, set_member<&Spec::blocks>, check_blocks},
      {"stream_layout", choice, common, false, "which position stream drives each pair (default single)", "",
       stream_layout_names(), get_member<&Spec::stream_layout>, is_set_member<&Spec::stream_layout>, set_member<&Spec::stream_layout>,
       check_stream_layout},
      {"xpos_scale_base", number, common, false,
       "xPos scale base gamma > 0: q and k scaled by zeta^(+-(p - c)/gamma) (default: no xPos)", "", {},
       get_member<&Spec::xpos_scale_base>, is_set_member<&Spec::xpos_scale_base>, set_member<&Spec::xpos_scale_base>,
       check_xpos_scale_base},
      {"xpos_center", number, common, false, "xPos centre c, finite (default 0)", "", {},
       get_member<&Spec::xpos_center>, is_set_member<&Spec::xpos_center>, set_member<&Spec::xpos_center>,
       check_xpos_center},
      {"sections", integers, streams, false, "pairs per position stream, each > 0 (mrope_section)",
       "mrope_section", {}, get_member<&Spec::sections>, is_set_member<&Spec::sections>, set_member<&Spec::sections>, check_sections},
  };
}

}  // namespace

std::string_view to_string(FieldKind kind) {
  switch (kind) {
    case FieldKind::integer: return "integer";
    case FieldKind::number: return "number";
    case FieldKind::boolean: return "boolean";
    case FieldKind::numbers: return "numbers";
    case FieldKind::integers: return "integers";
    case FieldKind::choice: return "choice";
  }
  return "?";
}

const std::vector<SpecField>& spec_fields() {
  static const std::vector<SpecField> fields = make_spec_fields();
  return fields;
}

const std::vector<ScheduleInfo>& schedules() {
  static const std::vector<ScheduleInfo> table = [] {
    std::vector<ScheduleInfo> infos;
    for (const auto entry : detail::kScheduleEntries) infos.push_back(entry().info);
    return infos;
  }();
  return table;
}

const ScheduleInfo& schedule_info(ScheduleType type) {
  const auto index = static_cast<int64_t>(type);
  if (index < 0 || index >= static_cast<int64_t>(schedules().size())) {
    throw Error(fmt::format("schedule={} is not a schedule type", index), "schedule");
  }
  return schedules()[static_cast<size_t>(index)];
}

const SpecField* find_spec_field(std::string_view name) {
  for (const SpecField& field : spec_fields()) {
    if (field.name == name) return &field;
  }
  return nullptr;
}

bool schedule_uses(const ScheduleInfo& schedule, const SpecField& field) {
  if (field.scope != FieldScope::schedule) return true;
  for (const auto& any_of : schedule.required) {
    for (std::string_view name : any_of) {
      if (name == field.name) return true;
    }
  }
  for (std::string_view name : schedule.optional) {
    if (name == field.name) return true;
  }
  return false;
}

namespace {
const SpecField& field_named(std::string_view name) {
  const SpecField* field = find_spec_field(name);
  if (!field) throw Error(fmt::format("'{}' is not a Spec field", detail::excerpt(name)));
  return *field;
}
}  // namespace

void set_field(Spec& spec, std::string_view name, const FieldValue& value) {
  const SpecField& field = field_named(name);
  field.set(spec, normalized(field.name, field.kind, value));
}

std::optional<FieldValue> get_field(const Spec& spec, std::string_view name) {
  return field_named(name).get(spec);
}

std::string cli_option(const SpecField& field) {
  std::string option(field.kind == FieldKind::boolean ? "--no-" : "--");
  for (const char c : field.name) option.push_back(c == '_' ? '-' : c);
  return option;
}

}  // namespace rotary
