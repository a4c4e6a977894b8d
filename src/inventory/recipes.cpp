// Parallelism recipes: `--parallel` parsing and placements as FSDP2 / torchtitan produce them.
#include <algorithm>
#include <charconv>

#include "meshmuon/box.h"
#include "meshmuon/error.h"
#include "meshmuon/inventory.h"

namespace meshmuon {

ParallelConfig parse_parallel(std::string_view text) {
  ParallelConfig c;
  std::vector<std::string> seen;
  for (const MeshDim& d : Mesh::parse_dims(text, "--parallel")) {  // sizes from 1 to kMaxWorldSize
    int* field = d.name == "dp_replicate" ? &c.dp_replicate : d.name == "dp_shard" ? &c.dp_shard
                 : d.name == "tp" ? &c.tp : d.name == "ep" ? &c.ep : nullptr;
    if (!field)
      detail::throw_invalid_argument(detail::concat("[inventory] --parallel: unknown dim '", d.name,
                                                    "'; use dp_replicate, dp_shard, tp, ep"));
    MESHMUON_CHECK(std::find(seen.begin(), seen.end(), d.name) == seen.end(), "[inventory] --parallel: dim '", d.name,
                "' is given twice");
    seen.push_back(d.name);
    *field = d.size;
  }
  // ep is carved out of dp_shard·tp, so only these three make the world
  const int64_t world = int64_t{c.dp_replicate} * c.dp_shard * c.tp;  // each ≤ 2^20: fits
  MESHMUON_CHECK(world <= kMaxWorldSize, "[inventory] --parallel ", text, " gives a world of ", world,
              " ranks; meshmuon supports at most ", kMaxWorldSize, " (2^20)");
  return c;
}

// Only the sizes that differ from 1 (what a user would type), so errors never quote a default.
std::string to_string(const ParallelConfig& c) {
  std::string s;
  const auto add = [&](const char* name, int v) {
    if (v == 1) return;
    if (!s.empty()) s += ',';
    s.append(name).append("=").append(std::to_string(v));
  };
  add("dp_replicate", c.dp_replicate), add("dp_shard", c.dp_shard), add("tp", c.tp), add("ep", c.ep);
  return s.empty() ? "(1 rank)" : s;
}

namespace {

struct MeshPlan {
  Mesh mesh;
  int replicate = -1, fsdp = -1, tp = -1, ep = -1;  // mesh dim indices (-1: absent)
};

MeshPlan make_mesh(std::initializer_list<std::pair<const char*, int>> dims) {
  std::vector<MeshDim> kept;
  for (const auto& [name, size] : dims)
    if (size > 1) kept.push_back({name, size});
  MeshPlan mp{Mesh(kept)};
  mp.replicate = mp.mesh.find("dp_replicate");
  mp.fsdp = std::max(mp.mesh.find("dp_shard"), mp.mesh.find("efsdp"));
  mp.tp = mp.mesh.find("tp");
  mp.ep = mp.mesh.find("ep");
  return mp;
}

// The tensor dim TP shards (-1: none). Expert stacks shift by one: [E, out, in].
int tp_dim(const ParamSpec& p) {
  const int shift = p.expert ? 1 : 0;
  if (p.tp == TpStyle::Colwise) return shift;
  if (p.tp == TpStyle::Rowwise && p.shape.ndim() >= 2 + shift) return 1 + shift;
  return -1;
}

std::vector<Placement> place(const ParamSpec& p, const MeshPlan& mp, int fsdp_dim) {
  std::vector<int> dim_of(static_cast<size_t>(mp.mesh.ndim()), -1);  // tensor dim per mesh dim
  if (mp.tp >= 0) dim_of[static_cast<size_t>(mp.tp)] = tp_dim(p);
  if (mp.ep >= 0) dim_of[static_cast<size_t>(mp.ep)] = 0;
  if (mp.fsdp >= 0) dim_of[static_cast<size_t>(mp.fsdp)] = fsdp_dim;
  std::vector<Placement> out(dim_of.size());
  for (int i = 0; i < mp.mesh.ndim(); ++i) {
    const int d = dim_of[static_cast<size_t>(i)];
    if (d < 0) continue;
    int later = 1;  // ranks of later mesh dims that shard the same tensor dim: FSDP goes strided
    for (int j = i + 1; j < mp.mesh.ndim(); ++j)
      if (dim_of[static_cast<size_t>(j)] == d) later *= mp.mesh.dim(j).size;
    out[static_cast<size_t>(i)] = later > 1 ? Placement::strided_shard(d, later) : Placement::shard(d);
  }
  return out;
}

}  // namespace

Inventory apply_parallel(const ModelDesc& model, const ParallelConfig& c) {
  MESHMUON_CHECK(c.dp_replicate >= 1 && c.dp_shard >= 1 && c.tp >= 1 && c.ep >= 1,
              "[inventory] --parallel sizes must be ≥ 1 (dp_replicate=", c.dp_replicate, ", dp_shard=", c.dp_shard,
              ", tp=", c.tp, ", ep=", c.ep, ")");
  // a config built in C++ skips parse_parallel's checks: bound each size, then the product fits int64
  MESHMUON_CHECK(c.dp_replicate <= kMaxWorldSize && c.dp_shard <= kMaxWorldSize && c.tp <= kMaxWorldSize &&
                  c.ep <= kMaxWorldSize,
              "[inventory] --parallel ", to_string(c), ": sizes must be at most ", kMaxWorldSize,
              " (2^20, the most ranks meshmuon supports)");
  const int64_t world = int64_t{c.dp_replicate} * c.dp_shard * c.tp;
  MESHMUON_CHECK(world <= kMaxWorldSize, "[inventory] --parallel ", to_string(c), " gives a world of ", world,
              " ranks; meshmuon supports at most ", kMaxWorldSize, " (2^20)");
  const bool has_ep = c.ep > 1;
  if (has_ep) {
    MESHMUON_CHECK(c.ep % c.tp == 0, "[inventory] --parallel ep=", c.ep, " must be a multiple of tp=", c.tp,
                " (ep is carved out of dp_shard·tp, expert TP off, as torchtitan does)");
    MESHMUON_CHECK(c.dp_shard % (c.ep / c.tp) == 0, "[inventory] --parallel ep=", c.ep, " / tp=", c.tp,
                " must divide dp_shard=", c.dp_shard);
  }
  Inventory inv;
  inv.model = model.name;
  const MeshPlan dense = make_mesh({{"dp_replicate", c.dp_replicate}, {"dp_shard", c.dp_shard}, {"tp", c.tp}});
  inv.mesh_names.push_back("dense");
  inv.meshes.push_back(dense.mesh);
  MeshPlan expert;
  if (has_ep) {
    expert = make_mesh({{"dp_replicate", c.dp_replicate}, {"efsdp", c.efsdp()}, {"ep", c.ep}});
    inv.mesh_names.push_back("expert");
    inv.meshes.push_back(expert.mesh);
  }
  for (const ParamSpec& src : model.params) {
    ParamSpec p = src;
    if (p.expert && has_ep) {
      p.mesh = 1;
      // torchtitan: FSDP shards experts on dim 1 when there are fewer experts than efsdp·ep ranks
      const int fsdp_dim = static_cast<int64_t>(c.efsdp()) * c.ep > p.shape[0] ? 1 : 0;
      p.placements = place(p, expert, fsdp_dim);
    } else {
      p.mesh = 0;
      p.placements = place(p, dense, 0);
    }
    inv.params.push_back(std::move(p));
  }
  inv.validate();
  return inv;
}

}  // namespace meshmuon
