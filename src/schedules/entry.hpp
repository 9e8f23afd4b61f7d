// Internal: one schedule, whole — what validate requires of a Spec that names it, its formula, its
// replay of transformers' float32 arithmetic, how a transformers config names it and which keys of
// the rope dict it reads, and what the doctor says about it. Each schedule is one such entry in its
// own file (src/schedules/<name>.cpp); registry.hpp lists them in ScheduleType order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rotary/doctor.hpp"
#include "rotary/spec.hpp"
#include "rotary/spec_fields.hpp"

namespace rotary::detail {

/// What a schedule derives from a Spec at a sequence length (DESIGN.md §2).
struct Frequencies {
  std::vector<double> inv_freq;   ///< rotary_dim/2 values (make_schedule checks them)
  double attention_factor = 1.0;  ///< the computed factor; an explicit Spec::attention_factor wins
};

/// A transformers rope dict (rope_scaling, rope_parameters or one layer type's entry) as a
/// schedule's config reader sees it; src/config/hf_config.cpp implements it over the JSON. A JSON null
/// counts as absent (Python's None); errors name the key as the config writes it, e.g.
/// "rope_scaling.factor='x' must be a number".
class RopeDict {
 public:
  virtual ~RopeDict() = default;
  /// How errors name the dict's keys: "rope_scaling.", "rope_parameters.full_attention.", ...
  virtual const std::string& prefix() const = 0;
  virtual bool has(std::string_view key) const = 0;
  /// Sets the Spec field named `field` from the key SpecField::config_key, read as its FieldKind
  /// says (integer, number, boolean or numbers); an absent key leaves the field as it is.
  virtual void read(Spec& spec, std::string_view field) const = 0;
  virtual std::optional<double> number(std::string_view key) const = 0;
  /// An integer at the top level of the language model's config (Phi-3 keeps
  /// original_max_position_embeddings there).
  virtual std::optional<int64_t> config_integer(std::string_view key) const = 0;
  /// The config's max_position_embeddings; throws "max_position_embeddings is missing (WHY needs it)".
  virtual int64_t max_position(std::string_view why) const = 0;
  /// A finding for ModelRope::notes.
  virtual void note(std::string text) = 0;
};

/// One schedule. The function members are plain pointers; nullptr where the comment allows it.
struct ScheduleEntry {
  /// Name, doc line, the fields it requires and takes, whether it composes with the axial stream
  /// layouts, its rules across fields (spec_fields.hpp; schedules() and validate read it).
  ScheduleInfo info;

  /// The formula: inv_freq and the computed attention factor of a Spec that passed validate, at
  /// `seq_len` (unset: n <= L). The unscaled frequencies come from unscaled_inv_freq (common.hpp),
  /// which lays them out for the stream layout. Throws rotary::Error naming the value when the
  /// settings give no usable frequencies (make_schedule checks the rest).
  Frequencies (*derive)(const Spec& spec, std::optional<int64_t> seq_len);
  /// transformers' own float32 inv_freq for the same settings (Schedule::inv_freq_hf32; the rules
  /// of the replay are in common.hpp); `exact` is derive's inv_freq. A schedule transformers lacks
  /// gives float32_nearest(exact).
  std::vector<float> (*hf_float32)(const Spec& spec, std::optional<int64_t> seq_len,
                                   const std::vector<double>& exact);

  /// The rope_type values of transformers' configs that mean this schedule, the first its own
  /// name there ("longrope", then the legacy "su"); empty: transformers has no such schedule.
  std::vector<std::string_view> rope_types;
  /// The keys of the rope dict transformers' validation of that rope_type accepts
  /// (modeling_rope_utils.py, _validate_*_rope_parameters), besides those every rope_type takes
  /// (rope_type, type, rope_theta, partial_rotary_factor, mrope_section, ...). Others are noted as
  /// ignored.
  std::vector<std::string_view> rope_keys;
  /// Fills the schedule's fields of `spec` from the rope dict (spec.schedule is already set);
  /// nullptr: it reads none.
  void (*read_config)(RopeDict& dict, Spec& spec);

  /// The doctor's findings particular to this schedule (DoctorReport::hazards, doctor.hpp), given
  /// the report so far; nullptr: none.
  void (*hazards)(const Spec& spec, const DoctorReport& report, std::vector<Hazard>& out);
};

/// The entry of `type`; throws rotary::Error "schedule=N is not a schedule type" otherwise.
const ScheduleEntry& schedule_entry(ScheduleType type);
/// The entry whose rope_types name `rope_type`, or nullptr.
const ScheduleEntry* find_rope_type(std::string_view rope_type);

}  // namespace rotary::detail
