// Internal: the plan fingerprint: FNV-1a 64 over everything the ranks must agree on (ordered
// inventory, meshes, numerics and chunking options, and every decision).
#include <cstring>

#include "core/hash.h"
#include "plan/planner_steps.h"

namespace meshmuon::detail {
namespace {

using Hasher = Fnv1a;

void add_param(Hasher& hs, const ParamSpec& p) {
  hs.str(p.name);
  hs.pod(p.shape.ndim());
  for (int64_t d : p.shape) hs.pod(d);
  hs.pod(p.dtype), hs.pod(p.role), hs.pod(p.expert), hs.pod(p.mesh);
  hs.pod(p.placements.size());
  for (const Placement& pl : p.placements) hs.pod(pl.kind), hs.pod(pl.dim), hs.pod(pl.split_factor);
  if (!p.split.empty()) {  // hashed only when set, so an unsplit inventory keeps its fingerprint
    hs.str("split"), hs.pod(p.split.size());
    for (int64_t b : p.split) hs.pod(b);
  }
  hs.pod(p.qk.has_value());
  if (p.qk) hs.pod(p.qk->layer), hs.pod(p.qk->kind), hs.pod(p.qk->heads), hs.pod(p.qk->head_dim), hs.pod(p.qk->rope_dim), hs.pod(p.qk->v_dim);
}

}  // namespace

uint64_t entry_hash(const PlanEntry& e, const ParamSpec& p) {
  Hasher hs;
  add_param(hs, p);
  hs.pod(e.param), hs.pod(e.strategy), hs.pod(e.mesh), hs.pod(e.group_dims), hs.pod(e.replica_dims);
  hs.pod(e.replica_split), hs.pod(e.chunk);
  hs.pod(e.owner_index.size());
  hs.bytes(e.owner_index.data(), e.owner_index.size() * sizeof(int32_t));
  hs.pod(e.owner_replica.size());
  hs.bytes(e.owner_replica.data(), e.owner_replica.size() * sizeof(int32_t));
  return hs.h;
}

uint64_t plan_fingerprint(const Inventory& inv, const PlanOptions& o, const std::vector<PlanEntry>& entries) {
  Hasher hs;
  hs.pod(inv.meshes.size());
  for (size_t i = 0; i < inv.meshes.size(); ++i) {
    hs.str(inv.mesh_names[i]);
    for (const MeshDim& d : inv.meshes[i].dims()) hs.str(d.name), hs.pod(d.size);
  }
  const NsOptions& ns = o.ns;
  hs.pod(ns.schedule), hs.pod(ns.steps), hs.pod(ns.method), hs.pod(ns.scale), hs.pod(ns.eps), hs.pod(ns.eps_mode);
  hs.pod(ns.pe_l0), hs.pod(ns.pe_safety), hs.pod(ns.pe_cushion), hs.pod(ns.bf16_rounding);
  hs.pod(ns.matmul_dtype), hs.pod(ns.muon_eq), hs.pod(ns.muon_plus);
  for (const Coefficients& c : ns.custom) hs.pod(c.a), hs.pod(c.b), hs.pod(c.c);
  hs.pod(o.comm_dtype), hs.pod(o.chunk_bytes), hs.pod(o.window);
  hs.pod(o.normuon.size());
  for (bool b : o.normuon) hs.pod(b);
  hs.pod(inv.params.size());
  size_t next = 0;  // entries are in parameter order
  for (size_t i = 0; i < inv.params.size(); ++i) {
    if (next < entries.size() && entries[next].param == static_cast<int>(i)) {
      hs.pod(entries[next++].hash);
    } else {
      add_param(hs, inv.params[i]);  // AdamW: its state layout must agree too
    }
  }
  return hs.h;
}

}  // namespace meshmuon::detail
