// Mesh: named dimensions over a world of ranks, with rank <-> coordinates exactly as torch's
// DeviceMesh (row-major: the last dim varies fastest), and sub-groups along any set of dims.
//
// Contract: pure values, local (no communication). Every mesh meshmuon uses spans the whole world
// (size = product of dim sizes, at most kMaxWorldSize ranks). Constructors throw
// std::invalid_argument on bad dims.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/export.h"

namespace meshmuon {

// A set of mesh dims as a bit mask: bit i set <=> mesh dim i is in the set.
using DimMask = uint32_t;
inline constexpr int kMaxMeshDims = 8;
// The largest world (product of a mesh's dim sizes) meshmuon supports: 2^20 = 1,048,576 ranks, ten
// times the largest training jobs; the planner keeps O(world) per-rank tables.
inline constexpr int kMaxWorldSize = 1 << 20;

struct MeshDim {
  std::string name;
  int size = 1;
  friend bool operator==(const MeshDim&, const MeshDim&) = default;
};

class MESHMUON_API Mesh {
 public:
  Mesh() = default;  // no dims: a world of one rank
  // Names must be non-empty and distinct, sizes ≥ 1, at most kMaxMeshDims dims, and the product of
  // the sizes at most kMaxWorldSize.
  explicit Mesh(std::vector<MeshDim> dims);
  // "dp_shard=8,tp=2" (order kept). An empty string is the one-rank mesh.
  static Mesh parse(std::string_view text);
  // The items of "name=size,..." with each size checked (an integer in [1, kMaxWorldSize]; the
  // error says the limit), but neither names nor the product: for texts whose items are not all
  // mesh dims (`--parallel`'s ep). `what` names the text in errors.
  static std::vector<MeshDim> parse_dims(std::string_view text, std::string_view what = "mesh");

  int ndim() const { return static_cast<int>(dims_.size()); }
  int size() const { return size_; }
  const MeshDim& dim(int i) const { return dims_[static_cast<size_t>(i)]; }
  const std::vector<MeshDim>& dims() const { return dims_; }
  int find(std::string_view name) const;      // -1 when absent
  int index_of(std::string_view name) const;  // throws std::invalid_argument when absent
  DimMask all_dims() const { return (DimMask{1} << ndim()) - 1; }

  // Row-major coordinates. `rank` must be in [0, size()); throws std::invalid_argument otherwise.
  int coord(int rank, int dim) const { return (rank / strides_[static_cast<size_t>(dim)]) % dims_[static_cast<size_t>(dim)].size; }
  std::vector<int> coords(int rank) const;
  int rank_of(std::span<const int> coords) const;  // throws on wrong length or out-of-range coords

  // Sub-groups over `dims`: the ranks that share `rank`'s coordinates on every other dim, ordered
  // row-major over `dims` (as DeviceMesh's sub-mesh groups).
  int group_size(DimMask dims) const;
  int group_count(DimMask dims) const { return size_ / group_size(dims); }
  int group_index(int rank, DimMask dims) const;  // position of `rank` inside its group
  std::vector<int> group_ranks(int rank, DimMask dims) const;
  // The rank at position `index` of the group over `dims` that contains `rank`.
  int group_member(int rank, DimMask dims, int index) const;

  std::string to_string() const;  // "dp_shard=8,tp=2"; "(1 rank)" for the empty mesh
  friend bool operator==(const Mesh& a, const Mesh& b) { return a.dims_ == b.dims_; }

 private:
  std::vector<MeshDim> dims_;
  std::vector<int> strides_;
  int size_ = 1;
};

}  // namespace meshmuon
