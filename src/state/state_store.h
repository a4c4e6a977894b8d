// Internal: the state store. One list of every parameter's optimizer state tensors (keys defined
// once, here), laid out like the parameter's local shard, zero at creation, with the step count
// per parameter. Both engines (LocalOptimizer and the distributed Optimizer) keep their state here,
// and the state views of the C++ and Python APIs come from it. The step calls acquire() before it
// touches a set of parameters' state and release() after (per pipeline chunk, per AdamW pass, per
// LocalOptimizer parameter): the hooks are where state offload plugs in. Memory comes from the
// backend's allocator (host memory on the cpu backend).
//
// With offload (init's `offload`), the tensors are the home copies, in pinned host memory, and
// acquire / release make a group of parameters' state resident in a device slot and write it back
// (state_offload.h); data() then returns the resident copy, and only while acquired. prefetch()
// starts a group's copy-in ahead of its acquire. The views (view()) always alias the home copies,
// which hold the state between steps once flush() has run (the end of every step).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <memory>

#include "backend/device_services.h"
#include "meshmuon/state_hooks.h"
#include "meshmuon/update.h"
#include "meshmuon/tensor.h"
#include "state/state_offload.h"

namespace meshmuon::detail {

// The state keys, by algorithm. Names are torch's (momentum_buffer, exp_avg, exp_avg_sq) and
// NorMuon's factored second moment (normuon_v).
enum class StateKey : uint8_t { Momentum, NormuonV, ExpAvg, ExpAvgSq };
std::string_view to_string(StateKey key);

// What one parameter's state looks like on this rank.
struct StateSpec {
  std::string name;        // for error messages
  Algorithm algorithm = Algorithm::Muon;
  bool normuon = false;    // Muon only: NorMuon's state exists
  Shape shape, v_shape;    // local shard of the parameter and of NorMuon's [A,1] / [1,B] state
};

class StateStore {
 public:
  // All state zero (host memory from `backend`, pinned when `offload`), step counts 0. The backend
  // must outlive the store.
  void init(std::vector<StateSpec> specs, DeviceServices& backend, bool offload = false);
  bool offload() const { return offload_ != nullptr; }
  size_t size() const { return params_.size(); }

  // Raw fp32 storage of a key (nullptr when the shard is empty). The key must exist. With offload:
  // the resident copy, between acquire and release only.
  float* data(size_t param, StateKey key);
  // The keys of a parameter in order, and a view by name (std::invalid_argument naming the
  // parameter and its keys otherwise). The views alias the store: they stay valid for its life.
  std::vector<std::string> keys(size_t param) const;
  TensorView view(size_t param, std::string_view key);

  int64_t steps(size_t param) const;
  void set_steps(size_t param, int64_t count);  // ≥ 0 (checkpoint loading)
  void add_step(size_t param) { ++params_[param].steps; }

  void set_hooks(StateHooks hooks) { hooks_ = std::move(hooks); }
  // Per parameter, this step: its state is not touched (no gradient, no NorMuon state to carry), so
  // acquire / release / prefetch leave it out (the user hooks never see it; offload moves nothing).
  void set_untouched(std::vector<uint8_t> untouched) { untouched_ = std::move(untouched); }
  // Offload first, then the user's acquire hook; release: the user's hook, then offload.
  void acquire(std::span<const size_t> params);
  void release(std::span<const size_t> params);
  void prefetch(std::span<const size_t> params);  // offload only (no hook); no-op otherwise
  // Offload: begin_step resets the counters; flush waits for every copy (home copies current).
  void begin_step();
  void flush();
  OffloadCounters offload_counters() const;

 private:
  struct Tensor {
    StateKey key;
    Shape shape;
    Buffer data;  // shape.numel() floats from the backend's allocator (zeroed)
  };
  struct Param {
    StateSpec spec;
    std::vector<Tensor> tensors;
    int64_t steps = 0;
  };
  const Param& param(size_t i) const;
  // `params` without the untouched ones (a view of `params` when none is left out).
  std::span<const size_t> kept(std::span<const size_t> params, std::vector<size_t>& buffer) const;
  std::vector<Param> params_;
  StateHooks hooks_;
  std::vector<uint8_t> untouched_;
  Device view_device_;  // where view() tensors live: the backend's device when the state is device memory
  DeviceServices* backend_ = nullptr;  // synchronized before the release hook (its kernels may be queued)
  std::unique_ptr<StateOffload> offload_;
};

}  // namespace meshmuon::detail
