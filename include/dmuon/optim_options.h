// Hyperparameters of an optimizer parameter group and the small enums they use (algorithm, momentum
// kind, LR rule, non-finite policy). Every field is read at every step, so an LR schedule may change
// `lr` (or anything else) between steps.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "dmuon/export.h"
#include "dmuon/orthogonalize.h"

namespace dmuon {

// "muon" (orthogonalized momentum, matrices and expert stacks only) or "adamw" (any shape).
enum class Algorithm { Muon, AdamW };
DMUON_API std::string_view to_string(Algorithm a);
DMUON_API Algorithm parse_algorithm(std::string_view name);  // throws std::invalid_argument

// "ema": buf ← lerp(buf, g, 1 − μ) (torch.optim.Muon, nanochat);
// "heavy_ball": buf ← μ·buf + g (Motif, Dion).
enum class MomentumKind { Ema, HeavyBall };
DMUON_API std::string_view to_string(MomentumKind k);
DMUON_API MomentumKind parse_momentum_kind(std::string_view name);  // throws std::invalid_argument

// LR adjustment from the GLOBAL matrix shape A×B (rows × cols; one expert's matrix for a stack):
// "original" lr·sqrt(max(1, A/B)); "match_rms_adamw" lr·0.2·sqrt(max(A, B)); "none" lr.
enum class LrRule { Original, MatchRmsAdamw, None };
DMUON_API std::string_view to_string(LrRule r);
DMUON_API LrRule parse_lr_rule(std::string_view name);  // throws std::invalid_argument

// What a step does when a gradient holds NaN or ±inf: "raise" throws dmuon::Error naming the
// parameter; "skip" returns false. Either way nothing (parameters, state, counters) is modified.
enum class NonFinitePolicy { Raise, Skip };
DMUON_API std::string_view to_string(NonFinitePolicy p);
DMUON_API NonFinitePolicy parse_non_finite_policy(std::string_view name);  // throws

// Hyperparameters of one group. Fields of the other algorithm are ignored (and not validated).
struct GroupOptions {
  Algorithm algorithm = Algorithm::Muon;
  double lr = 1e-3;            // ≥ 0, finite
  double weight_decay = 0.1;   // ≥ 0; decoupled: p ← p·(1 − lr·wd), always with the UNADJUSTED lr

  // Muon
  double momentum = 0.95;      // μ in [0, 1)
  bool nesterov = true;
  MomentumKind momentum_kind = MomentumKind::Ema;
  LrRule lr_rule = LrRule::Original;
  bool cautious_wd = false;    // decay only where U·p ≥ 0 (nanochat); see update.h
  bool normuon = false;        // NorMuon variance reduction after orthogonalization
  double normuon_beta2 = 0.95; // in [0, 1)
  NsOptions ns;                // orthogonalization schedule, steps, method, normalization
  double qk_clip_threshold = 0;  // τ > 0 enables QK-clip on QK-tagged parameters; 0 = off

  // AdamW
  double beta1 = 0.9, beta2 = 0.999;  // in [0, 1)
  double eps = 1e-8;                   // > 0
};

// A parameter group: its hyperparameters and the indices of its parameters (into the optimizer's
// parameter list: the inventory's for dmuon::Optimizer, the ParamInfo list for LocalOptimizer).
// Every parameter is in exactly one group.
struct ParamGroup {
  GroupOptions options;
  std::vector<size_t> params;
};

// Called by a step around its use of optimizer state: acquire(params) before it reads or writes the
// state of those parameters (indices into the optimizer's parameters), release(params) after; once
// per pipeline chunk and once per batch of the AdamW pass (AdamW parameters in order, batches of up
// to OptimizerOptions::chunk_bytes of state, at least one parameter each; both engines:
// LocalOptimizer runs the same pipeline on one rank), on the step's driving thread. A parameter whose state the step does not
// touch (no gradient on every rank, and no NorMuon state to carry) is left out. Where state offload
// plugs in (bring the tensors in / write them back); the built-in offload (offload_state) runs there
// too, before the acquire hook and after the release hook. On a device backend the step's kernels
// on that state have completed when the release hook runs (any stream may read it). Empty: nothing is called. A hook that throws
// fails the step (state may then be partly updated).
struct StateHooks {
  std::function<void(std::span<const size_t> params)> acquire, release;
};

// Throws std::invalid_argument naming the group and the field ("[optim] group 1: momentum 1.2 is
// outside [0, 1)") when a value is out of range or non-finite, or when `ns` is invalid (Muon groups).
DMUON_API void validate_group_options(const GroupOptions& options, size_t group_index);

}  // namespace dmuon
