// Internal: the state store (state_store.h).
#include "state/state_store.h"

#include <algorithm>

#include "meshmuon/error.h"

namespace meshmuon::detail {

std::string_view to_string(StateKey key) {
  switch (key) {
    case StateKey::Momentum: return "momentum_buffer";
    case StateKey::NormuonV: return "normuon_v";
    case StateKey::ExpAvg: return "exp_avg";
    case StateKey::ExpAvgSq: return "exp_avg_sq";
  }
  return "?";
}

void StateStore::init(std::vector<StateSpec> specs, DeviceServices& backend, bool offload) {
  offload_.reset();  // first: it may still copy into the tensors below
  params_.clear();
  params_.reserve(specs.size());
  // without offload the state lives in the backend's step memory (device memory on a device backend)
  const bool device = backend.device_caps().device_memory;
  const MemoryKind home = offload ? MemoryKind::PinnedHost : device ? MemoryKind::Device : MemoryKind::Host;
  view_device_ = offload || !device ? Device{} : backend.device();
  backend_ = &backend;
  for (StateSpec& s : specs) {
    Param p;
    const auto zeros = [&](const Shape& sh) { return backend.allocate(static_cast<size_t>(sh.numel()) * sizeof(float), home); };
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
  if (!offload) return;
  std::vector<std::vector<StateOffload::Region>> regions;
  std::vector<std::string> names;
  for (const Param& p : params_) {
    auto& r = regions.emplace_back();
    for (const Tensor& t : p.tensors) r.push_back({t.data.data(), t.data.bytes()});
    names.push_back(p.spec.name);
  }
  offload_ = std::make_unique<StateOffload>(backend, std::move(regions), std::move(names));
}

const StateStore::Param& StateStore::param(size_t i) const {
  MESHMUON_CHECK(i < params_.size(), "[optim] parameter index ", i, " out of range (", params_.size(), " parameters)");
  return params_[i];
}

float* StateStore::data(size_t i, StateKey key) {
  std::vector<Tensor>& ts = params_[i].tensors;
  for (size_t k = 0; k < ts.size(); ++k)
    if (ts[k].key == key) return offload_ ? static_cast<float*>(offload_->resident(i, k)) : ts[k].data.as<float>();
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
    if (to_string(t.key) == key) {
      TensorView v(t.data.as<float>(), t.shape);
      v.device = view_device_;  // device state: a device view (never read on the host)
      return v;
    }
  std::string list;
  for (const Tensor& t : p.tensors) list += (list.empty() ? "" : ", ") + std::string(to_string(t.key));
  throw_invalid_argument(concat("[optim] parameter '", p.spec.name, "' has no state '", key, "'; its keys are: ", list));
}

int64_t StateStore::steps(size_t i) const { return param(i).steps; }

void StateStore::set_steps(size_t i, int64_t count) {
  MESHMUON_CHECK(count >= 0, "[optim] step count ", count, " of '", param(i).spec.name, "' is negative");
  params_[i].steps = count;
}

std::span<const size_t> StateStore::kept(std::span<const size_t> params, std::vector<size_t>& buffer) const {
  const auto untouched = [&](size_t p) { return p < untouched_.size() && untouched_[p]; };
  if (std::none_of(params.begin(), params.end(), untouched)) return params;
  buffer.clear();
  for (size_t p : params)
    if (!untouched(p)) buffer.push_back(p);
  return buffer;
}

void StateStore::acquire(std::span<const size_t> params) {
  std::vector<size_t> buffer;
  const std::span<const size_t> ps = kept(params, buffer);
  if (ps.empty()) return;
  if (offload_) offload_->acquire(ps);
  if (hooks_.acquire) hooks_.acquire(ps);
}

void StateStore::release(std::span<const size_t> params) {
  std::vector<size_t> buffer;
  const std::span<const size_t> ps = kept(params, buffer);
  if (ps.empty()) return;
  if (hooks_.release) {
    if (backend_ != nullptr) backend_->synchronize();  // the hook reads what the step's kernels wrote
    hooks_.release(ps);
  }
  if (offload_) offload_->release(ps);
}

void StateStore::prefetch(std::span<const size_t> params) {
  if (!offload_) return;
  std::vector<size_t> buffer;
  offload_->prefetch(kept(params, buffer));
}

void StateStore::begin_step() {
  if (offload_) offload_->begin_step();
}

void StateStore::flush() {
  if (offload_) offload_->flush();
}

OffloadCounters StateStore::offload_counters() const { return offload_ ? offload_->counters() : OffloadCounters{}; }

}  // namespace meshmuon::detail
