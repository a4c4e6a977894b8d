// Hyperparameters of an optimizer parameter group and the non-finite policy (the algorithm, momentum
// kind and LR rule are the update rules', update.h). Every field is read at
// every step, so an LR schedule may change `lr` (or anything else) between steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "meshmuon/export.h"
#include "meshmuon/orthogonalize.h"
#include "meshmuon/state_hooks.h"
#include "meshmuon/update.h"

namespace meshmuon {

// What a step does when a gradient holds NaN or ±inf: "raise" throws meshmuon::Error naming the
// parameter; "skip" returns false. Either way nothing (parameters, state, counters) is modified.
enum class NonFinitePolicy { Raise, Skip };
MESHMUON_API std::string_view to_string(NonFinitePolicy p);
MESHMUON_API NonFinitePolicy parse_non_finite_policy(std::string_view name);  // throws

// Hyperparameters of one group. Fields of the other algorithm are ignored (and not validated).
struct GroupOptions {
  Algorithm algorithm = Algorithm::Muon;
  double lr = 1e-3;            // ≥ 0, finite
  double weight_decay = 0.1;   // ≥ 0; decoupled: p ← p·(1 − lr·wd), lr per decay_lr (Muon groups)

  // Muon
  double momentum = 0.95;      // μ ≥ 0, finite (1: EMA frozen, heavy ball a sum)
  bool nesterov = true;
  MomentumKind momentum_kind = MomentumKind::Ema;
  LrRule lr_rule = LrRule::Original;
  bool cautious_wd = false;    // decay only where U·p ≥ 0 (nanochat); see update.h
  DecayLr decay_lr = DecayLr::Unadjusted;  // the decay's lr: the group's lr, or (nanochat) the adjusted
                                           // lr, for plain and cautious decay alike; see update.h
  bool normuon = false;        // NorMuon variance reduction after orthogonalization
  double normuon_beta2 = 0.95; // ≥ 0, finite (1: v keeps its initial zeros)
  NsOptions ns;                // orthogonalization schedule, steps, method, normalization, and
                               // nanochat's MuonEq / Muon+ scalings (ns.muon_eq, ns.muon_plus)
  double qk_clip_threshold = 0;  // τ > 0 enables QK-clip on QK-tagged parameters; 0 = off
  // Split orthogonalization (Dion's names): each matrix (each expert's matrix) is cut along its
  // dim 0 (rows: the output dim, where attention heads and a fused QKV's q / k / v sit) into row
  // blocks that are orthogonalized independently, each as its own matrix: its own normalization,
  // MuonEq rows, Muon+ scale, NorMuon statistics and LR rule on the block's shape (Dion applies
  // adjust_lr per block, Megatron's per-head / split-QKV Muon likewise). `num_heads` = h > 1: h
  // equal blocks (rows divisible by h); `split_sizes`: explicit block sizes summing to the rows
  // (uneven blocks, e.g. GQA's fused [q | k | v]); at most one of the two; 0 / empty: off.
  // Fixed at construction (the plan's blocks; resolve_split gives them per parameter).
  int64_t num_heads = 0;
  std::vector<int64_t> split_sizes;

  // AdamW
  double beta1 = 0.9, beta2 = 0.999;  // in [0, 1)
  double eps = 1e-8;                   // > 0
};

// A parameter group: its hyperparameters and the indices of its parameters (into the optimizer's
// parameter list: the inventory's for meshmuon::Optimizer, the ParamInfo list for LocalOptimizer).
// Every parameter is in exactly one group.
struct ParamGroup {
  GroupOptions options;
  std::vector<size_t> params;
};

// Throws std::invalid_argument naming the group and the field ("[optim] group 1: momentum -0.5 must
// be finite and >= 0", "... beta1 1 is outside [0, 1)") when a value is out of range or non-finite,
// or when `ns` is invalid (Muon groups).
MESHMUON_API void validate_group_options(const GroupOptions& options, size_t group_index);

// The row blocks of a Muon parameter of `rows` rows (per matrix) under the group's split option:
// empty when off (num_heads ≤ 1 and no split_sizes). Throws std::invalid_argument naming the
// parameter when num_heads does not divide the rows or split_sizes does not sum to them.
MESHMUON_API std::vector<int64_t> resolve_split(const GroupOptions& options, int64_t rows, std::string_view param);

}  // namespace meshmuon
