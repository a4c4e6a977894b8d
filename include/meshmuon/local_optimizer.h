// LocalOptimizer: one optimizer step over whole (unsharded) parameters in one process. It is the
// numerical reference the distributed engine matches bitwise, and a usable optimizer on its own.
//
// Muon group, per parameter: momentum (update.h) → orthogonalize the full matrix (each expert of a
// stack [E, A, B] on its own) → NorMuon if enabled → weight decay (plain or cautious) and update with
// the LR rule on the GLOBAL matrix shape A×B → QK-clip if the group's threshold > 0 and the
// parameter is QK-tagged. AdamW group: fused AdamW (any shape, 1-D included).
// Determinism: same inputs and options → bitwise the same results, whatever the thread counts.
// Not thread-safe: one step at a time.
//
// One engine: LocalOptimizer is a facade over meshmuon::Optimizer (optimizer.h) on a one-rank
// communicator (make_single_communicator()). ParamInfo exists only at this boundary: the list is
// converted once, at construction, into the engine's one parameter type (ParamSpec) on a one-rank
// mesh: every placement Replicate, role from the group's algorithm, `expert` = expert_stack and the
// QK tag copied (Muon groups; AdamW ignores both). The options become OptimizerOptions (comm_dtype,
// non-finite policy, state hooks, offload_state, device, `threads` as compute_streams; MESHMUON_STRATEGY is
// not read).
// Everything else (step validation, state, the per-matrix sequence) is the engine's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/export.h"
#include "meshmuon/optim_options.h"
#include "meshmuon/qk_clip.h"
#include "meshmuon/tensor.h"

namespace meshmuon {

class Plan;         // plan.h
struct StepStats;   // optimizer.h

// A whole parameter of LocalOptimizer (converted to a ParamSpec at construction; see above).
struct ParamInfo {
  std::string name;            // non-empty, unique
  Shape shape;                 // global shape
  bool expert_stack = false;   // 3-D [E, A, B]: E independent A×B matrices
  std::optional<QkTag> qk;     // QK-clip tag (used by Muon groups with qk_clip_threshold > 0)
  // Row blocks orthogonalized independently (ParamSpec::split; Muon groups only): per parameter,
  // beside the group's num_heads / split_sizes (which give every parameter of a group the same).
  std::vector<int64_t> split;
};

struct LocalOptimizerOptions {
  NonFinitePolicy policy = NonFinitePolicy::Raise;
  // The distributed engine's communication dtype. bf16: the orthogonalization input (the momentum
  // output) is rounded to bf16 and back before Newton–Schulz, and its output (after NorMuon) is
  // rounded to bf16 and back before the update, exactly where meshmuon::Optimizer sends them, so a
  // distributed run with that comm dtype matches this reference bitwise. fp32: no rounding.
  DType comm_dtype = DType::F32;
  // Matrices orthogonalized at once (OptimizerOptions::compute_streams). 1: one after another, each
  // product split over meshmuon's product threads (blas_set_num_threads). n ≥ 2: n streams (this thread
  // and n − 1 persistent backend streams) each take whole matrices (largest first) and run their
  // products on one thread (the product threads are set to 1 for the step and restored after).
  // Results are bitwise the same for every value (each matrix's arithmetic is the same: meshmuon's
  // tiled products and oneDNN's bf16 products give the same bits on any thread count, tested on
  // every OpenBLAS core). 0: the product thread count at each step.
  int threads = 1;
  // Around the step's state use: per chunk of the engine's plan and per AdamW pass, on the calling
  // thread (optim_options.h).
  StateHooks state_hooks;
  // State offload (OptimizerOptions::offload_state): state in pinned host memory, staged through
  // device slots per chunk and AdamW batch; bitwise the same results. On the cpu backend the state is
  // in host memory anyway and offload runs the same staging (memcpy, a cost): it exists there so
  // the mechanism is tested. last_stats() reports the bytes moved and the peak resident bytes.
  bool offload_state = false;
  // Where the step runs (OptimizerOptions::device): "cpu" (default), "cuda" or "cuda:N". On a device
  // backend parameters, gradients and state live in that device's memory.
  std::string device = "cpu";
};

class MESHMUON_API LocalOptimizer {
 public:
  // Validates (throws std::invalid_argument naming the parameter or group): names non-empty and
  // unique, every parameter in exactly one group, Muon parameters 2-D or expert stacks (1-D / 3-D
  // without expert_stack: route to AdamW), QK tags consistent with the shape, hyperparameters in
  // range. Creates all state eagerly (zeros, shaped like each parameter; NorMuon's per-row /
  // per-column state shaped [A, 1] / [1, B], or [E, A, 1] / [E, 1, B] for a stack) and
  // per-parameter step counters at 0.
  LocalOptimizer(std::vector<ParamInfo> params, std::vector<ParamGroup> groups,
                 NonFinitePolicy policy = NonFinitePolicy::Raise);
  LocalOptimizer(std::vector<ParamInfo> params, std::vector<ParamGroup> groups,
                 LocalOptimizerOptions options);
  DType comm_dtype() const { return comm_dtype_; }
  int threads() const { return threads_; }
  void set_threads(int threads);  // as LocalOptimizerOptions::threads; ≥ 0
  // The caller's stream on a device (Optimizer::set_stream): step() orders itself with it on the
  // device instead of waiting on the host. nullptr (default): none.
  void set_stream(void* stream);
  void* stream() const;
  ~LocalOptimizer();
  LocalOptimizer(LocalOptimizer&&) noexcept;
  LocalOptimizer& operator=(LocalOptimizer&&) noexcept;

