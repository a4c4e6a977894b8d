// meshmuon::Optimizer: construction (validation, plan, agreement, sub-communicators, eager state), the
// step as a sequence of its passes (each in a unit of its own: optimizer_impl.h), and state access.
#include "meshmuon/optimizer.h"

#include <algorithm>
#include <utility>

#include "meshmuon/error.h"
#include "meshmuon/update.h"
#include "backend/select.h"
#include "comm/device_check.h"
#include "exec/agreement.h"
#include "exec/local_update.h"
#include "exec/optimizer_impl.h"
#include "exec/param_groups.h"
#include "exec/pipeline.h"
#include "exec/step_inputs.h"

namespace meshmuon {
namespace {

using detail::ParamLayout;

// pass: everything a rank can check alone, before any collective
void validate_construction(const Optimizer::Impl& s, const Inventory& inv, const std::vector<ParamGroup>& groups,
                           std::vector<int>& group_of) {
  inv.validate();
  MESHMUON_CHECK(inv.world_size() == s.user_comm->size(), "[optim] the inventory's meshes span ", inv.world_size(),
              " ranks but the communicator has ", s.user_comm->size(), "; build the mesh for this world");
  const OptimizerOptions& o = s.options;
  MESHMUON_CHECK(o.comm_dtype == DType::F32 || o.comm_dtype == DType::BF16, "[optim] comm_dtype must be fp32 or bf16");
  MESHMUON_CHECK(o.window >= 1, "[optim] option 'window' must be ≥ 1 (got ", o.window, ")");
  MESHMUON_CHECK(o.blas_threads >= 0, "[optim] option 'blas_threads' must be ≥ 0");
  MESHMUON_CHECK(o.compute_streams >= 0, "[optim] option 'compute_streams' must be ≥ 0 (0: the backend's thread count), got ",
              o.compute_streams);
  MESHMUON_CHECK(o.non_finite == NonFinitePolicy::Raise || o.non_finite == NonFinitePolicy::Skip,
              "[optim] invalid non-finite policy");
  MESHMUON_CHECK(o.timeout.count() >= 0, "[optim] option 'timeout' must be ≥ 0");
  const size_t n = inv.params.size();
  group_of = detail::validate_param_groups(groups, n, [&](size_t i) -> std::string_view { return inv.params[i].name; });
  for (size_t i = 0; i < n; ++i) {
    const ParamSpec& p = inv.params[i];
    const Algorithm a = groups[static_cast<size_t>(group_of[i])].options.algorithm;
    const bool ok = (a == Algorithm::Muon) == (p.role == Role::Muon);
    MESHMUON_CHECK(ok, "[optim] parameter '", p.name, "' has role ", to_string(p.role), " in the inventory but is in ",
                to_string(a), " group ", group_of[i], "; move it to a group of its role (the plan follows the role)");
    MESHMUON_CHECK(p.dtype == DType::F32, "[optim] parameter '", p.name, "' is ", to_string(p.dtype),
                "; master parameters must be fp32");
  }
}

// The groups' split option into the inventory (ParamSpec::split: the planner plans the blocks and
// the executor orthogonalizes them). An inventory that already splits a parameter keeps it when the
// group says nothing or the same. NorMuon keeps one statistic per row or column of the WHOLE matrix
// (its state's shape); a block uses that same state slice only when every block keeps the whole
// matrix's side (per row: each block at least as tall as it is wide), so other splits are refused.
void apply_group_splits(Inventory& inv, const std::vector<ParamGroup>& groups, const std::vector<int>& group_of) {
  for (size_t i = 0; i < inv.params.size(); ++i) {
    ParamSpec& p = inv.params[i];
    const GroupOptions& o = groups[static_cast<size_t>(group_of[i])].options;
    if (p.role != Role::Muon) continue;
    std::vector<int64_t> blocks = resolve_split(o, p.rows(), p.name);
    if (!blocks.empty()) {
      MESHMUON_CHECK(p.split.empty() || p.split == blocks, "[optim] parameter '", p.name,
                  "': the inventory splits it into other row blocks than its group's split option; give one of the two");
      p.split = std::move(blocks);
    }
    if (p.split.empty() || !o.normuon) continue;
    for (int64_t b : p.split)
      MESHMUON_CHECK(b >= p.cols(), "[optim] parameter '", p.name, "' ", p.shape.to_string(), ": NorMuon on a block of ", b,
                  " rows × ", p.cols(), " columns would keep per-column statistics, but the parameter's NorMuon state is per "
                  "row of the whole matrix; with NorMuon, split into blocks of at least ", p.cols(), " rows (e.g. q, k, v "
                  "of a fused QKV) or turn NorMuon off for this group");
  }
}

// The planner's options: the optimizer's, the first Muon group's Newton–Schulz, and which
// parameters carry NorMuon state (part of the byte prediction).
PlanOptions plan_options(const Optimizer::Impl& s, const Inventory& inventory) {
  PlanOptions po;
  for (const ParamGroup& g : s.groups)
    if (g.options.algorithm == Algorithm::Muon) {
      po.ns = g.options.ns;
      break;
    }
  po.comm_dtype = s.options.comm_dtype;
  po.machine = s.options.machine;
  po.pins = s.options.pins;
  if (s.options.env_override) po.env_override = strategy_rules_from_env();
  po.exact = s.options.exact;
  po.replica = s.options.replica;
  po.chunk_bytes = s.options.chunk_bytes;
  po.window = s.options.window;
  po.normuon.assign(inventory.params.size(), false);
  for (size_t i = 0; i < inventory.params.size(); ++i) {
    const GroupOptions& go = s.groups[static_cast<size_t>(s.table.group_of[i])].options;
    po.normuon[i] = go.algorithm == Algorithm::Muon && go.normuon;
  }
  return po;
}

// The per-group and per-parameter facts a step reads (ParamTable), from the groups and the plan.
void fill_table(Optimizer::Impl& s) {
  detail::ParamTable& t = s.table;
  for (const ParamGroup& g : s.groups) {
    t.algorithm.push_back(g.options.algorithm);
    t.normuon.push_back(g.options.algorithm == Algorithm::Muon && g.options.normuon);
    t.split.emplace_back(g.options.num_heads, g.options.split_sizes);
  }
  const auto& params = s.plan.inventory().params;
  t.param_normuon.assign(params.size(), false);
  t.gram_param.assign(s.groups.size(), -1);
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t g = t.group(i);
    t.param_normuon[i] = t.normuon[g];
    t.names.push_back(params[i].name);
    const PlanEntry* e = s.plan.entry_of(static_cast<int>(i));
    if (e && e->strategy == Strategy::GramAllReduce && t.gram_param[g] < 0) t.gram_param[g] = static_cast<int>(i);
    MESHMUON_CHECK(!(e && e->strategy == Strategy::GramAllReduce && t.normuon[g]), "[optim] parameter '", params[i].name,
                "' uses gram_allreduce, which does not support NorMuon; pin another strategy or turn NorMuon off");
    // gram_allreduce orthogonalizes a matrix that stays sharded along its long dim: MuonEq's row norms
    // and Muon+'s Frobenius norm would need reductions of their own (docs/decisions/040-muoneq-muonplus-decay-lr.md).
    const NsOptions& ns = s.groups[g].options.ns;
    MESHMUON_CHECK(!(e && e->strategy == Strategy::GramAllReduce && s.groups[g].options.algorithm == Algorithm::Muon &&
                  (ns.muon_eq || ns.muon_plus)),
                "[optim] parameter '", params[i].name, "' uses gram_allreduce, which does not support ",
                ns.muon_eq ? "muon_eq" : "muon_plus", "; pin another strategy or turn ", ns.muon_eq ? "muon_eq" : "muon_plus",
                " off");
  }
}

// Writes back offloaded state (StateStore::flush) when a step throws after its first acquire.
struct StateFlush {
  detail::StateStore* state = nullptr;
  ~StateFlush() {
    if (!state) return;
    try {
      state->flush();
    } catch (...) {  // the step's own error is the one that propagates
    }
  }
};

// Restores the backend's thread count when a step returns or throws.
struct ThreadRestore {
  detail::Backend* backend = nullptr;
  int threads = 0;
  ~ThreadRestore() {
    if (backend) backend->set_threads(threads);
  }
};

// Optimizer::set_stream: the caller's stream waits for the step's queued work when the step ends,
// also when it throws (its kernels may still read the gradients and write the parameters).
struct CallerOrder {
  detail::Backend* backend = nullptr;
  void* stream = nullptr;
  void order() {
    void* st = std::exchange(stream, nullptr);
    if (st != nullptr) backend->wait(backend->fence().event(), st);
  }
  ~CallerOrder() {
    try {
      order();
    } catch (...) {  // unwinding already: the device error surfaces at the caller's next use
    }
  }
};

// The bytes every communicator of the step moved so far.
CommCounters step_counters(const Optimizer::Impl& s) {
  CommCounters c = s.comm->counters();
  for (const Communicator* gc : s.group_comms)
    c.bytes_sent += gc->counters().bytes_sent, c.bytes_recv += gc->counters().bytes_recv, c.collectives += gc->counters().collectives;
  return c;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::shared_ptr<MeshCommunicators> mesh_communicators_of(std::shared_ptr<Communicator> comm) {
  MESHMUON_CHECK(comm != nullptr, "[optim] the communicator is null; pass make_mpi_communicator() or make_single_communicator()");
  return std::make_shared<MeshCommunicators>(std::move(comm));
}

}  // namespace

Optimizer::Optimizer(std::shared_ptr<Communicator> comm, Inventory inventory, std::vector<ParamGroup> groups,
                     OptimizerOptions options)
    : Optimizer(mesh_communicators_of(std::move(comm)), std::move(inventory), std::move(groups), std::move(options)) {}

Optimizer::Optimizer(std::shared_ptr<MeshCommunicators> comms, Inventory inventory, std::vector<ParamGroup> groups,
                     OptimizerOptions options)
    : impl_(std::make_unique<Impl>()) {
  MESHMUON_CHECK(comms != nullptr, "[optim] the mesh communicators are null; pass std::make_shared<MeshCommunicators>(world)");
  Impl& s = *impl_;
  s.user_comm = comms->world_ptr();
  s.mesh_comms = std::move(comms);
  s.options = std::move(options);
  s.groups = std::move(groups);
  s.rank = s.user_comm->rank();
  detail::PlanClaim claim;
  try {  // pass 1: local checks and the plan; an error here is shared with every rank below
    s.backend = detail::resolve_engine_device(s.options.device).backend;  // e.g. a rank without its GPU
    detail::check_comm_carries_device(*s.backend, *s.user_comm, "[optim]");
    validate_construction(s, inventory, s.groups, s.table.group_of);
    apply_group_splits(inventory, s.groups, s.table.group_of);
    s.plan = make_plan(inventory, plan_options(s, inventory));
    fill_table(s);
    claim = detail::make_plan_claim(s.plan, s.table, s.options, s.backend->name());
  } catch (const std::exception& e) {
    claim.error = e.what();
  }
  // pass 2: agree (collective; the same error everywhere on disagreement)
  detail::agree_on_plan(*s.user_comm, s.timeout(*s.user_comm), claim);

  // pass 3: communicators (collective, in plan order), routes, eager state
  s.comm = s.user_comm->split(0, s.rank, "meshmuon.optimizer");
  s.routes = detail::build_routes(s.plan, s.rank, s.table.param_normuon);
  const Inventory& inv = s.plan.inventory();
  for (const detail::GroupKey& k : s.routes.group_keys)  // collective on first use of a key, in plan order
    s.group_comms.push_back(&s.mesh_comms->get(inv.meshes[static_cast<size_t>(k.mesh)], k.dims));
  s.compute.init(*s.backend, s.groups);
  std::vector<detail::StateSpec> specs;  // eager state: everything a checkpoint holds exists from the start
  for (size_t i = 0; i < inv.params.size(); ++i) {
    const ParamLayout& L = s.routes.layouts[i];
    s.table.local_shapes.push_back(L.box.shape());
    specs.push_back({inv.params[i].name, s.table.algorithm[s.table.group(i)], static_cast<bool>(s.table.param_normuon[i]),
                     L.box.shape(), L.v_box.shape()});
  }
  s.state.init(std::move(specs), *s.backend, s.options.offload_state);
  s.state.set_hooks(s.options.state_hooks);  // the store leaves out the parameters a step does not touch
  // the plan's byte prediction for this rank (what StepStats compares the counters with): the
  // routes summed it from the plan's transfers while taking this rank's share of them
  s.predicted_sent = s.routes.predicted_sent;
  s.predicted_recv = s.routes.predicted_recv;
}

Optimizer::~Optimizer() = default;

bool Optimizer::step(std::span<const TensorView> params, std::span<const TensorView> grads,
                     const std::map<int, std::vector<float>>& qk_logits) {
  Impl& s = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  const Inventory& inv = s.plan.inventory();
  const size_t n = inv.params.size();
  detail::StepInputs in{params, grads, &qk_logits, {}, {}};
  for (const ParamGroup& g : s.groups) in.options.push_back(g.options);
  detail::StepClaim claim;
  claim.has_grad.assign(n, 0);
  claim.step_counts.resize(n);
  for (size_t i = 0; i < n; ++i) claim.step_counts[i] = s.state.steps(i);
  std::vector<std::unique_ptr<Orthogonalizer>> fresh;  // groups whose Newton–Schulz options changed
  double claim_seconds = 0;
  ThreadRestore restore;  // the backend's threads as the step found them, when it returns or throws
  CallerOrder caller_order{s.backend.get()};

  // pass 1: everything this rank checks and prepares alone
  try {
    const auto logits = detail::check_step_inputs(in, inv, s.table, s.routes.layouts, {s.backend->device(), s.options.device},
                                                  claim.has_grad);
    fresh = s.compute.refreshed(in.options);
    const auto tc = std::chrono::steady_clock::now();
    claim.fields = detail::step_fields(in.options, s.options.non_finite, logits);
    claim_seconds = seconds_since(tc);
    if (!s.plan.entries().empty()) {  // Muon parameters: BLAS threads, compute streams
      const int threads = s.options.blas_threads > 0 ? s.options.blas_threads : (s.comm->size() > 1 ? 1 : 0);
      restore.threads = s.backend->set_threads(threads);  // also loads the BLAS: a missing one fails here
      restore.backend = s.backend.get();
      const int streams = s.options.compute_streams > 0 ? s.options.compute_streams : s.backend->threads();
      s.compute.set_step_streams(streams);
      if (s.compute.step_streams() > 1) s.backend->set_threads(1);  // each stream's products on one thread
    }
    // The caller's stream: what it queued before step() (the gradients) comes first, on the device;
    // what it queues after step() returns or throws comes after the step's work (caller_order).
    if (s.caller_stream != nullptr) {
      s.backend->wait(s.backend->fence(s.caller_stream).event());
      caller_order.stream = s.caller_stream;
    }
    std::vector<TensorView> scanned(n);  // one scan of every gradient, one read back (device backends)
    for (size_t i = 0; i < n; ++i)
      if (claim.has_grad[i]) scanned[i] = grads[i];
    claim.bad_param = s.backend->first_non_finite_of(scanned);
  } catch (const std::invalid_argument& e) {  // its inputs
    claim.error = e.what();
  } catch (const std::exception& e) {  // a device or runtime failure (meshmuon::Error, bad_alloc, ...)
    claim.error = e.what();
    claim.error_is_runtime = true;
  }

  // pass 2: one all-reduce decides for every rank: inputs rejected somewhere, ranks that disagree
  // (gradients present, step counts, hyperparameters, policies), non-finite gradients
  s.stats = StepStats{};
  const auto ta0 = std::chrono::steady_clock::now();
  const bool apply = detail::agree_on_step(*s.comm, s.timeout(*s.comm), claim, s.options.non_finite, s.table.names);
  s.stats.agree_seconds = claim_seconds + seconds_since(ta0);
  if (!apply) {
    s.stats.step_seconds = seconds_since(t0);
    return false;
  }
  in.active = std::move(claim.has_grad);
  std::vector<uint8_t> untouched(n);  // no gradient, and no NorMuon state that travels anyway
  for (size_t i = 0; i < n; ++i) untouched[i] = !in.active[i] && !s.table.param_normuon[i];
  s.state.set_untouched(std::move(untouched));
  s.compute.adopt(std::move(fresh));

  // pass 3: Muon through the pipeline, AdamW locally
  const CommCounters before = step_counters(s);
  for (size_t i = 0; i < n; ++i)
    if (in.active[i]) s.state.add_step(i);
  s.state.begin_step();
  StateFlush flush{&s.state};  // offload: the home copies current when the step returns or throws
  detail::LocalUpdate update(*s.backend, s.state, inv, s.table, s.routes.layouts, in, s.options.comm_dtype);
  detail::run_pipeline({.plan = s.plan, .routes = s.routes, .table = s.table, .in = in, .comm = *s.comm,
                        .group_comms = s.group_comms, .backend = *s.backend, .state = s.state, .compute = s.compute,
                        .update = update, .arenas = s.arenas, .stats = s.stats, .window = s.options.window,
                        .compute_thread = s.options.compute_thread, .comm_dtype = s.options.comm_dtype,
                        .timeout = s.timeout(*s.comm)});
  const auto ta = std::chrono::steady_clock::now();
  update.adamw(s.options.chunk_bytes);

  // pass 4: the step's work done (or ordered before the caller's), its figures
  if (s.caller_stream != nullptr) {
    caller_order.order();  // the caller's later work follows the step's, on the device
  } else {
    try {
      s.backend->synchronize();  // the step's work is in memory when it returns (the one wait at its end)
    } catch (...) {  // a device fault of the step's work (a compute stream's included): its streams go
      s.compute.drop();
      throw;
    }
  }
  // The compute stream's time not counted yet (a device backend's: device time, counted once the
  // device has done it, so a step's last chunk may count in the next step's figure).
  s.stats.orthogonalize_seconds += s.compute.take_busy_seconds();
  flush.state = nullptr;
  s.state.flush();
  s.stats.update_seconds += seconds_since(ta);
  const detail::OffloadCounters oc = s.state.offload_counters();
  s.stats.offload_bytes_in = oc.bytes_in, s.stats.offload_bytes_out = oc.bytes_out;
  s.stats.peak_state_resident_bytes = oc.peak_resident_bytes;
  const CommCounters after = step_counters(s);
  s.stats.applied = true;
  s.stats.bytes_sent = after.bytes_sent - before.bytes_sent;
  s.stats.bytes_recv = after.bytes_recv - before.bytes_recv;
  s.stats.collectives = static_cast<int64_t>(after.collectives - before.collectives);
  s.stats.bytes_sent_predicted = s.predicted_sent;
  s.stats.bytes_recv_predicted = s.predicted_recv;
  s.stats.step_seconds = seconds_since(t0);
  return true;
}

GroupOptions& Optimizer::options(size_t g) {
  MESHMUON_CHECK(g < impl_->groups.size(), "[optim] group ", g, " does not exist (", impl_->groups.size(), " groups)");
  return impl_->groups[g].options;
}
const std::vector<ParamGroup>& Optimizer::groups() const { return impl_->groups; }
const Plan& Optimizer::plan() const { return impl_->plan; }
const Inventory& Optimizer::inventory() const { return impl_->plan.inventory(); }
const std::shared_ptr<MeshCommunicators>& Optimizer::mesh_communicators() const { return impl_->mesh_comms; }
int Optimizer::rank() const { return impl_->rank; }
const StepStats& Optimizer::last_stats() const { return impl_->stats; }

NonFinitePolicy Optimizer::non_finite() const { return impl_->options.non_finite; }
void Optimizer::set_non_finite(NonFinitePolicy policy) {
  MESHMUON_CHECK(policy == NonFinitePolicy::Raise || policy == NonFinitePolicy::Skip, "[optim] invalid non-finite policy");
  impl_->options.non_finite = policy;
}
void Optimizer::set_stream(void* stream) {
  MESHMUON_CHECK(stream == nullptr || impl_->backend->capabilities().device_memory, "[optim] set_stream: the optimizer runs on ",
              impl_->backend->name(), ", which has no device streams; leave the stream unset (nullptr)");
  impl_->caller_stream = stream;
}
void* Optimizer::stream() const { return impl_->caller_stream; }
int Optimizer::compute_streams() const { return impl_->options.compute_streams; }
void Optimizer::set_compute_streams(int streams) {
  MESHMUON_CHECK(streams >= 0, "[optim] option 'compute_streams' must be ≥ 0 (0: the backend's thread count), got ", streams);
  impl_->options.compute_streams = streams;
}

Box Optimizer::local_box(size_t param) const {
  MESHMUON_CHECK(param < impl_->routes.layouts.size(), "[optim] parameter index ", param, " out of range");
  return impl_->routes.layouts[param].box;
}
Shape Optimizer::local_shape(size_t param) const { return local_box(param).shape(); }

std::vector<std::string> Optimizer::state_keys(size_t param) const { return impl_->state.keys(param); }
TensorView Optimizer::state(size_t param, std::string_view key) { return impl_->state.view(param, key); }
int64_t Optimizer::step_count(size_t param) const { return impl_->state.steps(param); }
void Optimizer::set_step_count(size_t param, int64_t count) { impl_->state.set_steps(param, count); }

std::shared_ptr<detail::Backend> detail::engine_backend(const Optimizer& optimizer) { return optimizer.impl_->backend; }

}  // namespace meshmuon
