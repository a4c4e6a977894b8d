// Internal: what a rank brings to the construction agreement (agreement.h make_plan_claim): per
// parameter what the caller gave (name, shape, placements, mesh, role, group, algorithm, NorMuon)
// and what the plan decided for it, each as a hash and in words, and the options in words.
#include <cstdio>

#include "core/hash.h"
#include "meshmuon/error.h"
#include "exec/agreement.h"

namespace meshmuon::detail {
namespace {

std::string placements_text(const ParamSpec& p) {
  std::string t;
  for (const Placement& pl : p.placements) t += (t.empty() ? "" : ",") + to_string(pl);
  return "(" + t + ")";
}

}  // namespace

PlanClaim make_plan_claim(const Plan& plan, const ParamTable& table, const OptimizerOptions& options,
                          std::string_view backend_name) {
  PlanClaim claim;
  const auto& params = plan.inventory().params;
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t g = table.group(i);
    const PlanEntry* e = plan.entry_of(static_cast<int>(i));
    Fnv1a h;  // what the caller gave: the parameter and its group (not the plan's decision)
    h.str(params[i].name);
    h.pod(params[i].shape.ndim());
    for (int64_t d : params[i].shape) h.pod(d);
    h.pod(params[i].role), h.pod(params[i].expert), h.pod(params[i].mesh), h.pod(g), h.pod(table.algorithm[g]);
    h.pod(static_cast<bool>(table.normuon[g]));
    for (const Placement& pl : params[i].placements) {
      h.pod(pl.kind), h.pod(pl.dim), h.pod(pl.split_factor);
      if (pl.kind == PlacementKind::Owned) h.pod(pl.owner);  // only then: the other kinds hash as before
    }
    claim.spec_hashes.push_back(h.h);
    claim.spec_texts.push_back(concat("'", params[i].name, "' ", params[i].shape.to_string(), " ", placements_text(params[i]),
                                      " on mesh ", params[i].mesh, " ", to_string(params[i].role), " group ", g,
                                      table.normuon[g] ? " normuon" : ""));
    claim.entry_hashes.push_back(e ? e->hash : 0);
    std::string owners;
    if (e)
      for (size_t k = 0; k < e->owner_index.size() && k < 4; ++k) owners += (k ? "," : " owners ") + std::to_string(e->owner_index[k]);
    claim.entry_texts.push_back(concat("'", params[i].name, "' ", e ? std::string(to_string(e->strategy)) : "unplanned",
                                       e ? " chunk " + std::to_string(e->chunk) : "", owners));
  }
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(plan.fingerprint()));
  std::string meshes;
  for (const Mesh& m : plan.inventory().meshes) meshes += (meshes.empty() ? "" : " / ") + m.to_string();
  claim.options_text = concat("plan ", hex, ", meshes ", meshes, ", comm ", to_string(options.comm_dtype), ", chunk ",
                              options.chunk_bytes, " B, window ", options.window, ", backend ", backend_name, ", non_finite ",
                              to_string(options.non_finite));
  Fnv1a f;
  f.pod(plan.fingerprint());
  f.str(claim.options_text);
  for (uint64_t x : claim.spec_hashes) f.pod(x);
  for (uint64_t x : claim.entry_hashes) f.pod(x);
  claim.fingerprint = f.h;
  return claim;
}

}  // namespace meshmuon::detail
