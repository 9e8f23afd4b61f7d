// rotary — one description of the Spec fields and the schedules, read by validate(Spec), the CLI
// options, the Python keywords and the docs.
//
// Adding a schedule touches these places, and tests/test_schedule_registry.cpp fails while one is
// missing:
//   1. its ScheduleType value (spec.hpp), before `last` (and `last` if it comes last), and its row
//      in the table of fields above struct Spec;
//   2. its file src/schedules/<name>.cpp, one ScheduleEntry (src/schedules/entry.hpp): the
//      ScheduleInfo below (name, doc, the fields it requires and takes, whether it scales each
//      frequency on its own, its rules across fields), its formula, transformers' float32 replay,
//      transformers' rope_type names and rope dict keys with its config reader, and optional doctor
//      hazards; and its two lines in src/schedules/registry.hpp;
//   3. its rotary_schedule_type value in the C ABI (rotary.h; ROTARY_SCHEDULE_LAST if it comes last);
//   4. the list of schedules in the docstring of python/rotary/__init__.py's Rope;
//   5. tests: its formula (test_schedule.cpp), its float32 replay (test_hf_float32.cpp), its config
//      (test_hf_config.cpp), its C enum line in test_schedule_registry.cpp.
// make_schedule, to_string, parse_schedule, validate, the config reader, the doctor, the CLI
// options and the Python keywords read the registry.
// A new Spec field adds its member to Spec and one entry to the spec_fields() table (name, kind,
// scope, doc line, config key, accessor and its own range rule), and its member in the C ABI's
// rotary_spec or rotary_spec_ext with its line in to_spec (src/c_api/c_api.cpp); the schedules that use it
// name it. Validation, parse_schedule, the CLI options and the Python keywords follow from the tables.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "rotary/spec.hpp"

namespace rotary {

/// What a field holds, as a front end parses it.
enum class FieldKind {
  integer,   ///< int64_t                 CLI: an integer       Python: int
  number,    ///< double                  CLI: a number         Python: float (or int)
  boolean,   ///< bool, default true      CLI: --no-NAME flag   Python: bool
  numbers,   ///< std::vector<double>     CLI: a,b,c            Python: a sequence of numbers
  integers,  ///< std::vector<int64_t>    CLI: a,b,c            Python: a sequence of ints
  choice,    ///< one of SpecField::choices, an enum member      CLI and Python: its name
};
std::string_view to_string(FieldKind kind);

/// A value for a field, as set_field takes it and get_field returns it. The alternative follows the
/// field's kind: integer int64_t, number double (set_field takes an int64_t too), boolean bool,
/// numbers std::vector<double> (set_field takes std::vector<int64_t> too), integers
/// std::vector<int64_t>, choice std::string (the name, e.g. "yarn").
using FieldValue =
    std::variant<int64_t, double, bool, std::vector<double>, std::vector<int64_t>, std::string>;

/// Which Specs use a field.
enum class FieldScope {
  common,    ///< every Spec
  schedule,  ///< the schedules whose ScheduleInfo names it (required or optional); set elsewhere,
             ///< "NAME is set but schedule S does not use it"
  streams,   ///< stream layouts other than single (sections); set with single,
             ///< "NAME is set but stream_layout single does not use it"
};

/// One Spec member. Its name is the C++ member, the Python keyword and the name in error messages;
/// cli_option(field) is its command-line option.
struct SpecField {
  std::string_view name;
  FieldKind kind;
  FieldScope scope;
  bool required;                          ///< every Spec must set it (head_dim)
  std::string_view doc;                   ///< one line, with the default, for --help and docstrings
  std::string_view config_key;            ///< transformers' config key it is read from, "" if none
                                          ///< (a schedule's config reader reads its fields from the
                                          ///< rope dict by this key)
  std::vector<std::string_view> choices;  ///< choice: the accepted names in enum order, else empty
  /// The field's value; nullopt when unset (an empty optional, an empty list, rotary_dim 0 which
  /// follows head_dim). The other plain members (head_dim, base, pairing, ...) always have one.
  std::optional<FieldValue> (*get)(const Spec&);
  /// get(spec).has_value(), without copying the value.
  bool (*is_set)(const Spec&);
  /// Stores a value of the kind's own alternative (set_field converts and checks it first); a
  /// choice's name is parsed, throwing rotary::Error on an unknown one.
  void (*set)(Spec&, const FieldValue&);
  /// The field's own rule on its value, e.g. "factor=-2 must be > 0" (`name` is this field's name);
  /// validate calls it for every common field and for the other fields when set. nullptr: none.
  /// Rules across fields belong to ScheduleInfo::check or to the stream layout's rules.
  void (*check)(const Spec&, std::string_view name);
};

/// One schedule: what validate requires of a Spec that names it (the public part of the schedule's
/// entry in the library's registry, src/schedules/).
struct ScheduleInfo {
  std::string_view name;  ///< to_string(type): the CLI's --schedule, Python's schedule=
  ScheduleType type;
  std::string_view doc;   ///< one line
  /// Each entry is a set of field names of which at least one must be set ("schedule S needs A or
  /// B" otherwise), e.g. {"original_max_position", "max_position"}.
  std::vector<std::vector<std::string_view>> required;
  std::vector<std::string_view> optional;  ///< schedule-scoped fields it takes besides
  /// Scales each frequency on its own (by its value or its pair), so it composes with the stream
  /// layouts whose frequencies restart per axis (axial, axial_even_odd). Schedules whose formula
  /// depends on the pair index over rotary_dim (ntk, dynamic, yarn, proportional) do not.
  bool per_frequency;
  /// Its rules across fields (e.g. beta_fast > beta_slow), after requirements; nullptr: none.
  void (*check)(const Spec&);
};

/// Every Spec member, once, in the order --help lists them. Static storage; thread-safe.
const std::vector<SpecField>& spec_fields();
/// Every ScheduleType, once, in enum order: schedules()[i].type == ScheduleType(i).
const std::vector<ScheduleInfo>& schedules();
/// The entry of `type`; throws rotary::Error when it is not a ScheduleType.
const ScheduleInfo& schedule_info(ScheduleType type);
/// The field named `name`, or nullptr.
const SpecField* find_spec_field(std::string_view name);
/// Whether `schedule` takes field `field_name` (a common field, or a schedule-scoped field its
/// ScheduleInfo names; a streams field: yes).
bool schedule_uses(const ScheduleInfo& schedule, const SpecField& field);

/// Sets the field named `name`. Throws rotary::Error "'NAME' is not a Spec field" for an unknown
/// name, "NAME must be KIND, got KIND" for a value of another kind (e.g. "factor must be a number,
/// got a list of numbers"), "rotary_dim=0 must be > 0" (0 is how a Spec says "head_dim", not a
/// width), and the parse error of a choice ("schedule='su' must be one of ..."). It does not
/// validate the Spec: validate() does, with every field set.
void set_field(Spec& spec, std::string_view name, const FieldValue& value);
/// The value of the field named `name` (see SpecField::get); throws on an unknown name.
std::optional<FieldValue> get_field(const Spec& spec, std::string_view name);
/// The command-line option of a field: "--" + name with '-' for '_'; a boolean (default true)
/// gives "--no-NAME", which sets it to false ("--no-truncate").
std::string cli_option(const SpecField& field);

}  // namespace rotary
