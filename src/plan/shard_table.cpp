// Internal: shard tables (per group position element counts, holders of every matrix / expert).
#include "plan/shard_table.h"

#include "meshmuon/box.h"
#include "meshmuon/error.h"
#include "meshmuon/update.h"

namespace meshmuon::detail {
namespace {

std::string key_of(const ParamSpec& p) {
  std::string k = std::to_string(p.mesh) + (p.expert ? "e" : "m") + p.shape.to_string();
  for (const Placement& pl : p.placements) k += to_string(pl);
  return k;
}

// Visits the group positions whose local box is non-empty, in increasing position, with that box
// (the same box as local_box). Depth-first over the shard dims in mesh order: a piece that is empty
// stays empty deeper down, so the walk costs O(holders · shard dims), not O(group size).
struct HolderWalk {
  const std::vector<Placement>& placements;
  const Mesh& mesh;
  std::vector<int> dims;  // mesh dims that shard, in mesh order

  template <class F>
  void run(Box& box, size_t level, int64_t k, F&& emit) const {
    if (level == dims.size()) return emit(static_cast<int>(k), box);
    const int i = dims[level];
    const Placement& p = placements[static_cast<size_t>(i)];
    const int64_t w = mesh.dim(i).size;
    IndexSet& set = box.dims[static_cast<size_t>(p.dim)];
    const IndexSet saved = set;
    const int64_t n = saved.size();
    if (p.kind == PlacementKind::Shard) {
      for (int64_t c = 0; c < w; ++c) {
        const Range r = chunk_range(n, w, c);
        if (r.size() <= 0) break;  // torch.chunk: every later piece is empty too
        set = saved.slice(r.begin, r.end);
        run(box, level + 1, k * w + c, emit);
      }
    } else if (p.kind == PlacementKind::Owned) {  // one holder: the owner, with the whole piece
      if (n > 0) run(box, level + 1, k * w + p.owner, emit);
    } else {
      // pieces c, c+W, ... of W·f; pieces from ceil(n / chunk) on are empty, so c past it holds none
      const int64_t parts = w * p.split_factor, chunk = (n + parts - 1) / parts;
      const int64_t non_empty = chunk == 0 ? 0 : (n + chunk - 1) / chunk;
      for (int64_t c = 0; c < std::min(w, non_empty); ++c) {
        IndexSet out;
        for (int64_t j = 0; j < p.split_factor; ++j) {
          const Range r = chunk_range(n, parts, c + j * w);
          const IndexSet piece = saved.slice(r.begin, r.end);
          for (const Range& pr : piece.ranges()) out.append(pr);
        }
        set = std::move(out);
        run(box, level + 1, k * w + c, emit);
      }
    }
    set = saved;
  }
};

std::shared_ptr<ShardTable> build(const ParamSpec& p, const Mesh& mesh) {
  auto t = std::make_shared<ShardTable>();
  t->group_dims = shard_dims(p.placements);
  t->replica_dims = replicate_dims(p.placements, mesh);
  t->g = mesh.group_size(t->group_dims);
  t->r = mesh.group_size(t->replica_dims);
  t->replica_base.resize(static_cast<size_t>(t->r));
  for (int j = 0; j < t->r; ++j) t->replica_base[static_cast<size_t>(j)] = mesh.group_member(0, t->replica_dims, j);
  t->group_offset.resize(static_cast<size_t>(t->g));
  for (int k = 0; k < t->g; ++k) t->group_offset[static_cast<size_t>(k)] = mesh.group_member(0, t->group_dims, k);
  const int nd = p.shape.ndim();
  t->units = p.expert ? p.shape[0] : 1;
  t->unit_numel = p.shape[nd - 1] * (nd >= 2 ? p.shape[nd - 2] : 1);
  t->numel.assign(static_cast<size_t>(t->g), 0);
  // pass 1: the holders and their boxes
  check_placements(p.shape, p.placements, mesh, "parameter '" + p.name + "'");
  HolderWalk walk{p.placements, mesh, {}};
  for (int i = 0; i < mesh.ndim(); ++i)
    if (t->group_dims >> i & 1) walk.dims.push_back(i);
  std::vector<std::pair<int, Box>> held;
  Box box;
  for (int d = 0; d < nd; ++d) box.dims.push_back(IndexSet::full(p.shape[d]));
  if (box.numel() > 0) walk.run(box, 0, 0, [&](int k, const Box& b) { held.emplace_back(k, b); });
  // pass 2: per unit, its holders in increasing position (CSR)
  int64_t pieces = 0;
  for (const auto& [k, b] : held) pieces += p.expert ? b.dims[0].size() : 1;
  MESHMUON_CHECK(pieces <= kMaxPlanPieces, "[plan] parameter '", p.name, "' ", p.shape.to_string(), " splits into ", pieces,
              " (expert, rank) pieces on mesh ", mesh.to_string(), "; the planner handles at most 2^28 (", kMaxPlanPieces,
              ") per parameter");
  std::vector<int64_t> count(static_cast<size_t>(t->units) + 1, 0);
  for (const auto& [k, b] : held) {
    t->numel[static_cast<size_t>(k)] = b.numel();
    if (!p.expert) count[1] += 1;
    else
      for (const Range& rg : b.dims[0].ranges())
        for (int64_t e = rg.begin; e < rg.end; ++e) count[static_cast<size_t>(e) + 1] += 1;
  }
  for (size_t u = 1; u < count.size(); ++u) {
    if (count[u] > 1) t->whole_units = false;
    count[u] += count[u - 1];
  }
  t->holder_offsets = count;
  t->holders.resize(static_cast<size_t>(pieces));
  t->holder_elems.resize(static_cast<size_t>(pieces));
  for (const auto& [k, b] : held) {  // positions increase, so each unit's list comes out sorted
    const auto put = [&](int64_t u, int64_t n) {
      const size_t at = static_cast<size_t>(count[static_cast<size_t>(u)]++);
      t->holders[at] = k;
      t->holder_elems[at] = n;
    };
    if (!p.expert) {
      put(0, b.numel());
      continue;
    }
    const int64_t per_expert = b.dims[1].size() * b.dims[2].size();
    for (const Range& rg : b.dims[0].ranges())
      for (int64_t e = rg.begin; e < rg.end; ++e) put(e, per_expert);
  }
  t->unit_held.assign(static_cast<size_t>(t->units), 0);
  for (int64_t u = 0; u < t->units; ++u)
    for (int64_t h = t->holder_offsets[static_cast<size_t>(u)]; h < t->holder_offsets[static_cast<size_t>(u) + 1]; ++h)
      t->unit_held[static_cast<size_t>(u)] += t->holder_elems[static_cast<size_t>(h)];
  if (!p.expert && nd == 2 && t->g > 1) {
    // the kernel's Gram side: rows when m <= n (shard cols), cols when m > n (shard rows)
    const int long_dim = p.shape[0] <= p.shape[1] ? 1 : 0;
    t->long_dim_only = true;
    for (const Placement& pl : p.placements)
      if (pl.is_shard() && pl.dim != long_dim) t->long_dim_only = false;
  }
  return t;
}

}  // namespace

const ShardTable& ShardTables::get(int param) {
  if (by_param_.empty()) by_param_.resize(inv_.params.size());
  auto& slot = by_param_[static_cast<size_t>(param)];
  if (slot) return *slot;
  const ParamSpec& p = inv_.params[static_cast<size_t>(param)];
  auto& cached = cache_[key_of(p)];
  if (!cached) cached = build(p, inv_.meshes[static_cast<size_t>(p.mesh)]);
  slot = cached;
  return *slot;
}

const ShardTable& ShardTables::get_state(int param) {
  if (state_by_param_.empty()) state_by_param_.resize(inv_.params.size());
  auto& slot = state_by_param_[static_cast<size_t>(param)];
  if (slot) return *slot;
  ParamSpec v = inv_.params[static_cast<size_t>(param)];
  v.shape = normuon_state_shape(v.shape, v.expert);
  auto& cached = cache_[key_of(v)];
  if (!cached) cached = build(v, inv_.meshes[static_cast<size_t>(v.mesh)]);
  slot = cached;
  return *slot;
}

}  // namespace meshmuon::detail
