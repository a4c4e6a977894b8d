// LocalOptimizer: the whole single-process step (validation, momentum, orthogonalization, NorMuon,
// weight decay and update, QK-clip, AdamW) over unsharded parameters.
#include "dmuon/local_optimizer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <numeric>

#include "dmuon/bf16.h"
#include "dmuon/blas.h"
#include "dmuon/orthogonalize.h"
#include "dmuon/update.h"
#include "backend/backend.h"
#include "state/state_store.h"

namespace dmuon {
namespace {





}  // namespace

// What one thread of a step needs of its own: an Orthogonalizer per Muon group (its workspace) and
// the update / NorMuon scratch, sized for the largest parameter.
struct Worker {
  std::unique_ptr<detail::Stream> stream;  // a backend stream (cpu: a persistent thread)
  std::vector<std::unique_ptr<Orthogonalizer>> orth;
  std::vector<float> update, v_mean;
};

struct LocalOptimizer::Impl {
  std::shared_ptr<detail::Backend> backend = detail::make_cpu_backend();
  std::vector<Algorithm> algorithm;  // per group, fixed at construction
  std::vector<bool> normuon;         // per group, fixed at construction (its state exists or not)
  detail::StateStore state;
  std::vector<std::unique_ptr<Orthogonalizer>> orth;  // per Muon group, for orth[g]->options()
  std::vector<float> update, v_mean;                  // scratch, grown to the largest parameter
  std::vector<Worker> workers;                        // streams 2..n of a parallel step
  std::vector<size_t> order;                          // parameters, most work first
};

LocalOptimizer::LocalOptimizer(std::vector<ParamInfo> params, std::vector<ParamGroup> groups,
                               NonFinitePolicy policy)
    : LocalOptimizer(std::move(params), std::move(groups), LocalOptimizerOptions{policy, DType::F32}) {}

LocalOptimizer::LocalOptimizer(std::vector<ParamInfo> params, std::vector<ParamGroup> groups,
                               LocalOptimizerOptions options)
    : params_(std::move(params)), groups_(std::move(groups)), policy_(options.policy),
      comm_dtype_(options.comm_dtype), impl_(std::make_unique<Impl>()) {
  const NonFinitePolicy policy = options.policy;
  DMUON_CHECK(comm_dtype_ == DType::F32 || comm_dtype_ == DType::BF16,
              "[optim] comm_dtype must be fp32 or bf16");
  const size_t n = params_.size();
  DMUON_CHECK(policy == NonFinitePolicy::Raise || policy == NonFinitePolicy::Skip,
              "[optim] invalid non-finite policy");
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < i; ++j)
      DMUON_CHECK(params_[i].name != params_[j].name, "[optim] parameter name '", params_[i].name,
                  "' is used by parameters ", j, " and ", i, "; names must be unique");
  std::vector<int64_t> group_of(n, -1);
  for (size_t g = 0; g < groups_.size(); ++g) {
    validate_group_options(groups_[g].options, g);
    for (size_t i : groups_[g].params) {
      DMUON_CHECK(i < n, "[optim] group ", g, " lists parameter index ", i, " but there are ", n,
                  " parameters");
      DMUON_CHECK(group_of[i] < 0, "[optim] parameter '", params_[i].name, "' is in groups ",
                  group_of[i], " and ", g, "; put each parameter in exactly one group");
      group_of[i] = static_cast<int64_t>(g);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ParamInfo& p = params_[i];
    DMUON_CHECK(group_of[i] >= 0, "[optim] parameter '", p.name,
                "' is in no group; add it to a Muon or AdamW group");
    const Algorithm algo = groups_[static_cast<size_t>(group_of[i])].options.algorithm;
    if (algo == Algorithm::Muon) {
      DMUON_CHECK(p.shape.ndim() != 3 || p.expert_stack, "[optim] parameter '", p.name, "' has shape ",
                  p.shape.to_string(), " (3 dims) in Muon group ", group_of[i],
                  "; mark it expert_stack ([E, A, B]) or route it to an AdamW group");
      DMUON_CHECK((p.shape.ndim() == 2 && !p.expert_stack) || (p.shape.ndim() == 3 && p.expert_stack),
                  "[optim] parameter '", p.name, "' has shape ", p.shape.to_string(), " (",
                  p.shape.ndim(), " dims", p.expert_stack ? ", expert_stack" : "", ") in Muon group ",
                  group_of[i], "; Muon takes 2-D matrices and 3-D expert stacks: route it to an AdamW group");
    }
    if (p.qk) {
      DMUON_CHECK(p.shape.ndim() == 2 && !p.expert_stack, "[optim] parameter '", p.name,
                  "' has a QK-clip tag but shape ", p.shape.to_string(), "; QK tags need a 2-D weight");
      validate_qk_tag(*p.qk, p.name, p.shape[0]);
    }
  }

  // Eager state: everything a checkpoint holds exists from the start.
  Impl& s = *impl_;
  s.orth.resize(groups_.size());
  size_t largest = 0, largest_v = 0;
  std::vector<detail::StateSpec> specs(n);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const GroupOptions& o = groups_[g].options;
    s.algorithm.push_back(o.algorithm);
    s.normuon.push_back(o.algorithm == Algorithm::Muon && o.normuon);
    if (o.algorithm == Algorithm::Muon) s.orth[g] = s.backend->make_orthogonalizer(o.ns);
    for (size_t i : groups_[g].params) {
      const ParamInfo& p = params_[i];
      specs[i] = {p.name, o.algorithm, o.algorithm == Algorithm::Muon && o.normuon, p.shape, Shape{}};
      if (o.algorithm == Algorithm::AdamW) continue;
      largest = std::max(largest, static_cast<size_t>(p.shape.numel()));
      if (o.normuon) {
        specs[i].v_shape = normuon_state_shape(p.shape, p.expert_stack);
        largest_v = std::max(largest_v, static_cast<size_t>(specs[i].v_shape.numel()));
      }
    }
  }
  s.state.init(std::move(specs), *s.backend);
  s.state.set_hooks(options.state_hooks);
  s.update.resize(largest);
  s.v_mean.resize(largest_v);
  DMUON_CHECK(options.threads >= 0, "[optim] threads must be >= 0 (0: the BLAS thread count), got ",
              options.threads);
  threads_ = options.threads;
  // Work per parameter ~ numel × its Gram side (Muon) or numel (AdamW); the order only balances the
  // threads, results do not depend on it.
  std::vector<double> work(n);
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i : groups_[g].params) {
      const Shape& sh = params_[i].shape;
      const double numel = static_cast<double>(sh.numel());
      work[i] = numel;
      if (groups_[g].options.algorithm == Algorithm::Muon && sh.ndim() >= 2)
        work[i] *= static_cast<double>(std::min(sh[sh.ndim() - 2], sh[sh.ndim() - 1]));
    }
  s.order.resize(n);
  std::iota(s.order.begin(), s.order.end(), size_t{0});
  std::stable_sort(s.order.begin(), s.order.end(), [&](size_t a, size_t b) { return work[a] > work[b]; });
}

