// Local boxes: applies placements mesh dim by mesh dim to index sets, as DTensor nests shards.
#include "meshmuon/box.h"

#include <algorithm>

#include "core/checked_math.h"
#include "meshmuon/error.h"

namespace meshmuon {

int64_t IndexSet::size() const {
  int64_t n = 0;
  for (const Range& r : ranges_) n += r.size();
  return n;
}

bool IndexSet::contains(int64_t index) const {
  for (const Range& r : ranges_)
    if (index >= r.begin && index < r.end) return true;
  return false;
}

int64_t IndexSet::at(int64_t pos) const {
  for (const Range& r : ranges_) {
    if (pos < r.size()) return r.begin + pos;
    pos -= r.size();
  }
  detail::throw_invalid_argument("[layout] index set position out of range");
}

void IndexSet::append(Range r) {
  if (r.size() <= 0) return;
  if (!ranges_.empty() && ranges_.back().end == r.begin) {
    ranges_.back().end = r.end;
    return;
  }
  ranges_.push_back(r);
}

IndexSet IndexSet::slice(int64_t pos_begin, int64_t pos_end) const {
  IndexSet out;
  int64_t offset = 0;  // local position of the current range's first element
  for (const Range& r : ranges_) {
    const int64_t lo = std::max(pos_begin, offset), hi = std::min(pos_end, offset + r.size());
    if (lo < hi) out.append({r.begin + (lo - offset), r.begin + (hi - offset)});
    offset += r.size();
    if (offset >= pos_end) break;
  }
  return out;
}

std::string IndexSet::to_string() const {
  if (ranges_.empty()) return "[]";
  std::string s;
  for (const Range& r : ranges_)
    s += (s.empty() ? "[" : "+[") + std::to_string(r.begin) + "," + std::to_string(r.end) + ")";
  return s;
}

int64_t Box::numel() const {
  int64_t n = 1;
  bool zero = false, overflow = false;
  for (const IndexSet& d : dims) {
    const int64_t k = d.size();
    zero |= k == 0;
    overflow |= !detail::checked_mul(n, k, n);
  }
  if (zero) return 0;
  if (overflow) {
    std::vector<int64_t> sizes;
    for (const IndexSet& d : dims) sizes.push_back(d.size());
    detail::throw_invalid_argument(detail::concat("[layout] box ", to_string(), " has ", detail::product_text(sizes),
                                                  " elements, more than int64 holds"));
  }
  return n;
}

Shape Box::shape() const {
  std::vector<int64_t> s;
  for (const IndexSet& d : dims) s.push_back(d.size());
  return Shape(std::span<const int64_t>(s));
}

std::string Box::to_string() const {
  std::string s;
  for (const IndexSet& d : dims) s += (s.empty() ? "" : " x ") + d.to_string();
  return s;
}

Range chunk_range(int64_t n, int64_t parts, int64_t index) {
  MESHMUON_CHECK(n >= 0 && parts >= 1 && index >= 0, "[layout] chunk_range(", n, ", ", parts, ", ", index,
              ") needs n ≥ 0, parts ≥ 1, index ≥ 0");
  // in 128 bits: n + parts − 1 and index·chunk may pass int64 for extents near its limit
  const __int128 chunk = (static_cast<__int128>(n) + parts - 1) / parts;
  const auto at = [&](__int128 i) { return static_cast<int64_t>(std::min<__int128>(i * chunk, n)); };
  return {at(index), at(static_cast<__int128>(index) + 1)};
}

void check_placements(const Shape& shape, std::span<const Placement> placements, const Mesh& mesh,
                      std::string_view what) {
  MESHMUON_CHECK(static_cast<int>(placements.size()) == mesh.ndim(), "[layout] ", what, " has ",
              placements.size(), " placements for a mesh of ", mesh.ndim(), " dims (", mesh.to_string(),
              "); give one per mesh dim");
  for (size_t i = 0; i < placements.size(); ++i) {
    const Placement& p = placements[i];
    if (!p.is_shard()) continue;
    MESHMUON_CHECK(p.dim >= 0 && p.dim < shape.ndim(), "[layout] ", what, ": placement ", to_string(p),
                " on mesh dim '", mesh.dim(static_cast<int>(i)).name, "' shards dim ", p.dim,
                " of a tensor with ", shape.ndim(), " dims ", shape.to_string());
    MESHMUON_CHECK(p.split_factor >= 1, "[layout] ", what, ": split_factor must be ≥ 1");
    MESHMUON_CHECK(p.kind != PlacementKind::Owned || (p.owner >= 0 && p.owner < mesh.dim(static_cast<int>(i)).size), "[layout] ",
                   what, ": placement ", to_string(p), " on mesh dim '", mesh.dim(static_cast<int>(i)).name,
                   "' names an owner outside the dim's ", mesh.dim(static_cast<int>(i)).size, " ranks");
  }
}

Box local_box(const Shape& shape, std::span<const Placement> placements, const Mesh& mesh, int rank) {
  check_placements(shape, placements, mesh, "tensor");
  MESHMUON_CHECK(rank >= 0 && rank < mesh.size(), "[layout] rank ", rank, " is outside the mesh of ",
              mesh.size(), " ranks");
  Box box;
  for (int d = 0; d < shape.ndim(); ++d) box.dims.push_back(IndexSet::full(shape[d]));
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement& p = placements[static_cast<size_t>(i)];
    if (!p.is_shard()) continue;
    const int64_t w = mesh.dim(i).size, c = mesh.coord(rank, i);
    IndexSet& set = box.dims[static_cast<size_t>(p.dim)];
    const int64_t n = set.size();
    if (p.kind == PlacementKind::Shard) {
      const Range r = chunk_range(n, w, c);
      set = set.slice(r.begin, r.end);
      continue;
    }
    if (p.kind == PlacementKind::Owned) {  // the owner keeps the piece, the others hold none of it
      if (c != p.owner) set = set.slice(0, 0);
      continue;
    }
    // pieces c, c+W, ..., c+(f-1)·W of a torch.chunk into W·f pieces, in that order
    IndexSet out;
    for (int64_t j = 0; j < p.split_factor; ++j) {
      const Range r = chunk_range(n, w * p.split_factor, c + j * w);
      const IndexSet piece = set.slice(r.begin, r.end);
      for (const Range& pr : piece.ranges()) out.append(pr);
    }
    set = std::move(out);
  }
  return box;
}

DimMask shard_dims(std::span<const Placement> placements) {
  DimMask m = 0;
  for (size_t i = 0; i < placements.size(); ++i)
    if (placements[i].is_shard()) m |= DimMask{1} << i;
  return m;
}

DimMask replicate_dims(std::span<const Placement> placements, const Mesh& mesh) {
  return mesh.all_dims() & ~shard_dims(placements);
}

}  // namespace meshmuon
