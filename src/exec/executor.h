// Internal: the state of dmuon::Optimizer (Optimizer::Impl) and the passes of one step, one file
// each: agreement.cpp / step_agreement.cpp (construction and per-step agreement), pipeline.cpp (chunks: gather ->
// orthogonalize -> scatter -> update), gram_allreduce.cpp, optimizer.cpp (API, validation, AdamW).
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dmuon/mesh_comms.h"
#include "dmuon/optimizer.h"
#include "backend/backend.h"
#include "exec/routes.h"
#include "state/state_store.h"

namespace dmuon {

struct Optimizer::Impl {
  // The streams go first (their destructors wait for their device work, which uses the scratch,
  // arenas and state below), after the device work this thread queued (a step given the caller's
  // stream returns with its tail queued).
  ~Impl() {
    compute_stream.reset();
    extra_streams.clear();
    try {
      if (backend) backend->synchronize();
    } catch (...) {  // a device error: the last step's, reported there or at a later call
    }
  }
  std::shared_ptr<Communicator> user_comm;               // the world the caller gave (MeshCommunicators::world)
  std::shared_ptr<Communicator> comm;                    // the optimizer's own split of it (step traffic)
  std::shared_ptr<MeshCommunicators> mesh_comms;         // shared with other components
  std::shared_ptr<detail::Backend> backend;              // kernels, streams, thread control
  std::vector<ParamGroup> groups;
  OptimizerOptions options;
  Plan plan;
  int rank = 0;
  std::vector<int> group_of;            // per parameter
  std::vector<Algorithm> algorithm;     // per group, fixed at construction
  std::vector<bool> normuon;            // per group, fixed at construction
  std::vector<bool> param_normuon;      // per parameter
  std::vector<std::string> names;       // per parameter (error messages)
  detail::Routes routes;
  std::vector<Communicator*> group_comms;  // parallel to routes.group_keys; owned by mesh_comms
  detail::StateStore state;            // every parameter's state, local shard layout
  std::vector<std::unique_ptr<Orthogonalizer>> orth;       // per Muon group (compute thread)
  uint64_t predicted_sent = 0, predicted_recv = 0;          // the plan's figures for this rank
  StepStats stats;
  std::vector<detail::Buffer> arenas;   // free chunk arenas (backend memory), reused step to step
  // compute_streams (compute.cpp): streams 2..k, persistent, JobEnd::Queued, each with its
  // Orthogonalizer per Muon group (same NsOptions as orth[g]); the count this step resolved
  // (options.compute_streams, 0: the backend's threads). Dropped when a compute pass or a step fails
  // (their destructors wait for their device work).
  std::vector<std::unique_ptr<detail::Stream>> extra_streams;
  // The pipeline's compute stream (pipeline.cpp), kept from step to step with what lives on its
  // thread (cuda: its cudaStream_t, cuBLAS handle and Newton–Schulz scratch), made as
  // `compute_threaded` (options.compute_thread), JobEnd::Queued (its results reach the scatter by
  // a fence). Dropped when a step fails in the pipeline or at its end wait: a stream whose job
  // failed runs nothing more (a device fault of its work is its error too).
  std::unique_ptr<detail::Stream> compute_stream;
  bool compute_threaded = false;
  double compute_counted = 0;  // its busy_seconds() already in a step's stats (0 for a new stream)
  std::vector<std::vector<std::unique_ptr<Orthogonalizer>>> extra_orth;  // [stream − 1][group]
  int step_streams = 1;
  std::vector<Shape> local_shapes;      // per parameter: this rank's box's shape (step validation)
  // Device backends: NorMuon's v_mean scratch per compute stream (backend memory, grown as needed).
  std::vector<detail::Buffer> v_mean_scratch;
  // Optimizer::set_stream: the caller's stream the step orders itself with (nullptr: the host waits).
  void* caller_stream = nullptr;
};

namespace detail {

// What one step reads: the caller's buffers and a snapshot of the group options.
struct StepInputs {
  std::span<const TensorView> params, grads;
  const std::map<int, std::vector<float>>* qk_logits = nullptr;
  std::vector<GroupOptions> options;  // per group, read at the start of the step
  std::vector<uint8_t> active;        // per parameter: has a gradient on every rank (agreed); 0: left untouched
};

// Runs every chunk of the plan (pipelined) and the gram_allreduce entries; updates Muon parameters.
void run_pipeline(Optimizer::Impl& s, const StepInputs& in);

// One unit batch to orthogonalize (+ NorMuon when v): `batch` matrices rows × cols at data.
struct UnitJob {
  int param = 0;
  float* data = nullptr;
  float* v = nullptr;
  int64_t batch = 1, rows = 0, cols = 0;
};
// Orthogonalizes every job (compute.cpp); called on the compute stream.
void compute_units(Optimizer::Impl& s, const StepInputs& in, std::span<const UnitJob> jobs);

// gram_allreduce entries of one chunk: blocking, on the driving thread.
void run_gram(Optimizer::Impl& s, const StepInputs& in, int entry, float* update);

// A parameter's local update buffer (in a chunk's arena).
struct UpdateTarget {
  int param;
  float* update;
};
// Momentum of each parameter's local shard into its `update`, rounded to the comm dtype (one
// multi-tensor call: Backend::momentum_multi); zeros for parameters without a gradient.
void local_momentum(Optimizer::Impl& s, const StepInputs& in, std::span<const UpdateTarget> targets);
// Weight decay + update on each parameter's local shard (one Backend::apply_multi call), then
// QK-clip on the tagged ones.
void local_apply(Optimizer::Impl& s, const StepInputs& in, std::span<const UpdateTarget> targets);

// Waits for `w` with the optimizer's timeout (options.timeout, else the communicator's default).
void wait_work(const Optimizer::Impl& s, Work& w);
std::chrono::milliseconds work_timeout(const Optimizer::Impl& s, const Communicator& c);

}  // namespace detail
}  // namespace dmuon
