// Internal: the chunk pipeline of one step (pipeline.cpp): every chunk of the plan gathered,
// orthogonalized, scattered and applied, pipelined over `window` chunks, with the gram_allreduce
// entries run as their chunks start. It is handed what it needs and nothing else: the routes and
// the plan's entries, the communicators, the backend, the state, the compute streams, the local
// update passes and the step's stats.
#pragma once

#include <chrono>
#include <span>

#include "backend/backend.h"
#include "meshmuon/comm.h"
#include "meshmuon/optimizer.h"
#include "meshmuon/plan.h"
#include "exec/arena_pool.h"
#include "exec/compute.h"
#include "exec/local_update.h"
#include "exec/param_table.h"
#include "exec/routes.h"
#include "exec/step_inputs.h"
#include "state/state_store.h"

namespace meshmuon::detail {

struct PipelineContext {
  const Plan& plan;
  const Routes& routes;
  const ParamTable& table;
  const StepInputs& in;
  Communicator& comm;                           // the optimizer's own (messages)
  std::span<Communicator* const> group_comms;   // parallel to routes.group_keys (group collectives)
  Backend& backend;
  StateStore& state;
  ComputeStreams& compute;
  LocalUpdate& update;
  ArenaPool& arenas;
  StepStats& stats;
  int window = 1;                              // chunks in flight (OptimizerOptions::window)
  bool compute_thread = true;                  // OptimizerOptions::compute_thread
  DType comm_dtype = DType::F32;
  std::chrono::milliseconds timeout{0};        // every Work's deadline, from when it was posted
};

// Runs every chunk; updates the Muon parameters. On an error the compute streams are dropped.
void run_pipeline(const PipelineContext& ctx);

}  // namespace meshmuon::detail
