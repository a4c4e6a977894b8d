// The checkpoint of a trainer built on ShardedParams and meshmuon::Optimizer (checkpoint.h):
// "param/<name>" per parameter, "optim/<name>/<key>" per optimizer state tensor, the optimizer's
// per-parameter step counts, over params' world.
#include "meshmuon/checkpoint.h"

#include "backend/backend.h"
#include "meshmuon/error.h"
#include "meshmuon/optimizer.h"
#include "meshmuon/sharded_params.h"
#include "meshmuon/update.h"
#include "checkpoint/common.h"

namespace meshmuon {
namespace {

void check_same_parameters(ShardedParams& params, const Optimizer& optimizer) {
  const Inventory& a = params.inventory();
  const Inventory& b = optimizer.inventory();
  MESHMUON_CHECK(a.params.size() == b.params.size(), "[checkpoint] the optimizer has ", b.params.size(),
              " parameters, the ShardedParams ", a.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    const ParamSpec& p = a.params[i];
    const ParamSpec& q = b.params[i];
    MESHMUON_CHECK(p.name == q.name && p.shape == q.shape, "[checkpoint] parameter ", i, ": the ShardedParams have '",
                p.name, "' ", p.shape.to_string(), ", the optimizer '", q.name, "' ", q.shape.to_string());
    MESHMUON_CHECK(optimizer.local_box(i) == params.local_box(i), "[checkpoint] parameter '", p.name,
                "': the optimizer's local box ", optimizer.local_box(i).to_string(), " differs from the ShardedParams' ",
                params.local_box(i).to_string());
  }
}

// The copy of an engine's backend, for device views (checkpoint.h: CheckpointTensor::device_copy);
// the lambda keeps the backend alive.
CheckpointCopy backend_copy(std::shared_ptr<detail::Backend> backend) {
  return [b = std::move(backend)](void* dst, const void* src, size_t bytes) { b->copy(dst, src, bytes); };
}

}  // namespace

std::vector<CheckpointTensor> checkpoint_tensors(ShardedParams& params, Optimizer* optimizer) {
  if (optimizer != nullptr) check_same_parameters(params, *optimizer);
  const CheckpointCopy params_copy = backend_copy(detail::engine_backend(params));
  const CheckpointCopy optim_copy = optimizer ? backend_copy(detail::engine_backend(*optimizer)) : CheckpointCopy{};
  const Inventory& inv = params.inventory();
  std::vector<CheckpointTensor> out;
  for (size_t i = 0; i < inv.params.size(); ++i) {
    const ParamSpec& p = inv.params[i];
    const Mesh& mesh = inv.meshes[static_cast<size_t>(p.mesh)];
    out.push_back({"param/" + p.name, p.shape, DType::F32, mesh, p.placements, params.param(i), params_copy});
  }
  if (optimizer == nullptr) return out;
  for (size_t i = 0; i < inv.params.size(); ++i) {
    const ParamSpec& p = inv.params[i];
    const Mesh& mesh = inv.meshes[static_cast<size_t>(p.mesh)];
    for (const std::string& key : optimizer->state_keys(i)) {
      // NorMuon's factored second moment is [A,1] / [1,B] (or per expert), placed like the parameter.
      const Shape shape = key == "normuon_v" ? normuon_state_shape(p.shape, p.expert) : p.shape;
      out.push_back({"optim/" + p.name + "/" + key, shape, DType::F32, mesh, p.placements, optimizer->state(i, key),
                     optim_copy});
    }
  }
  return out;
}

void save_checkpoint(const std::string& dir, ShardedParams& params, Optimizer* optimizer, int64_t step,
                     const CheckpointSaveOptions& options) {
  const std::vector<CheckpointTensor> tensors = checkpoint_tensors(params, optimizer);
  std::map<std::string, int64_t> counts;
  if (optimizer != nullptr)
    for (size_t i = 0; i < params.size(); ++i) counts[params.spec(i).name] = optimizer->step_count(i);
  save_checkpoint(params.mesh_communicators()->world(), dir, tensors, step, counts, options);
}

CheckpointInfo load_checkpoint(const std::string& dir, ShardedParams& params, Optimizer* optimizer) {
  const std::vector<CheckpointTensor> tensors = checkpoint_tensors(params, optimizer);
  std::vector<int64_t> counts(params.size());
  // The step counts are checked with the rest of the index, before anything is loaded; they are
  // set only after the data load succeeded on every rank.
  const auto check_counts = [&](const CheckpointInfo& info) {
    if (optimizer == nullptr) return;
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params.spec(i).name;
      const auto it = info.step_counts.find(name);
      MESHMUON_CHECK_RUNTIME(it != info.step_counts.end(), "[checkpoint] ", dir, "/index.json: step_counts: no count for '",
                          name, "' (saved without an optimizer?)");
      counts[i] = it->second;
    }
  };
  CheckpointInfo info =
      detail::load_checkpoint_checked(params.mesh_communicators()->world(), dir, tensors, check_counts);
  if (optimizer != nullptr)
    for (size_t i = 0; i < params.size(); ++i) optimizer->set_step_count(i, counts[i]);
  return info;
}

}  // namespace meshmuon
