// The one description of the Spec fields and the schedules (spec_fields.hpp): complete, and the
// source of validate's "is set but ... does not use it" and "needs" rules.
#include "rotary/spec_fields.hpp"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "rotary/error.hpp"
#include "rotary/schedule.hpp"
#include "rotary/spec.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

TEST(SpecFields, EveryScheduleTypeOnceInEnumOrder) {
  const auto& table = schedules();
  ASSERT_EQ(table.size(), static_cast<size_t>(ScheduleType::last) + 1);
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(table[i].type, static_cast<ScheduleType>(i));
    EXPECT_EQ(table[i].name, to_string(table[i].type));
    EXPECT_EQ(parse_schedule(table[i].name), table[i].type);
    EXPECT_EQ(&schedule_info(table[i].type), &table[i]);
    EXPECT_FALSE(table[i].doc.empty());
  }
  EXPECT_ROTARY_ERROR(schedule_info(static_cast<ScheduleType>(42)), "schedule=42 is not a schedule type");
}

TEST(SpecFields, SchedulesNameOnlyScheduleFields) {
  for (const ScheduleInfo& info : schedules()) {
    std::vector<std::string_view> named = info.optional;
    for (const auto& any_of : info.required) named.insert(named.end(), any_of.begin(), any_of.end());
    for (std::string_view name : named) {
      const SpecField* field = find_spec_field(name);
      ASSERT_NE(field, nullptr) << info.name << " names " << name;
      EXPECT_EQ(field->scope, FieldScope::schedule) << name;
      EXPECT_TRUE(schedule_uses(info, *field));
    }
  }
}

// Every Spec member is described: the binding below lists Spec's members (it stops compiling when
// one is added: add the new member to spec_fields() and here), and each registered field, set by
// name, changes the Spec and reads back.
TEST(SpecFields, EverySpecMemberIsDescribedOnce) {
  const Spec spec;
  [[maybe_unused]] const auto& [head_dim, rotary_dim, base, pairing, schedule, factor, original_max_position, max_position,
               beta_fast, beta_slow, mscale, mscale_all_dim, truncate, attention_factor, low_freq_factor,
               high_freq_factor, short_factor, long_factor, max_length, monotone_scale, partial_rotary_factor,
               rotary_offset, blocks, stream_layout, sections, xpos_scale_base, xpos_center] = spec;
  constexpr size_t kMembers = 27;
  EXPECT_EQ(spec_fields().size(), kMembers);
  std::set<std::string_view> names;
  for (const SpecField& field : spec_fields()) {
    EXPECT_TRUE(names.insert(field.name).second) << field.name << " twice";
    EXPECT_FALSE(field.doc.empty()) << field.name;
    EXPECT_EQ(field.choices.empty(), field.kind != FieldKind::choice) << field.name;
  }
  EXPECT_EQ(find_spec_field("nope"), nullptr);
}

// A value of each field's kind that differs from Spec{}'s.
FieldValue sample(const SpecField& field) {
  switch (field.kind) {
    case FieldKind::integer: return int64_t{6};
    case FieldKind::number: return 3.5;
    case FieldKind::boolean: return false;
    case FieldKind::numbers: return std::vector<double>{1.5, 2.5};
    case FieldKind::integers: return std::vector<int64_t>{2, 3};
    case FieldKind::choice: return std::string(field.choices.front() == "default" || field.choices.front() == "single"
                                                   ? field.choices[1]
                                                   : field.choices.front());
  }
  return int64_t{0};
}

TEST(SpecFields, SetByNameChangesTheSpecAndReadsBack) {
  std::set<std::string> changed;
  for (const SpecField& field : spec_fields()) {
    Spec spec;
    EXPECT_EQ(field.get(spec).has_value(), field.name == "head_dim" || field.name == "base" ||
                                               field.kind == FieldKind::choice || field.name == "rotary_offset" ||
                                               field.name == "blocks")
        << field.name;
    const FieldValue value = sample(field);
    set_field(spec, field.name, value);
    EXPECT_NE(spec, Spec{}) << field.name << " set by name left the Spec as it was";
    ASSERT_TRUE(field.is_set(spec)) << field.name;
    EXPECT_EQ(get_field(spec, field.name), value) << field.name;
  }
}

