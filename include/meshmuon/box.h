// Local boxes: which global indices of a parameter a rank holds, per tensor dim, under a mesh and
// its placements (placement.h gives the rules). Local, pure; no communication, no allocation of
// tensor data.
//
// A Box holds one IndexSet per tensor dim. An IndexSet is an ordered list of disjoint half-open
// global ranges; its ORDER is the order of the rank's local tensor along that dim (the local row k is
// the k-th index of the set). Under Shard it is one range (possibly empty); under StridedShard it is
// several. The local tensor of the rank is the cartesian product of its sets, row-major.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/export.h"
#include "meshmuon/mesh.h"
#include "meshmuon/placement.h"
#include "meshmuon/tensor.h"

namespace meshmuon {

struct Range {
  int64_t begin = 0, end = 0;  // [begin, end)
  int64_t size() const { return end - begin; }
  friend bool operator==(const Range&, const Range&) = default;
};

class MESHMUON_API IndexSet {
 public:
  IndexSet() = default;
  explicit IndexSet(Range r) { if (r.size() > 0) ranges_.push_back(r); }
  static IndexSet full(int64_t n) { return IndexSet(Range{0, n}); }

  int64_t size() const;
  bool empty() const { return ranges_.empty(); }
  bool contiguous() const { return ranges_.size() <= 1; }
  const std::vector<Range>& ranges() const { return ranges_; }
  bool contains(int64_t index) const;
  // The global index at local position `pos` (0 ≤ pos < size()).
  int64_t at(int64_t pos) const;
  // The sub-set at local positions [pos_begin, pos_end) (clamped to size()).
  IndexSet slice(int64_t pos_begin, int64_t pos_end) const;
  // Appends [begin, end) (merging with the last range when adjacent). Ranges must be appended in
  // increasing order; empty ranges are dropped.
  void append(Range r);
  std::string to_string() const;  // "[0,4)" or "[0,2)+[8,10)"; "[]" when empty
  friend bool operator==(const IndexSet&, const IndexSet&) = default;

 private:
  std::vector<Range> ranges_;
};

struct MESHMUON_API Box {
  std::vector<IndexSet> dims;  // one per tensor dim
  int64_t numel() const;
  Shape shape() const;  // the local shape
  std::string to_string() const;
  friend bool operator==(const Box&, const Box&) = default;
};

// torch.chunk's piece `index` of `parts` over n elements: chunk = ceil(n / parts),
// [min(index·chunk, n), min((index+1)·chunk, n)).
MESHMUON_API Range chunk_range(int64_t n, int64_t parts, int64_t index);

// Throws std::invalid_argument naming `what` (e.g. "parameter 'w1'") when `placements` does not have
// one entry per mesh dim or a shard dim is outside the tensor's dims.
MESHMUON_API void check_placements(const Shape& shape, std::span<const Placement> placements,
                                const Mesh& mesh, std::string_view what);

// The box `rank` holds. Checks placements (see above) and the rank.
MESHMUON_API Box local_box(const Shape& shape, std::span<const Placement> placements, const Mesh& mesh,
                        int rank);

// Mesh dims whose placement shards (Shard or StridedShard) and those that replicate.
MESHMUON_API DimMask shard_dims(std::span<const Placement> placements);
MESHMUON_API DimMask replicate_dims(std::span<const Placement> placements, const Mesh& mesh);

}  // namespace meshmuon
