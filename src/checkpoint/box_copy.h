// Internal: copying between boxes in global coordinates (box.h), the core of resharding a
// checkpoint. A piece saved as box S (data contiguous, row-major over S's local shape: the k-th
// element along dim d is S.dims[d].at(k)) and a target box T: the elements in both are, per dim,
// the intersections of S's ranges with T's; the copy runs over the cartesian product of those
// matches, one memcpy per innermost run. Pure and local.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "meshmuon/box.h"

namespace meshmuon::detail {

// One stretch of global indices along a dim present in both sets: local positions in each.
struct DimMatch {
  int64_t src_pos = 0, dst_pos = 0, len = 0;
};

// Every nonempty intersection of a range of `src` with a range of `dst` (any order of ranges).
std::vector<DimMatch> match_dim(const IndexSet& src, const IndexSet& dst);

// Whether the boxes share an element (same number of dims).
bool boxes_intersect(const Box& a, const Box& b);

// The number of elements in both boxes.
int64_t intersection_numel(const Box& a, const Box& b);

// Copies the elements of `src` (over src_box) that lie in dst_box into `dst` (over dst_box), each
// element `elem_size` bytes. `coverage` (one counter per element of dst_box, may be null) counts
// the elements written, saturating at 255. Returns the number of elements copied. Boxes must have
// the same number of dims (std::invalid_argument otherwise); a 0-dim box is one element.
int64_t copy_box_intersection(const void* src, const Box& src_box, void* dst, const Box& dst_box, size_t elem_size,
                              uint8_t* coverage = nullptr);

}  // namespace meshmuon::detail
