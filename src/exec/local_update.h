// Internal: the passes of a step that touch only this rank's shards: Muon's momentum into a
// parameter's update buffer, the update itself (weight decay, the shape-adjusted learning rate,
// QK-clip), and AdamW. The pipeline calls the first two per chunk; the step runs AdamW after it.
#pragma once

#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "meshmuon/inventory.h"
#include "exec/param_table.h"
#include "exec/routes.h"
#include "exec/step_inputs.h"
#include "state/state_store.h"

namespace meshmuon::detail {

// A parameter's local update buffer (fp32, the local shard's numel).
struct UpdateTarget {
  int param;
  float* update;
};

class LocalUpdate {
 public:
  LocalUpdate(Backend& backend, StateStore& state, const Inventory& inventory, const ParamTable& table,
              std::span<const ParamLayout> layouts, const StepInputs& in, DType comm_dtype)
      : backend_(backend), state_(state), inventory_(inventory), table_(table), layouts_(layouts), in_(in),
        comm_dtype_(comm_dtype) {}

  // Momentum of each parameter's local shard into its `update`, rounded to the comm dtype (one
  // multi-tensor call: Backend::momentum_multi); zeros for parameters without a gradient.
  void momentum(std::span<const UpdateTarget> targets);
  // Weight decay + update on each parameter's local shard (one Backend::apply_multi call), then
  // QK-clip on the tagged ones.
  void apply(std::span<const UpdateTarget> targets);
  // AdamW on the active AdamW parameters with a local shard, in order, in batches of up to
  // `chunk_bytes` of state (at least one parameter each); with offload, batch b + 1 is prefetched
  // while batch b updates, so at most two batches are resident.
  void adamw(int64_t chunk_bytes);

 private:
  const GroupOptions& options(int param) const { return in_.options_of(table_, static_cast<size_t>(param)); }

  Backend& backend_;
  StateStore& state_;
  const Inventory& inventory_;
  const ParamTable& table_;
  std::span<const ParamLayout> layouts_;
  const StepInputs& in_;
  DType comm_dtype_;
};

}  // namespace meshmuon::detail
