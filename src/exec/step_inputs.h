// Internal: what one step reads (the caller's buffers and a snapshot of the group options) and the
// step's first pass: everything a rank checks alone, before its step claim is agreed
// (step_check.cpp).
#pragma once

#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "meshmuon/inventory.h"
#include "meshmuon/optim_options.h"
#include "meshmuon/tensor.h"
#include "exec/param_table.h"
#include "exec/routes.h"

namespace meshmuon::detail {

struct StepInputs {
  std::span<const TensorView> params, grads;
  const std::map<int, std::vector<float>>* qk_logits = nullptr;
  std::vector<GroupOptions> options;  // per group, read at the start of the step
  std::vector<uint8_t> active;        // per parameter: has a gradient on every rank (agreed); 0: left untouched

  const GroupOptions& options_of(const ParamTable& table, size_t param) const { return options[table.group(param)]; }
};

// Where a step's buffers must live: the optimizer's device, and how the caller chose it (messages).
struct StepDevice {
  Device device;
  std::string option;  // OptimizerOptions::device
};

// Checks the step's inputs against what construction fixed, throwing std::invalid_argument naming
// the parameter or group: the parameter and gradient counts, every group's options (valid, its
// algorithm and NorMuon switch unchanged), every shard's shape, dtype, contiguity, data and device,
// and the QK logits of the QK-tagged parameters whose group clips. Fills `has_grad` (per parameter)
// and returns the logits the step reads, one entry per layer.
std::vector<std::pair<int, const std::vector<float>*>> check_step_inputs(const StepInputs& in, const Inventory& inventory,
                                                                         const ParamTable& table,
                                                                         std::span<const ParamLayout> layouts,
                                                                         const StepDevice& device,
                                                                         std::vector<uint8_t>& has_grad);

}  // namespace meshmuon::detail
