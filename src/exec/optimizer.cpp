// dmuon::Optimizer: construction (validation, plan, agreement, sub-communicators, eager state), the
// step's validation and non-finite agreement, the local update passes and AdamW, and state access.
#include "dmuon/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "dmuon/blas.h"
#include "dmuon/error.h"
#include "dmuon/update.h"
#include "core/hash.h"
#include "exec/agreement.h"
#include "backend/select.h"
#include "comm/device_check.h"
#include "exec/executor.h"
#include "exec/param_groups.h"

namespace dmuon {
namespace {

using detail::ParamLayout;

std::string placements_text(const ParamSpec& p) {
  std::string t;
  for (const Placement& pl : p.placements) t += (t.empty() ? "" : ",") + to_string(pl);
  return "(" + t + ")";
}

// pass: everything a rank can check alone, before any collective
void validate_construction(const Optimizer::Impl& s, const Inventory& inv, const std::vector<ParamGroup>& groups,
                           std::vector<int>& group_of) {
  inv.validate();
  DMUON_CHECK(inv.world_size() == s.user_comm->size(), "[optim] the inventory's meshes span ", inv.world_size(),
              " ranks but the communicator has ", s.user_comm->size(), "; build the mesh for this world");
  const OptimizerOptions& o = s.options;
  DMUON_CHECK(o.comm_dtype == DType::F32 || o.comm_dtype == DType::BF16, "[optim] comm_dtype must be fp32 or bf16");
  DMUON_CHECK(o.window >= 1, "[optim] option 'window' must be ≥ 1 (got ", o.window, ")");
  DMUON_CHECK(o.blas_threads >= 0, "[optim] option 'blas_threads' must be ≥ 0");
  DMUON_CHECK(o.compute_streams >= 0, "[optim] option 'compute_streams' must be ≥ 0 (0: the backend's thread count), got ",
              o.compute_streams);
  DMUON_CHECK(o.non_finite == NonFinitePolicy::Raise || o.non_finite == NonFinitePolicy::Skip,
              "[optim] invalid non-finite policy");
  DMUON_CHECK(o.timeout.count() >= 0, "[optim] option 'timeout' must be ≥ 0");
  const size_t n = inv.params.size();
  group_of = detail::validate_param_groups(groups, n, [&](size_t i) -> std::string_view { return inv.params[i].name; });
  for (size_t i = 0; i < n; ++i) {
    const ParamSpec& p = inv.params[i];
    const Algorithm a = groups[static_cast<size_t>(group_of[i])].options.algorithm;
    const bool ok = (a == Algorithm::Muon) == (p.role == Role::Muon);
    DMUON_CHECK(ok, "[optim] parameter '", p.name, "' has role ", to_string(p.role), " in the inventory but is in ",
                to_string(a), " group ", group_of[i], "; move it to a group of its role (the plan follows the role)");
    DMUON_CHECK(p.dtype == DType::F32, "[optim] parameter '", p.name, "' is ", to_string(p.dtype),
                "; master parameters must be fp32");
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

// The AdamW pass: the active AdamW parameters with a local shard, in order, in batches of up to
// chunk_bytes of state (at least one parameter each); with offload, batch b + 1 is prefetched
// while batch b updates, so at most two batches are resident.
void run_adamw(Optimizer::Impl& s, const detail::StepInputs& in) {
  std::vector<std::vector<size_t>> batches;
  int64_t bytes = 0;
  for (size_t i = 0; i < in.active.size(); ++i) {
    if (s.algorithm[static_cast<size_t>(s.group_of[i])] != Algorithm::AdamW || !in.active[i]) continue;
    const int64_t numel = s.routes.layouts[i].local_numel;
    if (numel == 0) continue;
    const int64_t b = 2 * numel * static_cast<int64_t>(sizeof(float));  // exp_avg, exp_avg_sq
    if (batches.empty() || bytes + b > s.options.chunk_bytes) batches.emplace_back(), bytes = 0;
    batches.back().push_back(i), bytes += b;
  }
  for (size_t k = 0; k < batches.size(); ++k) {
    s.state.acquire(batches[k]);
    if (k + 1 < batches.size()) s.state.prefetch(batches[k + 1]);
    std::vector<detail::Backend::AdamWTensor> tensors;  // one multi-tensor call per batch
    tensors.reserve(batches[k].size());
    for (size_t i : batches[k]) {
      const GroupOptions& o = in.options[static_cast<size_t>(s.group_of[i])];
      tensors.push_back({{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, s.state.steps(i)}, in.params[i].f32(), in.grads[i],
                         s.state.data(i, detail::StateKey::ExpAvg), s.state.data(i, detail::StateKey::ExpAvgSq)});
    }
    s.backend->adamw_multi(tensors);
    s.state.release(batches[k]);
  }
}

// Restores the backend's thread count when a step returns or throws.
struct ThreadRestore {
  detail::Backend* backend = nullptr;
  int threads = 0;
  ~ThreadRestore() {
    if (backend) backend->set_threads(threads);
  }
};

}  // namespace

namespace detail {

std::chrono::milliseconds work_timeout(const Optimizer::Impl& s, const Communicator& c) {
  return s.options.timeout.count() > 0 ? s.options.timeout : c.default_timeout();
}

void wait_work(const Optimizer::Impl& s, Work& w) { w.wait(work_timeout(s, s.comm ? *s.comm : *s.user_comm)); }

void local_momentum(Optimizer::Impl& s, const StepInputs& in, std::span<const UpdateTarget> targets) {
  std::vector<Backend::MomentumTensor> tensors;
  tensors.reserve(targets.size());
  for (const UpdateTarget& t : targets) {
    const ParamLayout& L = s.routes.layouts[static_cast<size_t>(t.param)];
    if (L.local_numel == 0) continue;
    if (!in.active[static_cast<size_t>(t.param)]) {  // no gradient: the momentum stays, zeros travel
      s.backend->zero(t.update, static_cast<size_t>(L.local_numel) * sizeof(float));  // stream-ordered, no host wait
      continue;
    }
    const GroupOptions& o = in.options[static_cast<size_t>(s.group_of[static_cast<size_t>(t.param)])];
    tensors.push_back({{o.momentum_kind, o.momentum, o.nesterov},
                       s.state.data(static_cast<size_t>(t.param), detail::StateKey::Momentum),
                       in.grads[static_cast<size_t>(t.param)], t.update});
  }
  s.backend->momentum_multi(tensors, s.options.comm_dtype);
}

void local_apply(Optimizer::Impl& s, const StepInputs& in, std::span<const UpdateTarget> targets) {
  std::vector<Backend::ApplyTensor> tensors;
  tensors.reserve(targets.size());
  for (const UpdateTarget& t : targets) {
    const ParamLayout& L = s.routes.layouts[static_cast<size_t>(t.param)];
    if (L.local_numel == 0) continue;
    const GroupOptions& o = in.options[static_cast<size_t>(s.group_of[static_cast<size_t>(t.param)])];
    tensors.push_back({{o.lr, adjusted_lr(o.lr, o.lr_rule, L.rows, L.cols), o.weight_decay, o.cautious_wd},
                       in.params[static_cast<size_t>(t.param)].f32(), t.update, L.local_numel});
  }
  s.backend->apply_multi(tensors);
  for (const UpdateTarget& t : targets) {  // QK-clip after the update, on the tagged parameters
    const ParamLayout& L = s.routes.layouts[static_cast<size_t>(t.param)];
    const ParamSpec& p = s.plan.inventory().params[static_cast<size_t>(t.param)];
    const GroupOptions& o = in.options[static_cast<size_t>(s.group_of[static_cast<size_t>(t.param)])];
    if (L.local_numel == 0 || o.qk_clip_threshold <= 0 || !p.qk) continue;
    // QK-clip scales whole rows: each contiguous range of local rows on its own (StridedShard has several)
    float* w = in.params[static_cast<size_t>(t.param)].f32();
    const int64_t lc = L.box.dims[1].size();
    int64_t pos = 0;
    for (const Range& r : L.box.dims[0].ranges()) {
      s.backend->qk_clip_rows(*p.qk, in.qk_logits->at(p.qk->layer), o.qk_clip_threshold, w + pos * lc, r.begin, r.end, lc);
      pos += r.size();
    }
  }
}

}  // namespace detail

namespace {
std::shared_ptr<MeshCommunicators> mesh_communicators_of(std::shared_ptr<Communicator> comm) {
  DMUON_CHECK(comm != nullptr, "[optim] the communicator is null; pass make_mpi_communicator() or make_single_communicator()");
  return std::make_shared<MeshCommunicators>(std::move(comm));
}
}  // namespace

Optimizer::Optimizer(std::shared_ptr<Communicator> comm, Inventory inventory, std::vector<ParamGroup> groups,
                     OptimizerOptions options)
    : Optimizer(mesh_communicators_of(std::move(comm)), std::move(inventory), std::move(groups), std::move(options)) {}

Optimizer::Optimizer(std::shared_ptr<MeshCommunicators> comms, Inventory inventory, std::vector<ParamGroup> groups,
                     OptimizerOptions options)
    : impl_(std::make_unique<Impl>()) {
  DMUON_CHECK(comms != nullptr, "[optim] the mesh communicators are null; pass std::make_shared<MeshCommunicators>(world)");
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
    validate_construction(s, inventory, s.groups, s.group_of);
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
    po.normuon.assign(inventory.params.size(), false);  // NorMuon state bytes are part of the prediction
    for (size_t i = 0; i < inventory.params.size(); ++i) {
      const GroupOptions& go = s.groups[static_cast<size_t>(s.group_of[i])].options;
      po.normuon[i] = go.algorithm == Algorithm::Muon && go.normuon;
    }
    s.plan = make_plan(inventory, po);
    for (const ParamGroup& g : s.groups) {
      s.algorithm.push_back(g.options.algorithm);
      s.normuon.push_back(g.options.algorithm == Algorithm::Muon && g.options.normuon);
    }
    const auto& params = s.plan.inventory().params;
    s.param_normuon.assign(params.size(), false);
    for (size_t i = 0; i < params.size(); ++i) {
      const size_t g = static_cast<size_t>(s.group_of[i]);
      s.param_normuon[i] = s.normuon[g];
      s.names.push_back(params[i].name);
      const PlanEntry* e = s.plan.entry_of(static_cast<int>(i));
      DMUON_CHECK(!(e && e->strategy == Strategy::GramAllReduce && s.normuon[g]), "[optim] parameter '", params[i].name,
                  "' uses gram_allreduce, which does not support NorMuon; pin another strategy or turn NorMuon off");
      detail::Fnv1a h;  // what the caller gave: the parameter and its group (not the plan's decision)
      h.str(params[i].name);
      h.pod(params[i].shape.ndim());
      for (int64_t d : params[i].shape) h.pod(d);
      h.pod(params[i].role), h.pod(params[i].expert), h.pod(params[i].mesh), h.pod(g), h.pod(s.algorithm[g]);
      h.pod(static_cast<bool>(s.normuon[g]));
      for (const Placement& pl : params[i].placements) h.pod(pl.kind), h.pod(pl.dim), h.pod(pl.split_factor);
      claim.spec_hashes.push_back(h.h);
      claim.spec_texts.push_back(detail::concat("'", params[i].name, "' ", params[i].shape.to_string(), " ",
                                                placements_text(params[i]), " on mesh ", params[i].mesh, " ",
                                                to_string(params[i].role), " group ", g, s.normuon[g] ? " normuon" : ""));
      claim.entry_hashes.push_back(e ? e->hash : 0);
      std::string owners;
      if (e)
        for (size_t k = 0; k < e->owner_index.size() && k < 4; ++k) owners += (k ? "," : " owners ") + std::to_string(e->owner_index[k]);
      claim.entry_texts.push_back(detail::concat("'", params[i].name, "' ", e ? std::string(to_string(e->strategy)) : "unplanned",
                                                 e ? " chunk " + std::to_string(e->chunk) : "", owners));
    }
    char hex[24];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(s.plan.fingerprint()));
    std::string meshes;
    for (const Mesh& m : s.plan.inventory().meshes) meshes += (meshes.empty() ? "" : " / ") + m.to_string();
    claim.options_text = detail::concat("plan ", hex, ", meshes ", meshes, ", comm ", to_string(s.options.comm_dtype), ", chunk ",
                                        s.options.chunk_bytes, " B, window ", s.options.window, ", backend ",
                                        s.backend->name(), ", non_finite ",
                                        to_string(s.options.non_finite));
    detail::Fnv1a f;
    f.pod(s.plan.fingerprint());
    f.str(claim.options_text);
    for (uint64_t x : claim.spec_hashes) f.pod(x);
    for (uint64_t x : claim.entry_hashes) f.pod(x);
    claim.fingerprint = f.h;
  } catch (const std::exception& e) {
    claim.error = e.what();
  }
  // pass 2: agree (collective; the same error everywhere on disagreement)
  detail::agree_on_plan(*s.user_comm, detail::work_timeout(s, *s.user_comm), claim);

