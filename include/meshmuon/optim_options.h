// Hyperparameters of an optimizer parameter group and the non-finite policy (the algorithm, momentum
// kind and LR rule are the update rules', update.h). Every field is read at
// every step, so an LR schedule may change `lr` (or anything else) between steps.
#pragma once

#include <cstddef>
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

}  // namespace meshmuon
