// Internal: the compute side of a step (compute.h): orthogonalization and NorMuon of the units a
// chunk assembled, on the stream that calls it, fanned out over the step's compute streams
// (OptimizerOptions::compute_streams).
#include "exec/compute.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>
#include <vector>

#include "backend/select.h"

namespace meshmuon::detail {

void ComputeStreams::init(Backend& backend, std::span<const ParamGroup> groups) {
  backend_ = &backend;
  orth_.clear();
  orth_.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g)
    if (groups[g].options.algorithm == Algorithm::Muon) orth_[g] = backend.make_orthogonalizer(groups[g].options.ns);
}

std::vector<std::unique_ptr<Orthogonalizer>> ComputeStreams::refreshed(std::span<const GroupOptions> options) const {
  std::vector<std::unique_ptr<Orthogonalizer>> fresh(orth_.size());
  for (size_t g = 0; g < orth_.size() && g < options.size(); ++g)
    if (orth_[g] && options[g].ns != orth_[g]->options()) fresh[g] = backend_->make_orthogonalizer(options[g].ns);
  return fresh;
}

void ComputeStreams::adopt(std::vector<std::unique_ptr<Orthogonalizer>> fresh) {
  for (size_t g = 0; g < fresh.size() && g < orth_.size(); ++g)
    if (fresh[g]) orth_[g] = std::move(fresh[g]);
}

Stream& ComputeStreams::pipeline_stream(bool threaded) {
  if (!pipeline_ || threaded_ != threaded) {
    pipeline_.reset();
    pipeline_ = backend_->make_stream(threaded, threaded ? JobEnd::Queued : JobEnd::Complete);
    threaded_ = threaded;
    counted_ = 0;
  }
  return *pipeline_;
}

double ComputeStreams::take_busy_seconds() {
  if (!pipeline_) return 0;
  const double busy = pipeline_->busy_seconds();
  const double fresh = busy - counted_;
  counted_ = busy;
  return fresh;
}

// Streams 2..k exist, each with an Orthogonalizer per Muon group of the group's current options.
void ComputeStreams::prepare_extra(size_t extra) {
  while (extra_.size() < extra) extra_.push_back(backend_->make_stream(true, JobEnd::Queued));
  if (extra_orth_.size() < extra) extra_orth_.resize(extra);
  for (size_t w = 0; w < extra; ++w) {
    auto& orth = extra_orth_[w];
    orth.resize(orth_.size());
    for (size_t g = 0; g < orth_.size(); ++g)
      if (orth_[g] && (!orth[g] || orth[g]->options() != orth_[g]->options()))
        orth[g] = backend_->make_orthogonalizer(orth_[g]->options());
  }
}

