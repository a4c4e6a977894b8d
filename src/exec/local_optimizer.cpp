// LocalOptimizer: a facade over meshmuon::Optimizer on one rank (local_optimizer.h). It checks what
// only it can word (shapes against ParamInfo's expert_stack, QK tags), converts its parameters to
// the engine's inventory and options, and forwards everything else.
#include "meshmuon/local_optimizer.h"

#include "meshmuon/comm.h"
#include "meshmuon/error.h"
#include "meshmuon/inventory.h"
#include "meshmuon/optimizer.h"
#include "comm/staging.h"
#include "backend/select.h"
#include "exec/param_groups.h"

namespace meshmuon {
namespace {

// The facade's own checks, in the words of ParamInfo (expert_stack), before the engine's: group
// membership (the shared check), Muon shapes, QK tags on 2-D weights.
std::vector<int> check_params(const std::vector<ParamInfo>& params, const std::vector<ParamGroup>& groups) {
  const std::vector<int> group_of =
      detail::validate_param_groups(groups, params.size(), [&](size_t i) -> std::string_view { return params[i].name; });
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    const int g = group_of[i];
    if (groups[static_cast<size_t>(g)].options.algorithm == Algorithm::Muon) {
      MESHMUON_CHECK(p.shape.ndim() != 3 || p.expert_stack, "[optim] parameter '", p.name, "' has shape ",
                  p.shape.to_string(), " (3 dims) in Muon group ", g,
                  "; mark it expert_stack ([E, A, B]) or route it to an AdamW group");
      MESHMUON_CHECK((p.shape.ndim() == 2 && !p.expert_stack) || (p.shape.ndim() == 3 && p.expert_stack),
                  "[optim] parameter '", p.name, "' has shape ", p.shape.to_string(), " (", p.shape.ndim(), " dims",
                  p.expert_stack ? ", expert_stack" : "", ") in Muon group ", g,
                  "; Muon takes 2-D matrices and 3-D expert stacks: route it to an AdamW group");
    }
    if (p.qk) {
      MESHMUON_CHECK(p.shape.ndim() == 2 && !p.expert_stack, "[optim] parameter '", p.name,
                  "' has a QK-clip tag but shape ", p.shape.to_string(), "; QK tags need a 2-D weight");
      validate_qk_tag(*p.qk, p.name, p.shape[0]);
    }
  }
  return group_of;
}

// ParamInfo → ParamSpec: one rank, no mesh dims (so no placements: everything is replicated).
Inventory local_inventory(const std::vector<ParamInfo>& params, const std::vector<ParamGroup>& groups,
                          const std::vector<int>& group_of) {
  Inventory inv;
  inv.model = "local";
  inv.mesh_names = {"local"};
  inv.meshes = {Mesh()};
  inv.params.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& info = params[i];
    const bool muon = groups[static_cast<size_t>(group_of[i])].options.algorithm == Algorithm::Muon;
    ParamSpec p;
    p.name = info.name;
    p.shape = info.shape;
    p.dtype = DType::F32;
    p.role = muon ? Role::Muon : Role::AdamW;
    p.expert = muon && info.expert_stack;
    p.mesh = 0;
    if (muon) p.qk = info.qk;
    p.split = info.split;  // validate_param refuses it on an AdamW parameter
    inv.params.push_back(std::move(p));
  }
  return inv;
}

LocalOptimizerOptions options_with(NonFinitePolicy policy) {
  LocalOptimizerOptions o;
  o.policy = policy;
  return o;
}

}  // namespace

struct LocalOptimizer::Impl {
  std::unique_ptr<Optimizer> engine;
};

LocalOptimizer::LocalOptimizer(std::vector<ParamInfo> params, std::vector<ParamGroup> groups,
                               NonFinitePolicy policy)
    : LocalOptimizer(std::move(params), std::move(groups), options_with(policy)) {}

