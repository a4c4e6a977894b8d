// Internal: what a meshmuon::Optimizer holds (Optimizer::Impl), built at construction
// (optimizer.cpp) and read by its step, whose passes are units of their own: step_check.cpp (the
// local checks), step_agreement.cpp (the per-step agreement), pipeline.cpp (the chunks: gather ->
// orthogonalize -> scatter -> update, with gram_allreduce.cpp), compute.cpp (the compute streams),
// local_update.cpp (momentum, the update, AdamW on local shards).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "meshmuon/mesh_comms.h"
#include "meshmuon/optimizer.h"
#include "backend/backend.h"
#include "exec/arena_pool.h"
#include "exec/compute.h"
#include "exec/param_table.h"
#include "exec/routes.h"
#include "state/state_store.h"

namespace meshmuon {

struct Optimizer::Impl {
  // The streams go first (their destructors wait for their device work, which uses the arenas and
  // state below), then the device work this thread queued (a step given the caller's stream
  // returns with its tail queued).
  ~Impl() {
    compute.drop();
    try {
      if (backend) backend->synchronize();
    } catch (...) {  // a device error: the last step's, reported there or at a later call
    }
  }

  // Communicators
  std::shared_ptr<Communicator> user_comm;         // the world the caller gave (MeshCommunicators::world)
  std::shared_ptr<Communicator> comm;              // the optimizer's own split of it (step traffic)
  std::shared_ptr<MeshCommunicators> mesh_comms;   // shared with other components
  std::vector<Communicator*> group_comms;          // parallel to routes.group_keys; owned by mesh_comms
  int rank = 0;

  // What the caller configured, and what construction fixed from it
  std::vector<ParamGroup> groups;
  OptimizerOptions options;
  Plan plan;
  detail::ParamTable table;
  detail::Routes routes;
  uint64_t predicted_sent = 0, predicted_recv = 0;  // the plan's figures for this rank

  // Where the step runs
  std::shared_ptr<detail::Backend> backend;  // kernels, streams, thread control
  void* caller_stream = nullptr;             // Optimizer::set_stream (nullptr: the host waits)
  detail::StateStore state;                  // every parameter's state, local shard layout
  detail::ArenaPool arenas;                  // chunk arenas, reused step to step
  detail::ComputeStreams compute;            // Orthogonalizers and compute streams (declared last: destroyed first)

  StepStats stats;

  // Every Work's deadline: options.timeout, else the communicator's default.
  std::chrono::milliseconds timeout(const Communicator& c) const {
    return options.timeout.count() > 0 ? options.timeout : c.default_timeout();
  }
};

}  // namespace meshmuon
