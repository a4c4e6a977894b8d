// The hooks a step calls around its use of optimizer state (OptimizerOptions::state_hooks,
// LocalOptimizerOptions::state_hooks): where state offload plugs in.
#pragma once

#include <cstddef>
#include <functional>
#include <span>

namespace meshmuon {

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

}  // namespace meshmuon