LocalOptimizer::LocalOptimizer(std::vector<ParamInfo> params, std::vector<ParamGroup> groups,
                               LocalOptimizerOptions options)
    : params_(std::move(params)), comm_dtype_(options.comm_dtype), threads_(options.threads),
      impl_(std::make_unique<Impl>()) {
  MESHMUON_CHECK(comm_dtype_ == DType::F32 || comm_dtype_ == DType::BF16, "[optim] comm_dtype must be fp32 or bf16");
  MESHMUON_CHECK(options.policy == NonFinitePolicy::Raise || options.policy == NonFinitePolicy::Skip,
              "[optim] invalid non-finite policy");
  MESHMUON_CHECK(options.threads >= 0, "[optim] threads must be >= 0 (0: the BLAS thread count), got ", options.threads);
  const std::vector<int> group_of = check_params(params_, groups);
  OptimizerOptions o;
  o.comm_dtype = comm_dtype_;
  o.env_override = false;  // MESHMUON_STRATEGY is for distributed runs; one rank has one plan anyway
  o.non_finite = options.policy;
  o.state_hooks = std::move(options.state_hooks);
  o.offload_state = options.offload_state;
  o.blas_threads = 0;          // one rank: the BLAS threads stay as the caller set them
  o.compute_streams = threads_;
  o.compute_thread = false;    // nothing to overlap on one rank: compute on the calling thread
  o.window = 1;                // one chunk in flight bounds the step's buffers to one chunk
  o.machine = MachineProfile::named("cpu");
  o.device = options.device;
  // one backend for the engine and its communicator: the single communicator copies the backend's
  // device memory through its memory space
  detail::EngineDevice device = detail::resolve_engine_device(o.device);
  std::shared_ptr<Communicator> comm = make_single_communicator(device.space);
  const detail::ScopedEngineDevice use(std::move(device));
  impl_->engine = std::make_unique<Optimizer>(std::move(comm), local_inventory(params_, groups, group_of),
                                              std::move(groups), std::move(o));
}

LocalOptimizer::~LocalOptimizer() = default;
LocalOptimizer::LocalOptimizer(LocalOptimizer&&) noexcept = default;
LocalOptimizer& LocalOptimizer::operator=(LocalOptimizer&&) noexcept = default;

void LocalOptimizer::set_threads(int threads) {
  MESHMUON_CHECK(threads >= 0, "[optim] threads must be >= 0 (0: the BLAS thread count), got ", threads);
  impl_->engine->set_compute_streams(threads);
  threads_ = threads;
}

void LocalOptimizer::set_stream(void* stream) { impl_->engine->set_stream(stream); }
void* LocalOptimizer::stream() const { return impl_->engine->stream(); }

const std::vector<ParamGroup>& LocalOptimizer::groups() const { return impl_->engine->groups(); }
GroupOptions& LocalOptimizer::options(size_t g) { return impl_->engine->options(g); }
NonFinitePolicy LocalOptimizer::policy() const { return impl_->engine->non_finite(); }
void LocalOptimizer::set_policy(NonFinitePolicy policy) { impl_->engine->set_non_finite(policy); }

bool LocalOptimizer::step(std::span<const TensorView> params, std::span<const TensorView> grads,
                          const std::map<int, std::vector<float>>& qk_logits) {
  return impl_->engine->step(params, grads, qk_logits);
}

TensorView LocalOptimizer::state(size_t param, std::string_view key) { return impl_->engine->state(param, key); }
std::vector<std::string> LocalOptimizer::state_keys(size_t param) const { return impl_->engine->state_keys(param); }
int64_t LocalOptimizer::step_count(size_t param) const { return impl_->engine->step_count(param); }
void LocalOptimizer::set_step_count(size_t param, int64_t count) { impl_->engine->set_step_count(param, count); }
const Plan& LocalOptimizer::plan() const { return impl_->engine->plan(); }
const StepStats& LocalOptimizer::last_stats() const { return impl_->engine->last_stats(); }

}  // namespace meshmuon