  // pass 3: communicators (collective, in plan order), routes, eager state
  s.comm = s.user_comm->split(0, s.rank, "dmuon.optimizer");
  s.routes = detail::build_routes(s.plan, s.rank, s.param_normuon);
  const Inventory& inv = s.plan.inventory();
  for (const detail::GroupKey& k : s.routes.group_keys)  // collective on first use of a key, in plan order
    s.group_comms.push_back(&s.mesh_comms->get(inv.meshes[static_cast<size_t>(k.mesh)], k.dims));
  s.orth.resize(s.groups.size());
  for (size_t g = 0; g < s.groups.size(); ++g)
    if (s.algorithm[g] == Algorithm::Muon) s.orth[g] = s.backend->make_orthogonalizer(s.groups[g].options.ns);
  std::vector<detail::StateSpec> specs;  // eager state: everything a checkpoint holds exists from the start
  for (size_t i = 0; i < inv.params.size(); ++i) {
    const ParamLayout& L = s.routes.layouts[i];
    s.local_shapes.push_back(L.box.shape());
    specs.push_back({inv.params[i].name, s.algorithm[static_cast<size_t>(s.group_of[i])], static_cast<bool>(s.param_normuon[i]),
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
  std::vector<std::unique_ptr<Orthogonalizer>> fresh(s.groups.size());
  double claim_seconds = 0;
  ThreadRestore restore;  // the backend's threads as the step found them, when it returns or throws
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
  } caller_order{s.backend.get()};
  try {  // pass 1: validate everything locally
    DMUON_CHECK(params.size() == n && grads.size() == n, "[optim] step got ", params.size(), " parameters and ",
                grads.size(), " gradients; expected ", n, " of each (one local shard per inventory parameter)");
    for (size_t g = 0; g < s.groups.size(); ++g) {
      const GroupOptions& o = in.options[g];
      validate_group_options(o, g);
      DMUON_CHECK(o.algorithm == s.algorithm[g], "[optim] group ", g, ": algorithm changed after construction; build a new optimizer");
      if (o.algorithm != Algorithm::Muon) continue;
      DMUON_CHECK(!o.normuon || s.normuon[g], "[optim] group ", g,
                  ": normuon was off at construction, so its state does not exist; enable it before constructing");
      DMUON_CHECK(o.normuon || !s.normuon[g], "[optim] group ", g, ": normuon may not be turned off after construction");
      if (o.ns != s.orth[g]->options()) fresh[g] = s.backend->make_orthogonalizer(o.ns);
    }
    std::vector<std::pair<int, const std::vector<float>*>> logits;  // the layers QK-clip reads, once each
    for (size_t i = 0; i < n; ++i) {
      const ParamSpec& p = inv.params[i];
      const Shape& local = s.local_shapes[i];
      const TensorView& w = params[i];
      const TensorView& gr = grads[i];
      claim.has_grad[i] = gr.is_none() ? 0 : 1;
      DMUON_CHECK(w.shape == local, "[optim] parameter '", p.name, "': this rank's shard should have shape ",
                  local.to_string(), " (its local box ", s.routes.layouts[i].box.to_string(), "), got ", w.shape.to_string());
      DMUON_CHECK(w.dtype == DType::F32, "[optim] parameter '", p.name, "' is ", to_string(w.dtype), "; master parameters must be fp32");
      DMUON_CHECK(w.is_contiguous(), "[optim] parameter '", p.name, "' is not contiguous; pass a contiguous copy");
      DMUON_CHECK(local.numel() == 0 || w.data, "[optim] parameter '", p.name, "': null data pointer");
      DMUON_CHECK(w.device == s.backend->device(), "[optim] parameter '", p.name, "' is on ", to_string(w.device),
                  " but the optimizer runs on ", to_string(s.backend->device()), " (option 'device' = '", s.options.device,
                  "'); pass views of ", to_string(s.backend->device()), " memory");
      if (gr.is_none()) continue;  // no gradient: the parameter sits this step out (agreed below)
      DMUON_CHECK(gr.shape == local, "[optim] gradient of '", p.name, "': expected local shape ", local.to_string(), ", got ",
                  gr.shape.to_string());
      DMUON_CHECK(gr.dtype == DType::F32 || gr.dtype == DType::BF16, "[optim] gradient of '", p.name, "' is ",
                  to_string(gr.dtype), "; gradients must be fp32 or bf16");
      DMUON_CHECK(gr.is_contiguous(), "[optim] gradient of '", p.name, "' is not contiguous; pass a contiguous copy");
      DMUON_CHECK(local.numel() == 0 || gr.data, "[optim] gradient of '", p.name, "': null data pointer");
      DMUON_CHECK(gr.device == s.backend->device(), "[optim] gradient of '", p.name, "' is on ", to_string(gr.device),
                  " but the optimizer runs on ", to_string(s.backend->device()), " (option 'device' = '", s.options.device,
                  "'); pass views of ", to_string(s.backend->device()), " memory");
      const GroupOptions& o = in.options[static_cast<size_t>(s.group_of[i])];
      if (o.algorithm != Algorithm::Muon || o.qk_clip_threshold <= 0 || !p.qk) continue;
      const auto it = qk_logits.find(p.qk->layer);
      DMUON_CHECK(it != qk_logits.end(), "[optim] parameter '", p.name, "' is QK-tagged (layer ", p.qk->layer, ") and group ",
                  s.group_of[i], " has qk_clip_threshold > 0, but no logits were given for layer ", p.qk->layer);
      validate_qk_logits(*p.qk, it->second, p.name);
      if (std::none_of(logits.begin(), logits.end(), [&](const auto& l) { return l.first == it->first; }))
        logits.emplace_back(it->first, &it->second);
    }
    const auto tc = std::chrono::steady_clock::now();
    claim.fields = detail::step_fields(in.options, s.options.non_finite, logits);
    claim_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - tc).count();
    if (!s.plan.entries().empty()) {  // Muon parameters: BLAS threads, compute streams
      const int threads = s.options.blas_threads > 0 ? s.options.blas_threads : (s.comm->size() > 1 ? 1 : 0);
      restore.threads = s.backend->set_threads(threads);  // also loads the BLAS: a missing one fails here
      restore.backend = s.backend.get();
      const int streams = s.options.compute_streams > 0 ? s.options.compute_streams : s.backend->threads();
      s.step_streams = std::max(1, streams);
      if (s.step_streams > 1) s.backend->set_threads(1);  // each stream's products on one thread
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
  } catch (const std::exception& e) {  // a device or runtime failure (dmuon::Error, bad_alloc, ...)
    claim.error = e.what();
    claim.error_is_runtime = true;
  }
  // pass 2: one all-reduce decides for every rank: inputs rejected somewhere, ranks that disagree
  // (gradients present, step counts, hyperparameters, policies), non-finite gradients
  s.stats = StepStats{};
  const auto ta0 = std::chrono::steady_clock::now();
  const bool apply = detail::agree_on_step(*s.comm, detail::work_timeout(s, *s.comm), claim, s.options.non_finite, s.names);
  s.stats.agree_seconds = claim_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - ta0).count();
  if (!apply) {
    s.stats.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return false;
  }
  in.active = std::move(claim.has_grad);
  std::vector<uint8_t> untouched(n);  // no gradient, and no NorMuon state that travels anyway
  for (size_t i = 0; i < n; ++i) untouched[i] = !in.active[i] && !s.param_normuon[i];
  s.state.set_untouched(std::move(untouched));
  for (size_t g = 0; g < s.groups.size(); ++g)
    if (fresh[g]) s.orth[g] = std::move(fresh[g]);

  // pass 3: Muon through the pipeline, AdamW locally
  const auto counters = [&] {
    CommCounters c = s.comm->counters();
    for (const auto& gc : s.group_comms) c.bytes_sent += gc->counters().bytes_sent, c.bytes_recv += gc->counters().bytes_recv,
                                         c.collectives += gc->counters().collectives;
    return c;
  };
  const CommCounters before = counters();
  for (size_t i = 0; i < n; ++i)
    if (in.active[i]) s.state.add_step(i);
  s.state.begin_step();
  StateFlush flush{&s.state};  // offload: the home copies current when the step returns or throws
  detail::run_pipeline(s, in);
  const auto ta = std::chrono::steady_clock::now();
  run_adamw(s, in);
  if (s.caller_stream != nullptr) {
    caller_order.order();  // the caller's later work follows the step's, on the device
  } else {
    try {
      s.backend->synchronize();  // the step's work is in memory when it returns (the one wait at its end)
    } catch (...) {  // a device fault of the step's work (a compute stream's included): its streams go
      s.compute_stream.reset(), s.extra_streams.clear();
      throw;
    }
  }
  // The compute stream's time not counted yet (a device backend's: device time, counted once the
  // device has done it, so a step's last chunk may count in the next step's figure).
  if (s.compute_stream) {
    const double busy = s.compute_stream->busy_seconds();
    s.stats.orthogonalize_seconds += busy - s.compute_counted;
    s.compute_counted = busy;
  }
  flush.state = nullptr;
  s.state.flush();
  s.stats.update_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - ta).count();
  const detail::OffloadCounters oc = s.state.offload_counters();
  s.stats.offload_bytes_in = oc.bytes_in, s.stats.offload_bytes_out = oc.bytes_out;
  s.stats.peak_state_resident_bytes = oc.peak_resident_bytes;
  const CommCounters after = counters();
  s.stats.applied = true;
  s.stats.bytes_sent = after.bytes_sent - before.bytes_sent;
  s.stats.bytes_recv = after.bytes_recv - before.bytes_recv;
  s.stats.collectives = static_cast<int64_t>(after.collectives - before.collectives);
  s.stats.bytes_sent_predicted = s.predicted_sent;
  s.stats.bytes_recv_predicted = s.predicted_recv;
  s.stats.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

GroupOptions& Optimizer::options(size_t g) {
  DMUON_CHECK(g < impl_->groups.size(), "[optim] group ", g, " does not exist (", impl_->groups.size(), " groups)");
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
  DMUON_CHECK(policy == NonFinitePolicy::Raise || policy == NonFinitePolicy::Skip, "[optim] invalid non-finite policy");
  impl_->options.non_finite = policy;
}
void Optimizer::set_stream(void* stream) {
  DMUON_CHECK(stream == nullptr || impl_->backend->capabilities().device_memory, "[optim] set_stream: the optimizer runs on ",
              impl_->backend->name(), ", which has no device streams; leave the stream unset (nullptr)");
  impl_->caller_stream = stream;
}
void* Optimizer::stream() const { return impl_->caller_stream; }
int Optimizer::compute_streams() const { return impl_->options.compute_streams; }
void Optimizer::set_compute_streams(int streams) {
  DMUON_CHECK(streams >= 0, "[optim] option 'compute_streams' must be ≥ 0 (0: the backend's thread count), got ", streams);
  impl_->options.compute_streams = streams;
}

Box Optimizer::local_box(size_t param) const {
  DMUON_CHECK(param < impl_->routes.layouts.size(), "[optim] parameter index ", param, " out of range");
  return impl_->routes.layouts[param].box;
}
Shape Optimizer::local_shape(size_t param) const { return local_box(param).shape(); }

std::vector<std::string> Optimizer::state_keys(size_t param) const { return impl_->state.keys(param); }
TensorView Optimizer::state(size_t param, std::string_view key) { return impl_->state.view(param, key); }
int64_t Optimizer::step_count(size_t param) const { return impl_->state.steps(param); }
void Optimizer::set_step_count(size_t param, int64_t count) { impl_->state.set_steps(param, count); }

std::shared_ptr<detail::Backend> detail::engine_backend(const Optimizer& optimizer) { return optimizer.impl_->backend; }

}  // namespace dmuon
