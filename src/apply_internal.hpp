// Internal: apply split at its validation, for callers that choose the angles after validating
// (rotary::Rope) without reading the positions again.
#pragma once

#include <array>
#include <optional>
#include <utility>

#include "rotary/apply.hpp"

namespace rotary::detail {

/// validate(schedule, args) for args that do not use the old names (uses_old_names), returning the lowest and
/// highest position the call reads (whole or not), or nullopt for a call without tokens.
std::optional<std::pair<double, double>> validate_extent(const Schedule& schedule, const ApplyArgs& args);

/// validate (read_entries) or validate_shapes for args that do not use the old names, with k read
/// only when k_out is unset (rope_store: the rotated k goes to the cache, k itself is not written),
/// so k need not be a view that could be written (an expanded k is taken).
void validate_reading_k(const Schedule& schedule, const ApplyArgs& args, bool read_entries);

/// Whether args use the deprecated ApplyArgs::angles (caller_angles' old name). Inline and
/// allocation-free: every public entry point taking ApplyArgs asks it first and, when true, calls
/// itself again with folded(args), so that the library reads caller_angles alone.
inline bool uses_old_names(const ApplyArgs& args) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return args.angles != nullptr;
#pragma GCC diagnostic pop
}
/// args with the old name folded into caller_angles. Throws rotary::Error when both are set and differ.
ApplyArgs folded(const ApplyArgs& args);
/// The same for arguments holding an ApplyArgs `rope` (RopeStoreArgs, QkNormRopeArgs).
template <class Args>
Args folded_rope(const Args& args) {
  Args out = args;
  out.rope = folded(args.rope);
  return out;
}

/// The bytes of per-token positions (all streams) as a view for the aliasing rules (memory.hpp's
/// bytes_view): the kernels read them token by token, so no output may overlap them. Sequential
/// positions: an empty view.
TensorView positions_view(const Positions& positions);
/// The caller's cos or sin (ApplyArgs::caller_angles) as a view for the aliasing rules:
/// [dim0, dim1, 1, dim2].
TensorView angle_view(const CallerAngles& a, const void* data, const std::array<int64_t, 3>& strides);

/// apply(schedule, args) after validate(schedule, args) passed for these args.
void apply_validated(const Schedule& schedule, const ApplyArgs& args);

}  // namespace rotary::detail
