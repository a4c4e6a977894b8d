// meshmuon::Optimizer: the distributed optimizer step. Runs a Plan (plan.h) every step over a
// Communicator (comm.h): momentum on local shards, pipelined gather -> orthogonalize (+ NorMuon) ->
// scatter per chunk, update on local shards (+ QK-clip), AdamW locally. docs/executor.md explains it.
//
// Numerics: for a given configuration the results are BITWISE those of LocalOptimizer (built with the
// same groups and LocalOptimizerOptions::comm_dtype) whatever the world size, mesh, strategy or thread
// count, except `gram_allreduce` (sum order; documented tolerance).
//
// Contract:
// - COLLECTIVE: the constructor and step() must be called by every rank of the communicator, in the
//   same order, with the same inventory, groups and options (the constructor checks this: it agrees on
//   the plan fingerprint before any other collective and throws the same meshmuon::Error on every rank,
//   naming the first differing parameter, when ranks disagree). Every step() is agreed too, in the
//   one small all-reduce the step makes anyway: which parameters have gradients, every rank's step
//   counts, every group's hyperparameters (options(g) as read at that step), the non-finite policy
//   and the QK logits used. A difference raises the same meshmuon::Error on every rank, naming the
//   first differing parameter or field and the ranks on each side, before anything is modified.
// - THREADS: one thread calls step(); it drives every collective. step() runs orthogonalization on one
//   internal compute thread (OptimizerOptions::compute_thread) while it drives communication, fanned
//   out over OptimizerOptions::compute_streams streams.
// - BUFFERS: step() reads gradients and updates parameters in the caller's buffers in place
//   (zero-copy). State lives inside the optimizer shaped like each parameter's LOCAL shard.
// - ERRORS: caller mistakes throw std::invalid_argument naming the parameter; every rank throws (ranks
//   whose inputs were fine name the rank that rejected its inputs). Communication failures and
//   timeouts throw meshmuon::Error (the job must then end through meshmuon::abort_all). Nothing is modified
//   when a step throws before its first data collective (all validation and the non-finite check).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/comm.h"
#include "meshmuon/export.h"
#include "meshmuon/inventory.h"
#include "meshmuon/mesh_comms.h"
#include "meshmuon/optim_options.h"
#include "meshmuon/plan.h"
#include "meshmuon/tensor.h"
#include "meshmuon/update.h"

namespace meshmuon {

class Optimizer;
namespace detail {
class Backend;
// Internal (src/checkpoint/checkpoint.cpp): the backend whose memory the state is.
std::shared_ptr<Backend> engine_backend(const Optimizer& optimizer);
}  // namespace detail

struct OptimizerOptions {
  DType comm_dtype = DType::F32;       // what update inputs and results travel as (fp32 or bf16)
  StrategyRules pins;                  // per-parameter strategy pins (highest precedence)
  bool env_override = true;            // read MESHMUON_STRATEGY (strategy_rules_from_env())
  bool exact = true;                   // the cost model never picks gram_allreduce
  ReplicaMode replica = ReplicaMode::Auto;
  MachineProfile machine;              // cost model constants (plan.h)
  int64_t chunk_bytes = int64_t{32} << 20;  // chunk cap (PlanOptions::chunk_bytes)
  int window = 2;                      // chunks in flight; 1 disables overlap
  NonFinitePolicy non_finite = NonFinitePolicy::Raise;
  std::chrono::milliseconds timeout{0};  // per wait; 0 = the communicator's default timeout
  // Product threads while a step runs (blas_set_num_threads; restored when it returns): 0 = 1 when
  // the communicator has > 1 rank, else unchanged.
  int blas_threads = 0;
  bool compute_thread = true;          // orthogonalize on a worker thread (false: on the caller's)
  // Compute streams per chunk: the compute thread and compute_streams − 1 persistent backend
  // streams take whole units (matrices to orthogonalize, largest first) from the chunk, each with
  // its own Orthogonalizers and scratch, and run their products on one thread (the backend is set
  // to 1 thread while the step runs with k > 1, and restored after). 0 = the backend's thread
  // count as the step runs (after blas_threads: 1 by default on several ranks), read at each step.
  // Results are bitwise the same for every value (a unit's arithmetic does not depend on the
  // stream or the thread count). LocalOptimizer's `threads` is this option on one rank.
  int compute_streams = 1;
  StateHooks state_hooks;              // around each chunk's and AdamW batch's state use (optim_options.h)
  // State offload: optimizer state (momentum, NorMuon, AdamW moments) lives in pinned host memory;
  // each pipeline chunk's state (and each AdamW batch's, batches of up to chunk_bytes of state) is
  // copied to a device slot ahead of use, one chunk ahead, on a copy stream overlapping the current
  // chunk's compute, and written back after (through the state store's acquire / release, where the
  // state hooks run too). Results are bitwise those without offload. Device memory holding state is
  // bounded: StepStats::peak_state_resident_bytes ≤ (window + 1) × the largest chunk's (or AdamW
  // batch's) state bytes on this rank, each tensor rounded up to 256 bytes; to keep that bound a
  // chunk's scatter is posted only once the previous chunk has finished (same posting order). The
  // state views (state(), checkpoints) read the pinned home copies, current between steps. On the cpu
  // backend the state lives in host memory anyway and the staging is the same copies (memcpy): it
  // costs time there and exists so the mechanism is tested on machines without a GPU.
  bool offload_state = false;
  // Where the step runs: "cpu" (default), "cuda" or "cuda:N" (a build without CUDA, or a machine
  // without that device, fails at construction). On a device backend every parameter and gradient
  // view must carry that device (TensorView::device; checked each step, naming the parameter), the
  // state, chunk arenas and scratch are device memory, and state() returns device views (read them
  // with the device's own copy; docs/decisions/022-engine-on-a-device-backend.md). Streams: by
  // default the step does not order itself after the caller's streams, so the gradients must be in
  // memory when step() is called (synchronize the stream that wrote them), and when step() returns
  // its writes are in memory, for any stream to read; Optimizer::set_stream orders it with one
  // stream on the device instead (meshmuon.torch passes PyTorch's current stream).
  std::string device = "cpu";
};

// The counters of the last step() (this rank). Seconds are wall-clock.
struct StepStats {
  bool applied = false;                // false when skipped (non-finite gradient, policy skip)
  double step_seconds = 0;
  double pack_seconds = 0;             // momentum, pack, unpack, assemble (driving thread)
  double comm_wait_seconds = 0;        // driving thread idle, waiting for collectives
  // NS + NorMuon on the compute streams: the compute thread's time on the cpu; device time on a
  // device (counted once the device has done it: with set_stream, a step's last chunks may count
  // in the next step's figure). gram_allreduce's iterations run on the driving thread (pack_seconds).
  double orthogonalize_seconds = 0;
  double update_seconds = 0;           // weight decay, update, QK-clip, AdamW
  double agree_seconds = 0;            // the step's agreement: its claim (digests) and its all-reduce
  double comm_seconds = 0;             // wall time with at least one collective in flight
  double overlap = 0;                  // fraction of comm_seconds during which compute ran (device: was queued or running)
  // Measured payload of the step's data collectives (comm counters; the control all-reduce
  // excluded), NorMuon state included; its part is also reported on its own.
  uint64_t bytes_sent = 0, bytes_recv = 0;
  uint64_t bytes_sent_state = 0, bytes_recv_state = 0;
  // The plan's prediction for this rank, NorMuon state included (bytes_sent must equal it exactly).
  uint64_t bytes_sent_predicted = 0, bytes_recv_predicted = 0;
  uint64_t peak_buffer_bytes = 0;      // largest sum of transient buffers alive at once
  // State offload (OptimizerOptions::offload_state; all 0 without): state bytes copied to device
  // slots and written back this step, and the largest device memory holding state (the slot pool,
  // kept between steps) while it ran.
  uint64_t offload_bytes_in = 0, offload_bytes_out = 0;
  uint64_t peak_state_resident_bytes = 0;
  int chunks = 0;
  int64_t collectives = 0;
};

class MESHMUON_API Optimizer {
 public:
  // COLLECTIVE. `inventory` places every parameter on meshes spanning comm->size() ranks; `groups`
  // index inventory.params (each parameter in exactly one group; Muon-role parameters in Muon groups,
  // AdamW-role ones in AdamW groups). Builds the plan (make_plan), agrees on it with every rank,
  // creates the sub-communicators it needs and all state (zeros, eagerly). Throws
  // std::invalid_argument on bad inputs (before any collective), meshmuon::Error on disagreement.
  Optimizer(std::shared_ptr<Communicator> comm, Inventory inventory, std::vector<ParamGroup> groups,
            OptimizerOptions options = {});
  // The same over mesh communicators owned outside the optimizer (comms->world() is the
  // communicator): the sub-communicators the plan needs (agrs reduce-scatters, gram_allreduce) come
  // from `comms` and stay shared with any other component using it (created on first use, in plan
  // order: COLLECTIVE). The constructor above makes its own MeshCommunicators over `comm`.
  Optimizer(std::shared_ptr<MeshCommunicators> comms, Inventory inventory, std::vector<ParamGroup> groups,
            OptimizerOptions options = {});
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // COLLECTIVE. params[i] / grads[i]: this rank's local shard of inventory parameter i, contiguous,
  // shape == local_shape(i) (params fp32, updated in place; grads fp32 or bf16, read only). A
  // default-constructed grads[i] (TensorView::is_none) means "no gradient": the parameter is left
  // untouched (values, state, step count), as torch does for `grad is None`; it must then be
  // absent on every rank (a rank whose gradients are all absent still calls step()).
  // qk_logits: layer -> per-head max logits (same on every rank), needed for QK-tagged parameters of
  // groups with qk_clip_threshold > 0. Returns false when skipped (non-finite gradient under
  // NonFinitePolicy::Skip: nothing changed on any rank).
  bool step(std::span<const TensorView> params, std::span<const TensorView> grads,
            const std::map<int, std::vector<float>>& qk_logits = {});

