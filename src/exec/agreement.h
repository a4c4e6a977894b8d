// Internal: the optimizer's collective agreements (construction: plan_claim.cpp, plan_agreement.cpp; each step:
// step_agreement.cpp), built on the generic ones of comm/agreement.h. Every function here is
// COLLECTIVE and throws the same error on every rank when the ranks disagree, before anything is
// modified.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/agreement.h"
#include "meshmuon/comm.h"
#include "meshmuon/optim_options.h"
#include "meshmuon/optimizer.h"
#include "meshmuon/plan.h"
#include "exec/param_table.h"

namespace meshmuon::detail {

// What a rank brings to the construction agreement.
struct PlanClaim {
  std::string error;                       // this rank's construction error ("" when fine)
  uint64_t fingerprint = 0;                // hash of everything below
  std::vector<uint64_t> spec_hashes;       // per parameter: name, shape, placements, role, group
  std::vector<std::string> spec_texts;     // per parameter, the same in words
  std::vector<uint64_t> entry_hashes;      // per parameter: the plan's decision for it
  std::vector<std::string> entry_texts;    // per parameter, the decision in words
  std::string options_text;                // meshes and optimizer options in words
};

// This rank's claim (plan_claim.cpp): per parameter what the caller gave and what the plan decided,
// and the options, as hashes and in words.
PlanClaim make_plan_claim(const Plan& plan, const ParamTable& table, const OptimizerOptions& options,
                          std::string_view backend_name);

// Compares every rank's claim. The error names, in this order: a rank whose construction failed;
// different parameter counts and the first parameter that differs, with each rank's version;
// different options; the first parameter planned differently.
void agree_on_plan(Communicator& comm, std::chrono::milliseconds timeout, const PlanClaim& claim);

// What a rank brings to a step's agreement (one all-reduce of a few integers when all agree).
struct StepClaim {
  std::string error;                       // this rank's error before the step ("" when fine)
  bool error_is_runtime = false;           // not its inputs: a device or communication failure
  int64_t bad_param = -1;                  // first parameter with a non-finite gradient, or -1
  std::vector<uint8_t> has_grad;           // per parameter: 1 when this rank has its gradient
  std::vector<int64_t> step_counts;        // per parameter, before the step
  std::vector<std::pair<std::string, std::string>> fields;  // hyperparameters and policies, in words
};

// The fields of a step claim: every group's hyperparameters (those of its algorithm), the
// non-finite policy, and the QK logits the step uses.
std::vector<std::pair<std::string, std::string>> step_fields(const std::vector<GroupOptions>& groups,
                                                             NonFinitePolicy policy,
                                                             const std::vector<std::pair<int, const std::vector<float>*>>& logits);

// Returns true when the step is applied, false when it is skipped (a non-finite gradient somewhere
// under NonFinitePolicy::Skip). Throws on every rank: std::invalid_argument when a rank rejected its
// inputs; meshmuon::Error when the first rank with an error failed at run time (error_is_runtime: a
// device fault, which may come from work queued before the step), when the ranks disagree (which parameters have gradients, step counts, a
// hyperparameter or policy: the first difference, with the ranks on each side) or, under
// NonFinitePolicy::Raise, when a gradient is not finite. `names` are the parameter names.
bool agree_on_step(Communicator& comm, std::chrono::milliseconds timeout, const StepClaim& claim,
                   NonFinitePolicy policy, const std::vector<std::string>& names);

}  // namespace meshmuon::detail