// The units computed together: on a backend that batches units (BackendCaps::batches_units), the
// jobs of one Muon group with bf16 products and one shape, in job order, cut into as many pieces as
// there are compute streams (so the streams still share them); else one job each. fp32 products
// gain nothing from a batch (one GEMM per matrix either way, batched_gemm.h), so they stay one job
// each and spread over the streams. Which matrices share a call changes no bits.
std::vector<std::vector<size_t>> ComputeStreams::batch_jobs(std::span<const UnitJob> jobs, std::span<const int> group_of) const {
  std::vector<std::vector<size_t>> groups;
  const bool batches = backend_->capabilities().batches_units;
  std::map<std::tuple<int, int64_t, int64_t>, size_t> index;  // (group, rows, cols) -> its jobs
  for (size_t k = 0; k < jobs.size(); ++k) {
    const UnitJob& j = jobs[k];
    if (j.batch == 0 || j.rows == 0 || j.cols == 0) continue;  // an empty matrix: nothing to compute
    const int g = group_of[static_cast<size_t>(j.param)];
    const Orthogonalizer* orth = orth_[static_cast<size_t>(g)].get();
    if (!batches || orth == nullptr || orth->options().matmul_dtype != DType::BF16) {
      groups.push_back({k});
      continue;
    }
    const auto [it, fresh] = index.emplace(std::make_tuple(g, j.rows, j.cols), groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(k);
  }
  const size_t streams = static_cast<size_t>(std::max(step_streams_, 1));
  if (streams == 1) return groups;
  std::vector<std::vector<size_t>> pieces;
  for (const std::vector<size_t>& g : groups) {
    const size_t n = std::min(streams, g.size());
    for (size_t p = 0; p < n; ++p)
      pieces.emplace_back(g.begin() + static_cast<std::ptrdiff_t>(g.size() * p / n),
                          g.begin() + static_cast<std::ptrdiff_t>(g.size() * (p + 1) / n));
  }
  return pieces;
}

void ComputeStreams::compute(std::span<const UnitJob> jobs, std::span<const int> group_of,
                             std::span<const GroupOptions> options, DType comm_dtype) {
  const std::vector<std::vector<size_t>> batches = batch_jobs(jobs, group_of);
  const size_t streams = std::min(static_cast<size_t>(std::max(step_streams_, 1)), batches.size());
  // NorMuon's v_mean scratch, one per stream, in the backend's step memory (device memory on a
  // device backend), sized for the largest matrix of this call; allocated before the streams run.
  int64_t scratch = 0;
  for (const UnitJob& j : jobs)
    if (j.v) scratch = std::max(scratch, std::max(j.rows, j.cols));
  if (v_mean_scratch_.size() < std::max<size_t>(streams, 1)) v_mean_scratch_.resize(std::max<size_t>(streams, 1));
  for (size_t w = 0; w < std::max<size_t>(streams, 1) && scratch > 0; ++w)
    if (v_mean_scratch_[w].bytes() < static_cast<size_t>(scratch) * sizeof(float)) {
      // The old buffer goes: the stream that used it is done with it first (stream w − 1 of the
      // extra ones, Queued; this thread's stream is synchronized by allocate's zero fill).
      if (w > 0 && w - 1 < extra_.size()) extra_[w - 1]->synchronize();
      v_mean_scratch_[w] = backend_->allocate(static_cast<size_t>(scratch) * sizeof(float), step_memory(*backend_));
    }
  const auto run_batch = [&](const std::vector<size_t>& batch, std::vector<std::unique_ptr<Orthogonalizer>>& orth,
                             size_t stream) {
    const UnitJob& first = jobs[batch.front()];
    const size_t g = static_cast<size_t>(group_of[static_cast<size_t>(first.param)]);
    const GroupOptions& o = options[g];
    std::vector<Backend::UnitRef> units;
    bool normuon = false;
    for (size_t k : batch) {
      units.push_back({jobs[k].data, jobs[k].batch, jobs[k].v});
      normuon = normuon || jobs[k].v != nullptr;
    }
    float* v_mean = normuon ? v_mean_scratch_[stream].as<float>() : nullptr;
    backend_->muon_batch(*orth[g], units, first.rows, first.cols, v_mean, o.normuon_beta2, comm_dtype);
  };
  if (streams <= 1) {
    for (const auto& b : batches) run_batch(b, orth_, 0);
    return;
  }
  // Several streams: each takes whole batches, largest first (work ~ numel × the Gram side). The
  // order only balances the streams; a matrix's result does not depend on the stream or the batch
  // that runs it. The step has set the backend to one thread (optimizer.cpp) while streams > 1.
  prepare_extra(streams - 1);
  std::vector<double> work(batches.size());
  for (size_t k = 0; k < batches.size(); ++k)
    for (size_t i : batches[k]) {
      const UnitJob& j = jobs[i];
      work[k] += static_cast<double>(j.batch) * static_cast<double>(j.rows) * static_cast<double>(j.cols) *
                 static_cast<double>(std::min(j.rows, j.cols));
    }
  std::vector<size_t> order(batches.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return work[a] > work[b]; });
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  const size_t n = batches.size();
  auto run = [&](std::vector<std::unique_ptr<Orthogonalizer>>& orth, size_t stream) {
    try {
      for (size_t k; (k = next.fetch_add(1)) < n;) run_batch(batches[order[k]], orth, stream);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = n;  // the others stop taking jobs
    }
  };
  // The other streams read what this thread's stream was ordered after (the pipeline's unpack of
  // the chunk): each waits for this point on the device, and records where its own work ends.
  const Fence ready = backend_->fence();
  std::vector<Fence> ended(streams - 1);
  for (size_t w = 0; w + 1 < streams; ++w) {
    auto* orth = &extra_orth_[w];
    extra_[w]->submit(
        [this, &run, &ended, orth, w] {
          run(*orth, w + 1);
          ended[w] = backend_->fence();
        },
        ready);
  }
  run(orth_, 0);  // this stream is the first
  // Wait until every stream has queued its jobs (they use this frame; their device work may still
  // run: the streams are JobEnd::Queued). On a failure anywhere the extra streams go (their
  // destructors wait for their device work, which writes the chunk's arena the caller may free) and
  // are made anew next time.
  for (size_t w = 0; w + 1 < streams; ++w) try {
      extra_[w]->wait_queued();
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  if (failure) {
    extra_.clear();
    std::rethrow_exception(failure);
  }
  // Whoever reads this thread's stream after the call (the scatter's pack) reads the other
  // streams' results too: this stream waits for them on the device.
  for (const Fence& f : ended) backend_->wait(f.event());
}

}  // namespace meshmuon::detail