  const std::vector<ParamInfo>& params() const { return params_; }
  const std::vector<ParamGroup>& groups() const;
  // Mutable hyperparameters of group g (LR schedules write lr here between steps). Membership is
  // fixed at construction. A Muon group's `algorithm` and `normuon` may not change (their state
  // exists only for the choice made at construction); step() rejects such a change.
  GroupOptions& options(size_t group);
  NonFinitePolicy policy() const;
  void set_policy(NonFinitePolicy policy);

  // One step. params[i]: fp32, contiguous, shape == params()[i].shape (updated in place).
  // grads[i]: fp32 or bf16, contiguous, same shape (read only); a default-constructed view
  // (TensorView::is_none) means no gradient: that parameter's values, state and step count stay as
  // they are (torch's `grad is None`). qk_logits: layer → per-query-head
  // max logits, required for every layer tagged on a parameter of a group with qk_clip_threshold > 0.
  // Everything is validated before anything is modified: caller mistakes throw
  // std::invalid_argument naming the parameter; a non-finite gradient throws meshmuon::Error naming it
  // (NonFinitePolicy::Raise) or returns false (Skip). After a throw or a skip, parameters, state
  // and step counters are bitwise unchanged. Returns true when the step was applied.
  bool step(std::span<const TensorView> params, std::span<const TensorView> grads,
            const std::map<int, std::vector<float>>& qk_logits = {});

  // fp32 state views (read-write; e.g. to load a checkpoint). Keys: Muon "momentum_buffer" (+
  // "normuon_v" when NorMuon is on); AdamW "exp_avg", "exp_avg_sq". Throws std::invalid_argument
  // naming the parameter and its keys for an unknown key or index.
  TensorView state(size_t param, std::string_view key);
  std::vector<std::string> state_keys(size_t param) const;
  // Steps taken by a parameter (AdamW's t is step_count + 1 during a step).
  int64_t step_count(size_t param) const;
  void set_step_count(size_t param, int64_t count);  // checkpoint loading; count ≥ 0

  // The engine's plan on one rank (every Muon parameter `local`, or `expert_local` for stacks; no
  // bytes move; window 1) and the counters of the last step (times; no bytes on one rank).
  const Plan& plan() const;
  const StepStats& last_stats() const;

 private:
  struct Impl;  // the engine (meshmuon::Optimizer on one rank)
  std::vector<ParamInfo> params_;
  DType comm_dtype_ = DType::F32;
  int threads_ = 1;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshmuon
