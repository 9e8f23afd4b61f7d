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
void check_view(const TensorView& view, const char* name);

/// True when a non-empty view spans max_view_bytes or more, from its lowest to its highest byte
/// ((1 + sum |stride| * (extent - 1)) * element size), or has a negative extent. Empty: false.
bool exceeds_max_view_bytes(const TensorView& view);
/// True when two distinct indices of the view may address the same element (conservative: a layout
/// whose strides are not nested is reported as overlapping).
bool self_overlaps(const TensorView& view);
/// True when a and b may share an element (exact for views with equal strides and dtype; otherwise
/// conservative: true whenever their address ranges intersect). Empty views overlap nothing.
bool may_overlap(const TensorView& a, const TensorView& b);
/// self_overlaps and may_overlap for views that passed check_view (within max_view_bytes, extents
/// >= 0): the same answers without checking the span again (apply's validation, per call).
bool self_overlaps_checked(const TensorView& view);
bool may_overlap_checked(const TensorView& a, const TensorView& b);
/// An array of `count` elements of `element_bytes` each at `data` (what the kernels read besides the
/// tensors: positions, slots, deltas, scales, norm weights) as a dense i8 view of its bytes, for
/// may_overlap against the outputs. A byte count of max_view_bytes or more (or one that overflows)
/// gives a view that may_overlap answers conservatively (overlapping). count <= 0 or null data: empty.
TensorView bytes_view(const void* data, int64_t count, int64_t element_bytes);
/// [lo, hi): the addresses from a view's lowest byte to one past its highest. For a non-empty view
/// within max_view_bytes (check_view passed, or a bytes_view below it); any other view (empty, or
/// beyond max_view_bytes) gives the widest span, which intersects every other. Views whose spans do
/// not intersect share nothing: a check of many pairs forms each view's span once and calls
/// may_overlap only for pairs whose spans meet.
struct ByteSpan {
  __int128 lo;
  __int128 hi;
};
ByteSpan byte_span(const TensorView& view);
/// byte_span of a view known to be within max_view_bytes (check_view passed): no span check again.
/// Empty views give a span that meets no other.
ByteSpan byte_span_checked(const TensorView& view);
inline bool spans_meet(const ByteSpan& a, const ByteSpan& b) { return a.lo < b.hi && b.lo < a.hi; }
/// Same data pointer, dtype, shape and strides (inline, element by element: apply's validation
/// asks this several times per call).
inline bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype) return false;
  for (size_t d = 0; d < 4; ++d) {
    if (a.shape[d] != b.shape[d] || a.strides[d] != b.strides[d]) return false;
  }
  return true;
}

}  // namespace rotary::detail
