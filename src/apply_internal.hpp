// Internal: apply split at its validation, for callers that choose the angles after validating
// (rotary::Rope) without reading the positions again.
#pragma once

#include <optional>
#include <utility>

#include "rotary/apply.hpp"

namespace rotary::detail {

/// validate(schedule, args), returning the lowest and highest position the call reads (whole or
/// not), or nullopt for a call without tokens.
std::optional<std::pair<double, double>> validate_extent(const Schedule& schedule, const ApplyArgs& args);

/// apply(schedule, args) after validate(schedule, args) passed for these args.
void apply_validated(const Schedule& schedule, const ApplyArgs& args);

}  // namespace rotary::detail
