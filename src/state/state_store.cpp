// Internal: the state store (state_store.h).
#include "state/state_store.h"

#include "dmuon/error.h"

namespace dmuon::detail {

std::string_view to_string(StateKey key) {
  switch (key) {
    case StateKey::Momentum: return "momentum_buffer";
    case StateKey::NormuonV: return "normuon_v";
    case StateKey::ExpAvg: return "exp_avg";
    case StateKey::ExpAvgSq: return "exp_avg_sq";
  }
  return "?";
}

void StateStore::init(std::vector<StateSpec> specs, Backend& backend) {
  params_.clear();
  params_.reserve(specs.size());
  for (StateSpec& s : specs) {
    Param p;
    const auto zeros = [&](const Shape& sh) { return backend.allocate(static_cast<size_t>(sh.numel()) * sizeof(float), MemoryKind::Host); };
    if (s.algorithm == Algorithm::AdamW) {
      p.tensors.push_back({StateKey::ExpAvg, s.shape, zeros(s.shape)});
      p.tensors.push_back({StateKey::ExpAvgSq, s.shape, zeros(s.shape)});
    } else {
      p.tensors.push_back({StateKey::Momentum, s.shape, zeros(s.shape)});
      if (s.normuon) p.tensors.push_back({StateKey::NormuonV, s.v_shape, zeros(s.v_shape)});
    }
    p.spec = std::move(s);
    params_.push_back(std::move(p));
  }
}

const StateStore::Param& StateStore::param(size_t i) const {
  DMUON_CHECK(i < params_.size(), "[optim] parameter index ", i, " out of range (", params_.size(), " parameters)");
  return params_[i];
}

float* StateStore::data(size_t i, StateKey key) {
  for (Tensor& t : params_[i].tensors)
    if (t.key == key) return t.data.as<float>();
  throw_invalid_argument(concat("[optim] internal: parameter '", params_[i].spec.name, "' has no state ", to_string(key)));
}

std::vector<std::string> StateStore::keys(size_t i) const {
  std::vector<std::string> out;
  for (const Tensor& t : param(i).tensors) out.emplace_back(to_string(t.key));
  return out;
}

TensorView StateStore::view(size_t i, std::string_view key) {
  const Param& p = param(i);
  for (Tensor& t : params_[i].tensors)
    if (to_string(t.key) == key) return TensorView(t.data.as<float>(), t.shape);
  std::string list;
  for (const Tensor& t : p.tensors) list += (list.empty() ? "" : ", ") + std::string(to_string(t.key));
  throw_invalid_argument(concat("[optim] parameter '", p.spec.name, "' has no state '", key, "'; its keys are: ", list));
}

int64_t StateStore::steps(size_t i) const { return param(i).steps; }

void StateStore::set_steps(size_t i, int64_t count) {
  DMUON_CHECK(count >= 0, "[optim] step count ", count, " of '", param(i).spec.name, "' is negative");
  params_[i].steps = count;
}

void StateStore::acquire(std::span<const size_t> params) const {
  if (hooks_.acquire && !params.empty()) hooks_.acquire(params);
}

void StateStore::release(std::span<const size_t> params) const {
  if (hooks_.release && !params.empty()) hooks_.release(params);
}

}  // namespace dmuon::detail
