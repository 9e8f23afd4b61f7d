// Internal: apply split at its validation, for callers that choose the angles after validating
// (rotary::Rope) without reading the positions again.
#pragma once

#include <optional>
#include <utility>

#include "rotary/apply.hpp"

namespace rotary::detail {

/// validate(schedule, args) for args already through fold_old_names, returning the lowest and
/// highest position the call reads (whole or not), or nullopt for a call without tokens.
std::optional<std::pair<double, double>> validate_extent(const Schedule& schedule, const ApplyArgs& args);

/// `args` with the deprecated ApplyArgs::angles (caller_angles' old name) folded into caller_angles:
/// `args` itself when the old name is unset (nothing copied), else `copy`, filled. Throws
/// rotary::Error when both are set and differ. Every public entry point taking ApplyArgs calls it
/// first, so that the library reads caller_angles alone.
const ApplyArgs& fold_old_names(const ApplyArgs& args, std::optional<ApplyArgs>& copy);
/// The same for arguments holding an ApplyArgs `rope` (RopeStoreArgs, QkNormRopeArgs).
template <class Args>
const Args& fold_rope_names(const Args& args, std::optional<Args>& copy) {
  std::optional<ApplyArgs> rope;
  fold_old_names(args.rope, rope);
  if (!rope) return args;
  copy = args;
  copy->rope = *rope;
  return *copy;
}

/// apply(schedule, args) after validate(schedule, args) passed for these args.
void apply_validated(const Schedule& schedule, const ApplyArgs& args);

}  // namespace rotary::detail