  // Hyperparameters of group g, read at every step (LR schedules write here). As LocalOptimizer:
  // a Muon group's algorithm and normuon may not change.
  GroupOptions& options(size_t group);
  const std::vector<ParamGroup>& groups() const;
  const Plan& plan() const;
  const Inventory& inventory() const;
  const std::shared_ptr<MeshCommunicators>& mesh_communicators() const;
  int rank() const;
  Box local_box(size_t param) const;
  Shape local_shape(size_t param) const;

  // fp32 state of this rank's shard (read-write). Keys as LocalOptimizer: "momentum_buffer" (+
  // "normuon_v", shaped like the local box of [A,1] / [1,B] / [E,A,1] / [E,1,B] under the parameter's
  // placements), "exp_avg", "exp_avg_sq". Throws std::invalid_argument naming the keys otherwise.
  TensorView state(size_t param, std::string_view key);
  std::vector<std::string> state_keys(size_t param) const;
  int64_t step_count(size_t param) const;
  void set_step_count(size_t param, int64_t count);

  const StepStats& last_stats() const;

  // Options that may change between steps (read at the next step; the non-finite policy is part of
  // the step's agreement, so set it alike on every rank). Throw std::invalid_argument on bad values.
  NonFinitePolicy non_finite() const;
  void set_non_finite(NonFinitePolicy policy);
  int compute_streams() const;
  void set_compute_streams(int streams);  // ≥ 0, as OptimizerOptions::compute_streams
  // The caller's stream on a device backend (a cudaStream_t of the optimizer's device, as a pointer;
  // cudaStreamLegacy, (void*)0x1, for the legacy default stream, which PyTorch's default stream
  // is). With one, step() orders itself with it on the device: its work starts after what was
  // queued on the stream before the call (the gradients need not be in memory when step() is
  // called), and work queued there after step() returns (or throws) runs after the step's work;
  // step() then returns without waiting for its tail. The host still waits inside the step: for
  // the non-finite check of the gradients (so, once, for what the stream queued before the call),
  // for each collective's completion (its deadline), and where a hand-off cannot wait on the
  // device (a communicator other than nccl, gram_allreduce's trace, the offload copy-in, state
  // hooks: docs/decisions/028-device-order-without-host-waits.md). Another stream, or the host, reading the
  // parameters or state afterwards must be ordered after this stream (cudaStreamWaitEvent /
  // wait_stream, or a synchronization of this stream). StepStats wall times then measure the
  // host's part (orthogonalize_seconds is device time, and a step's last chunk may count in the
  // next step's figure); a device fault of the step's work surfaces at a later CUDA call, at the
  // latest in the next step. nullptr (the default): step() expects its inputs in memory and waits
  // until its writes are. A non-null stream on the cpu backend throws std::invalid_argument. Local
  // (not part of the agreement).
  void set_stream(void* stream);
  void* stream() const;

  struct Impl;

 private:
  friend std::shared_ptr<detail::Backend> detail::engine_backend(const Optimizer& optimizer);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshmuon
