// Internal: the state store. One list of every parameter's optimizer state tensors (keys defined
// once, here), laid out like the parameter's local shard, zero at creation, with the step count
// per parameter. Both engines (LocalOptimizer and the distributed Optimizer) keep their state here,
// and the state views of the C++ and Python APIs come from it. The step calls acquire() before it
// touches a set of parameters' state and release() after (per pipeline chunk, per AdamW pass, per
// LocalOptimizer parameter): the hooks are where state offload plugs in. Memory comes from the
// backend's allocator (host memory on the cpu backend).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "dmuon/optim_options.h"
#include "dmuon/tensor.h"

namespace dmuon::detail {

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
  // All state zero (host memory from `backend`), step counts 0.
  void init(std::vector<StateSpec> specs, Backend& backend);
  size_t size() const { return params_.size(); }

  // Raw fp32 storage of a key (nullptr when the shard is empty). The key must exist.
  float* data(size_t param, StateKey key);
  // The keys of a parameter in order, and a view by name (std::invalid_argument naming the
  // parameter and its keys otherwise). The views alias the store: they stay valid for its life.
  std::vector<std::string> keys(size_t param) const;
  TensorView view(size_t param, std::string_view key);

  int64_t steps(size_t param) const;
  void set_steps(size_t param, int64_t count);  // ≥ 0 (checkpoint loading)
  void add_step(size_t param) { ++params_[param].steps; }

  void set_hooks(StateHooks hooks) { hooks_ = std::move(hooks); }
  void acquire(std::span<const size_t> params) const;
  void release(std::span<const size_t> params) const;

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
  std::vector<Param> params_;
  StateHooks hooks_;
};

}  // namespace dmuon::detail
