// Internal: owner placement (issue 38): which rank holds each owned matrix whole, and what that
// placement costs next to the sharded one (memory per rank, traffic, the exposed seconds the
// planner compares). Pure and local: every rank computes the same answer from the same inputs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/inventory.h"

#include "meshmuon/param_spec.h"
#include "meshmuon/plan.h"

namespace meshmuon::detail {

// The layer a parameter belongs to: its name up to the last all-digit component ("layers.3.attn.q"
// -> "layers.3"), else the name without its last component ("wte" -> "").
std::string layer_of(const std::string& name);

// Owners (world ranks in [0, world)) of the parameters with owned[i]; -1 for the others. Longest
// processing time first on a weight that balances Newton–Schulz flops and memory (each normalized
// by its total over the owned matrices), largest first, each to the least-loaded rank among those
// that hold no matrix of its layer yet (all ranks when every rank already holds one); ties to the
// lower rank, so the result depends only on the inputs.
std::vector<int> choose_owners(const std::vector<ParamSpec>& params, const std::vector<bool>& owned, int world,
                               const NsOptions& ns = {});

// One matrix's cost under a placement on an R x S (dp_replicate x dp_shard) mesh, per rank and per
// training step, as the planner models it (bytes in the parameter's fp32 masters, 4 bytes/element,
// unless a dtype size is given).
struct PlacementCost {
  // Memory: the most bytes any rank holds persistently for this matrix (masters + optimizer state:
  // `state_copies` fp32 tensors of its shape) and the bytes every rank holds on average.
  double peak_bytes = 0, mean_bytes = 0;
  // Traffic of the forward / backward (overlapped with compute): unshard and gradient reduction,
  // bytes on the busiest rank's link, and their latency (seconds).
  double fwd_bwd_bytes = 0, fwd_bwd_latency_s = 0;
  // The optimizer step's traffic on the busiest rank (exposed: the step waits for it) and its latency.
  double step_bytes = 0, step_latency_s = 0;
  // Newton–Schulz flops on the busiest rank (owner: the whole matrix on one rank; sharded under
  // owner_a2a: 1/N of the world's work on average).
  double step_flops = 0;
  // Exposed seconds per step: step traffic + latency + compute, plus the part of the forward /
  // backward traffic that `overlap` (0..1) cannot hide.
  double seconds = 0;
};

struct PlacementInputs {
  int R = 1, S = 1;
  int64_t rows = 0, cols = 0;
  int state_copies = 1;       // momentum (+ NorMuon's factored state is ignored: O(rows + cols))
  double overlap = 0.8;       // fraction of forward / backward traffic hidden behind compute
  size_t param_bytes = 4;     // unshard dtype (fp32 or bf16)
  size_t grad_bytes = 4;      // reduce dtype
  // How gradients reach the owner. false: every rank's full gradient goes to the owner (a star: the
  // owner's link carries (S−1) + (R−1) gradients; ShardedParams). true: a reduce-scatter by data
  // movement then a gather of the summed blocks (meshmuon.torch.own): the owner's link carries about
  // 2·(N−1)/N of one gradient, in two latency rounds; the same sums in the same order.
  bool scatter_gather_reduce = false;
};

PlacementCost owner_placement_cost(const PlacementInputs& in, const MachineProfile& m, const NsOptions& ns);
PlacementCost sharded_placement_cost(const PlacementInputs& in, const MachineProfile& m, const NsOptions& ns);

// The planner's placement choice for an FSDP / HSDP inventory (every mesh dim dp_shard or
// dp_replicate). Sharded: every matrix Shard(0) rows; Owner: every eligible matrix (Muon, 2-D, not
// an expert stack) whole on one rank; Auto: owner where owner_placement_cost predicts fewer exposed
// seconds than sharded_placement_cost. Owners of the owned ones by choose_owners.
enum class PlacementMode : uint8_t { Sharded, Owner, Auto };
std::string_view to_string(PlacementMode m);
PlacementMode parse_placement_mode(std::string_view name);  // "sharded" | "owner" | "auto"; throws otherwise

struct PlacementChoice {
  bool eligible = false, owned = false;
  int owner = -1;  // world rank, when owned
  PlacementCost owner_cost, sharded_cost;  // when eligible
  std::string why;                         // one line: what was compared, or why it is not eligible
};

// R, S: the mesh's dp_replicate and dp_shard sizes (1 when absent). `overlap` as PlacementInputs'
// (negative: o.machine.fwd_bwd_overlap).
std::vector<PlacementChoice> choose_placements(const std::vector<ParamSpec>& params, int R, int S, const PlanOptions& o,
                                               PlacementMode mode, double overlap = -1,
                                               bool scatter_gather_reduce = false);

// The dp_replicate / dp_shard sizes of a mesh whose every dim is one of them; false otherwise.
bool dp_mesh_sizes(const Mesh& mesh, int& R, int& S);

// Bytes each world rank holds persistently (fp32 masters + optimizer state: one copy for Muon
// parameters, two for AdamW ones) under the choices: sharded rows as torch.chunk over dp_shard in
// every replica, owned matrices whole on their owner.
std::vector<double> placement_bytes_per_rank(const std::vector<ParamSpec>& params, int R, int S,
                                             const std::vector<PlacementChoice>& choices);

// The inventory with every owned matrix placed [Owned(r), Owned(s)] on its mesh (the other dims'
// placements unchanged), so make_plan sees one holder and runs it `local`.
Inventory apply_placements(const Inventory& inv, const std::vector<PlacementChoice>& choices);

}  // namespace meshmuon::detail
