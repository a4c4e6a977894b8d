// Internal: shard tables (per group position element counts, holders of every matrix / expert).
#include "plan/shard_table.h"

#include "dmuon/box.h"
#include "dmuon/update.h"

namespace dmuon::detail {
namespace {

std::string key_of(const ParamSpec& p) {
  std::string k = std::to_string(p.mesh) + (p.expert ? "e" : "m") + p.shape.to_string();
  for (const Placement& pl : p.placements) k += to_string(pl);
  return k;
}

std::shared_ptr<ShardTable> build(const ParamSpec& p, const Mesh& mesh) {
  auto t = std::make_shared<ShardTable>();
  t->group_dims = shard_dims(p.placements);
  t->replica_dims = replicate_dims(p.placements, mesh);
  t->g = mesh.group_size(t->group_dims);
  t->r = mesh.group_size(t->replica_dims);
  t->rank_of.resize(static_cast<size_t>(t->g) * t->r);
  for (int j = 0; j < t->r; ++j) {
    const int base = mesh.group_member(0, t->replica_dims, j);
    for (int k = 0; k < t->g; ++k) t->rank_of[static_cast<size_t>(j) * t->g + k] = mesh.group_member(base, t->group_dims, k);
  }
  const int nd = p.shape.ndim();
  t->units = p.expert ? p.shape[0] : 1;
  t->unit_numel = p.shape[nd - 1] * (nd >= 2 ? p.shape[nd - 2] : 1);
  t->numel.resize(static_cast<size_t>(t->g));
  std::vector<std::vector<std::pair<int32_t, int64_t>>> per_unit(static_cast<size_t>(t->units));
  for (int k = 0; k < t->g; ++k) {
    const Box box = local_box(p.shape, p.placements, mesh, t->rank(0, k));
    t->numel[static_cast<size_t>(k)] = box.numel();
    if (box.numel() == 0) continue;
    if (!p.expert) {
      per_unit[0].push_back({k, box.numel()});
      continue;
    }
    const int64_t per_expert = box.dims[1].size() * box.dims[2].size();
    for (const Range& rg : box.dims[0].ranges())
      for (int64_t e = rg.begin; e < rg.end; ++e) per_unit[static_cast<size_t>(e)].push_back({k, per_expert});
  }
  t->holder_offsets.push_back(0);
  for (const auto& hs : per_unit) {
    for (const auto& [k, n] : hs) {
      t->holders.push_back(k);
      t->holder_elems.push_back(n);
    }
    t->holder_offsets.push_back(static_cast<int32_t>(t->holders.size()));
    if (hs.size() > 1) t->whole_units = false;
  }
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

}  // namespace dmuon::detail