TEST(SpecFields, SetFieldChecksTheKind) {
  Spec spec;
  EXPECT_ROTARY_ERROR(set_field(spec, "factor", std::vector<double>{1}), "factor must be a number, got a list of numbers");
  EXPECT_ROTARY_ERROR(set_field(spec, "head_dim", 1.5), "head_dim must be an integer, got a number");
  EXPECT_ROTARY_ERROR(set_field(spec, "truncate", int64_t{1}), "truncate must be true or false, got an integer");
  EXPECT_ROTARY_ERROR(set_field(spec, "sections", std::vector<double>{1}),
                      "sections must be a list of integers, got a list of numbers");
  EXPECT_ROTARY_ERROR(set_field(spec, "schedule", int64_t{2}), "schedule must be a name, got an integer");
  EXPECT_ROTARY_ERROR(set_field(spec, "base", std::string("x")), "base must be a number, got a name");
  EXPECT_ROTARY_ERROR(set_field(spec, "schedule", std::string("su")), "schedule='su' must be one of default");
  EXPECT_ROTARY_ERROR(set_field(spec, "stream_layout", std::string("mrope")), "stream_layout='mrope' must be one of");
  EXPECT_ROTARY_ERROR(set_field(spec, "pairing", std::string("neox")), "pairing='neox' must be interleaved or half");
  EXPECT_ROTARY_ERROR(set_field(spec, "rotary_dim", int64_t{0}), "rotary_dim=0 must be > 0");
  EXPECT_ROTARY_ERROR(set_field(spec, "factr", 2.0), "'factr' is not a Spec field");
  EXPECT_ROTARY_ERROR(get_field(spec, std::string(200, 'x')), "' is not a Spec field");
  EXPECT_EQ(spec, Spec{});  // nothing stored on error
  // An integer is a number; a list of integers a list of numbers.
  set_field(spec, "factor", int64_t{4});
  EXPECT_EQ(spec.factor, 4.0);
  set_field(spec, "short_factor", std::vector<int64_t>{1, 2});
  EXPECT_EQ(spec.short_factor, std::vector<double>({1.0, 2.0}));
  set_field(spec, "schedule", std::string("proportional"));
  EXPECT_EQ(spec.schedule, ScheduleType::proportional);
}

TEST(SpecFields, CliOptions) {
  EXPECT_EQ(cli_option(*find_spec_field("head_dim")), "--head-dim");
  EXPECT_EQ(cli_option(*find_spec_field("original_max_position")), "--original-max-position");
  EXPECT_EQ(cli_option(*find_spec_field("truncate")), "--no-truncate");
  EXPECT_EQ(cli_option(*find_spec_field("stream_layout")), "--stream-layout");
}

// Values that make every schedule valid on head_dim 8 (rotary_dim/2 = 4 pairs).
Spec with_fields(ScheduleType type, const std::set<std::string_view>& skip) {
  const std::map<std::string_view, FieldValue> values = {
      {"factor", 2.0},          {"original_max_position", int64_t{4096}}, {"max_position", int64_t{8192}},
      {"beta_fast", 32.0},      {"beta_slow", 1.0},                       {"mscale", 1.0},
      {"mscale_all_dim", 1.0},  {"truncate", false},                      {"low_freq_factor", 1.0},
      {"high_freq_factor", 4.0}, {"short_factor", std::vector<double>(4, 1.0)},
      {"long_factor", std::vector<double>(4, 2.0)}, {"max_length", int64_t{1024}},
      {"monotone_scale", 0.001}, {"partial_rotary_factor", 0.5}};
  Spec spec{.head_dim = 8, .schedule = type};
  const ScheduleInfo& info = schedule_info(type);
  std::vector<std::string_view> names = info.optional;
  for (const auto& any_of : info.required) names.insert(names.end(), any_of.begin(), any_of.end());
  for (std::string_view name : names) {
    if (!skip.contains(name)) set_field(spec, name, values.at(name));
  }
  return spec;
}

TEST(SpecFields, ValidateReadsUseAndNeedsFromTheTable) {
  for (const ScheduleInfo& info : schedules()) {
    const Spec full = with_fields(info.type, {});
    EXPECT_NO_THROW(validate(full)) << info.name;
    EXPECT_NO_THROW(make_schedule(full)) << info.name;
    // Each field the schedule does not take is refused by name.
    for (const SpecField& field : spec_fields()) {
      if (schedule_uses(info, field)) continue;
      Spec spec = full;
      set_field(spec, field.name, sample(field));
      EXPECT_ROTARY_ERROR(validate(spec), std::string(field.name) + " is set but schedule " +
                                              std::string(info.name) + " does not use it");
    }
    // Each requirement missing is named, with its alternatives.
    for (const auto& any_of : info.required) {
      std::string names;
      for (std::string_view name : any_of) names += (names.empty() ? "" : " or ") + std::string(name);
      const Spec spec = with_fields(info.type, std::set<std::string_view>(any_of.begin(), any_of.end()));
      EXPECT_ROTARY_ERROR(validate(spec), "schedule " + std::string(info.name) + " needs " + names);
    }
  }
}

TEST(SpecFields, FieldsCopiedByNameGiveTheSameSpec) {
  Spec from = with_fields(ScheduleType::yarn, {});
  from.rotary_dim = 6;
  from.attention_factor = 0.5;
  from.stream_layout = StreamLayout::sections;
  from.sections = {1, 2};
  Spec to;
  for (const SpecField& field : spec_fields()) {
    if (auto value = field.get(from)) set_field(to, field.name, *value);
  }
  EXPECT_EQ(to, from);
}

}  // namespace
}  // namespace rotary