LocalOptimizer::~LocalOptimizer() = default;
LocalOptimizer::LocalOptimizer(LocalOptimizer&&) noexcept = default;
LocalOptimizer& LocalOptimizer::operator=(LocalOptimizer&&) noexcept = default;

void LocalOptimizer::set_threads(int threads) {
  DMUON_CHECK(threads >= 0, "[optim] threads must be >= 0 (0: the BLAS thread count), got ", threads);
  threads_ = threads;
}

GroupOptions& LocalOptimizer::options(size_t g) {
  DMUON_CHECK(g < groups_.size(), "[optim] group ", g, " does not exist (", groups_.size(), " groups)");
  return groups_[g].options;
}

bool LocalOptimizer::step(std::span<const TensorView> params, std::span<const TensorView> grads,
                          const std::map<int, std::vector<float>>& qk_logits) {
  Impl& s = *impl_;
  const size_t n = params_.size();
  // pass 1: validate everything (options, views, QK logits) before touching any memory.
  DMUON_CHECK(params.size() == n && grads.size() == n, "[optim] step got ", params.size(),
              " parameters and ", grads.size(), " gradients; expected ", n, " of each");
  std::vector<std::unique_ptr<Orthogonalizer>> fresh(groups_.size());
  bool any_muon = false;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const GroupOptions& o = groups_[g].options;
    validate_group_options(o, g);
    DMUON_CHECK(o.algorithm == s.algorithm[g], "[optim] group ", g, ": algorithm changed from ",
                to_string(s.algorithm[g]), " to ", to_string(o.algorithm),
                " after construction; build a new optimizer");
    if (o.algorithm != Algorithm::Muon) continue;
    DMUON_CHECK(!o.normuon || s.normuon[g], "[optim] group ", g,
                ": normuon was off at construction, so its state does not exist; enable it before "
                "constructing the optimizer");
    if (o.ns != s.orth[g]->options()) fresh[g] = s.backend->make_orthogonalizer(o.ns);
    any_muon = any_muon || !groups_[g].params.empty();
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    const GroupOptions& o = groups_[g].options;
    for (size_t i : groups_[g].params) {
      const ParamInfo& info = params_[i];
      const TensorView& p = params[i];
      const TensorView& gr = grads[i];
      DMUON_CHECK(p.shape == info.shape, "[optim] parameter '", info.name, "': expected shape ",
                  info.shape.to_string(), ", got ", p.shape.to_string());
      DMUON_CHECK(p.dtype == DType::F32, "[optim] parameter '", info.name, "' is ", to_string(p.dtype),
                  "; master parameters must be fp32");
      DMUON_CHECK(p.is_contiguous(), "[optim] parameter '", info.name, "' is not contiguous; pass a contiguous copy");
      DMUON_CHECK(info.shape.numel() == 0 || p.data, "[optim] parameter '", info.name, "': null data pointer");
      if (gr.is_none()) continue;  // no gradient this step: the parameter is left untouched
      DMUON_CHECK(gr.shape == info.shape, "[optim] gradient of '", info.name, "': expected shape ",
                  info.shape.to_string(), ", got ", gr.shape.to_string());
      DMUON_CHECK(gr.dtype == DType::F32 || gr.dtype == DType::BF16, "[optim] gradient of '",
                  info.name, "' is ", to_string(gr.dtype), "; gradients must be fp32 or bf16");
      DMUON_CHECK(gr.is_contiguous(), "[optim] gradient of '", info.name, "' is not contiguous; pass a contiguous copy");
      DMUON_CHECK(info.shape.numel() == 0 || gr.data, "[optim] gradient of '", info.name, "': null data pointer");
      if (o.algorithm != Algorithm::Muon || o.qk_clip_threshold <= 0 || !info.qk) continue;
      const auto it = qk_logits.find(info.qk->layer);
      DMUON_CHECK(it != qk_logits.end(), "[optim] parameter '", info.name, "' is QK-tagged (layer ",
                  info.qk->layer, ") and group ", g,
                  " has qk_clip_threshold > 0, but no logits were given for layer ", info.qk->layer);
      validate_qk_logits(*info.qk, it->second, info.name);
    }
  }
  if (any_muon) (void)s.backend->threads();  // loads the BLAS: a missing one fails here, before anything is modified

  // pass 2: non-finite gradients (raise or skip; nothing modified either way).
  for (size_t i = 0; i < n; ++i) {
    if (grads[i].is_none()) continue;
    const int64_t bad = s.backend->first_non_finite(grads[i]);
    if (bad < 0) continue;
    if (policy_ == NonFinitePolicy::Skip) return false;
    detail::throw_error(detail::concat("[optim] gradient of parameter '", params_[i].name,
                                       "' is not finite (element ", bad,
                                       "); nothing was modified (policy raise; use skip to skip steps)"));
  }

  // pass 3: apply. Each parameter's arithmetic is independent of the others and of the thread that
  // runs it, so the order below (largest first, shared by the threads) does not change any bit.
  std::vector<size_t> group_of(n);
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (fresh[g]) s.orth[g] = std::move(fresh[g]);
    for (size_t i : groups_[g].params) group_of[i] = g;
  }
  auto apply = [&](size_t i, std::vector<std::unique_ptr<Orthogonalizer>>& orth,
                   std::vector<float>& update, std::vector<float>& v_mean) {
    if (grads[i].is_none()) return;  // no gradient: values, state and step count stay
    const size_t g = group_of[i];
    const GroupOptions& o = groups_[g].options;
    const ParamInfo& info = params_[i];
    float* p = params[i].f32();
    const int64_t numel = info.shape.numel();
    s.state.add_step(i);
    const size_t one[1] = {i};
    s.state.acquire(one);
    struct Release {
      const detail::StateStore& st;
      std::span<const size_t> ps;
      ~Release() { st.release(ps); }
    } release{s.state, one};
    if (o.algorithm == Algorithm::AdamW) {
      s.backend->adamw({o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, s.state.steps(i)}, p, grads[i],
                 s.state.data(i, detail::StateKey::ExpAvg), s.state.data(i, detail::StateKey::ExpAvgSq));
      return;
    }
    if (numel == 0) return;
    float* u = update.data();
    s.backend->momentum({o.momentum_kind, o.momentum, o.nesterov}, s.state.data(i, detail::StateKey::Momentum), grads[i], u);
    // the same per-matrix code as the distributed executor (the backend's muon_units)
    s.backend->round_to_comm(u, numel, comm_dtype_);
    const MatrixDims d = matrix_dims(info.shape, info.expert_stack);
    s.backend->muon_units(*orth[g], u, d.batch, d.rows, d.cols,
                          o.normuon ? s.state.data(i, detail::StateKey::NormuonV) : nullptr, v_mean.data(),
                          o.normuon_beta2, comm_dtype_);
    s.backend->apply_update({o.lr, adjusted_lr(o.lr, o.lr_rule, d.rows, d.cols), o.weight_decay, o.cautious_wd},
                 p, u, numel);
    if (o.qk_clip_threshold > 0 && info.qk) {
      s.backend->qk_clip_rows(*info.qk, qk_logits.at(info.qk->layer), o.qk_clip_threshold, p, 0, d.rows, d.cols);
    }
  };

  int threads = threads_ > 0 ? threads_ : (any_muon ? s.backend->threads() : 1);
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(n, 1)));
  if (threads <= 1) {
    for (size_t i : s.order) apply(i, s.orth, s.update, s.v_mean);
    return true;
  }
  // Threads 2..n get their own Orthogonalizers (same options as the group's) and scratch.
  if (s.workers.size() < static_cast<size_t>(threads - 1)) s.workers.resize(static_cast<size_t>(threads - 1));
  for (int w = 0; w < threads - 1; ++w) {
    Worker& wk = s.workers[static_cast<size_t>(w)];
    if (!wk.stream) wk.stream = s.backend->make_stream(true);
    wk.orth.resize(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g)
      if (s.orth[g] && (!wk.orth[g] || wk.orth[g]->options() != s.orth[g]->options()))
        wk.orth[g] = s.backend->make_orthogonalizer(s.orth[g]->options());
    wk.update.resize(s.update.size());
    wk.v_mean.resize(s.v_mean.size());
  }
  const int blas_threads = any_muon ? s.backend->set_threads(1) : 1;
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto run = [&](std::vector<std::unique_ptr<Orthogonalizer>>& orth, std::vector<float>& update,
                 std::vector<float>& v_mean) {
    try {
      for (size_t k; (k = next.fetch_add(1)) < n;) apply(s.order[k], orth, update, v_mean);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = n;  // the others stop taking parameters
    }
  };
  for (int w = 0; w < threads - 1; ++w) {  // streams 2..n, then this thread as the first
    Worker& wk = s.workers[static_cast<size_t>(w)];
    wk.stream->submit([&run, &wk] { run(wk.orth, wk.update, wk.v_mean); });
  }
  run(s.orth, s.update, s.v_mean);
  for (int w = 0; w < threads - 1; ++w) s.workers[static_cast<size_t>(w)].stream->synchronize();  // run() catches
  if (any_muon) s.backend->set_threads(blas_threads);
  if (failure) std::rethrow_exception(failure);
  return true;
}

TensorView LocalOptimizer::state(size_t param, std::string_view key) { return impl_->state.view(param, key); }
std::vector<std::string> LocalOptimizer::state_keys(size_t param) const { return impl_->state.keys(param); }
int64_t LocalOptimizer::step_count(size_t param) const { return impl_->state.steps(param); }
void LocalOptimizer::set_step_count(size_t param, int64_t count) { impl_->state.set_steps(param, count); }

}  // namespace dmuon
