// Internal: which memory a view touches, for the aliasing rules checked before any write.
//
// Every function here is defined for any view (INT64_MIN strides, huge extents, bogus pointers)
// without overflow: a non-empty view beyond max_view_bytes, or with a negative extent, is answered
// conservatively (too large, overlapping). Empty views (some extent 0) touch nothing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "rotary/tensor.hpp"

namespace rotary::detail {

/// "[2, 3, 4, 16]", for error messages.
std::string shape_text(const TensorView& view);
/// The rules every set view meets, whatever reads it: dtype named, extents >= 0, data non-null
/// unless the view is empty, span < max_view_bytes. Throws rotary::Error naming `name`, e.g.
/// "q.seq=-3 must be >= 0" or "q.data is null but q shape [2, 3, 4, 16] is not empty".
void check_view(const TensorView& view, std::string_view name);

/// True when a non-empty view spans max_view_bytes or more, from its lowest to its highest byte
/// ((1 + sum |stride| * (extent - 1)) * element size), or has a negative extent. Empty: false.
bool exceeds_max_view_bytes(const TensorView& view);
/// True when two distinct indices of the view may address the same element (conservative: a layout
/// whose strides are not nested is reported as overlapping).
bool self_overlaps(const TensorView& view);
/// True when a and b may share an element (exact for views with equal strides and dtype; otherwise
/// conservative: true whenever their address ranges intersect). Empty views overlap nothing.
bool may_overlap(const TensorView& a, const TensorView& b);
/// Same data pointer, dtype, shape and strides.
bool same_view(const TensorView& a, const TensorView& b);

}  // namespace rotary::detail
