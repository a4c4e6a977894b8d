// Parallelism recipes: `--parallel` parsing and placements as FSDP2 / torchtitan produce them.
#include <algorithm>
#include <charconv>
#include <map>

#include "dmuon/box.h"
#include "dmuon/error.h"
#include "dmuon/inventory.h"

namespace dmuon {

ParallelConfig parse_parallel(std::string_view text) {
  ParallelConfig c;
  const Mesh items = Mesh::parse(text);  // same "name=size,..." syntax, sizes ≥ 1, no repeats
  for (const MeshDim& d : items.dims()) {
    if (d.name == "dp_replicate") c.dp_replicate = d.size;
    else if (d.name == "dp_shard") c.dp_shard = d.size;
    else if (d.name == "tp") c.tp = d.size;
    else if (d.name == "ep") c.ep = d.size;
    else
      detail::throw_invalid_argument(detail::concat("[inventory] --parallel: unknown dim '", d.name,
                                                    "'; use dp_replicate, dp_shard, tp, ep"));
  }
  return c;
}

std::string to_string(const ParallelConfig& c) {
  return "dp_replicate=" + std::to_string(c.dp_replicate) + ",dp_shard=" + std::to_string(c.dp_shard) +
         ",tp=" + std::to_string(c.tp) + ",ep=" + std::to_string(c.ep);
}

int64_t Inventory::num_elements() const {
  int64_t n = 0;
  for (const ParamSpec& p : params) n += p.numel();
  return n;
}

void Inventory::validate() const {
  DMUON_CHECK(!meshes.empty(), "[inventory] model '", model, "' has no mesh");
  DMUON_CHECK(mesh_names.size() == meshes.size(), "[inventory] model '", model, "': mesh names and meshes differ in count");
  for (size_t i = 1; i < meshes.size(); ++i)
    DMUON_CHECK(meshes[i].size() == meshes[0].size(), "[inventory] mesh '", mesh_names[i], "' (",
                meshes[i].to_string(), ") has ", meshes[i].size(), " ranks but mesh '", mesh_names[0],
                "' has ", meshes[0].size(), "; every mesh must span the same world");
  std::map<std::string_view, size_t> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    DMUON_CHECK(p.mesh >= 0 && p.mesh < static_cast<int>(meshes.size()), "[inventory] parameter '", p.name,
                "': field 'mesh' is ", p.mesh, " but the model has ", meshes.size(), " meshes");
    validate_param(p, meshes[static_cast<size_t>(p.mesh)]);
    DMUON_CHECK(seen.emplace(p.name, i).second, "[inventory] parameter name '", p.name, "' appears twice");
  }
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
  DMUON_CHECK(c.dp_replicate >= 1 && c.dp_shard >= 1 && c.tp >= 1 && c.ep >= 1,
              "[inventory] --parallel sizes must be ≥ 1 (", to_string(c), ")");
  const bool has_ep = c.ep > 1;
  if (has_ep) {
    DMUON_CHECK(c.ep % c.tp == 0, "[inventory] --parallel ep=", c.ep, " must be a multiple of tp=", c.tp,
                " (ep is carved out of dp_shard·tp, expert TP off, as torchtitan does)");
    DMUON_CHECK(c.dp_shard % (c.ep / c.tp) == 0, "[inventory] --parallel ep=", c.ep, " / tp=", c.tp,
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

}  // namespace dmuon
