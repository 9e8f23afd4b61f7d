// Internal: which memory a view touches, for the aliasing rules checked before any write.
#pragma once

#include <cstdint>

#include "rotary/tensor.hpp"

namespace rotary::detail {

/// True when the view's extent times strides cannot be addressed in int64 elements.
bool reach_overflows(const TensorView& view);
/// True when two distinct indices of the view may address the same element (conservative: a layout
/// whose strides are not nested is reported as overlapping).
bool self_overlaps(const TensorView& view);
/// True when a and b may share an element (exact for views with equal strides and dtype; otherwise
/// conservative: true whenever their address ranges intersect). Empty views overlap nothing.
bool may_overlap(const TensorView& a, const TensorView& b);
/// Same data pointer, dtype, shape and strides.
bool same_view(const TensorView& a, const TensorView& b);

}  // namespace rotary::detail
