// Internal: the compute pass of a chunk (executor.h compute_units): orthogonalization and NorMuon of
// the units this rank assembled, on the stream that calls it, fanned out over the step's compute
// streams (OptimizerOptions::compute_streams).
#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <numeric>

#include "exec/engine_device.h"
#include "exec/executor.h"

namespace dmuon::detail {
namespace {

// Streams 2..k exist, each with an Orthogonalizer per Muon group of the group's current options.
void prepare_streams(Optimizer::Impl& s, size_t extra) {
  while (s.extra_streams.size() < extra) s.extra_streams.push_back(s.backend->make_stream(true));
  if (s.extra_orth.size() < extra) s.extra_orth.resize(extra);
  for (size_t w = 0; w < extra; ++w) {
    auto& orth = s.extra_orth[w];
    orth.resize(s.orth.size());
    for (size_t g = 0; g < s.orth.size(); ++g)
      if (s.orth[g] && (!orth[g] || orth[g]->options() != s.orth[g]->options()))
        orth[g] = s.backend->make_orthogonalizer(s.orth[g]->options());
  }
}

}  // namespace

void compute_units(Optimizer::Impl& s, const StepInputs& in, std::span<const UnitJob> jobs) {
  const size_t streams = std::min(static_cast<size_t>(std::max(s.step_streams, 1)), jobs.size());
  // NorMuon's v_mean scratch, one per stream, in the backend's step memory (device memory on a
  // device backend), sized for the largest matrix of this call; allocated before the streams run.
  int64_t scratch = 0;
  for (const UnitJob& j : jobs)
    if (j.v) scratch = std::max(scratch, std::max(j.rows, j.cols));
  if (s.v_mean_scratch.size() < std::max<size_t>(streams, 1)) s.v_mean_scratch.resize(std::max<size_t>(streams, 1));
  for (size_t w = 0; w < std::max<size_t>(streams, 1) && scratch > 0; ++w)
    if (s.v_mean_scratch[w].bytes() < static_cast<size_t>(scratch) * sizeof(float))
      s.v_mean_scratch[w] = s.backend->allocate(static_cast<size_t>(scratch) * sizeof(float), step_memory(*s.backend));
  const auto run_job = [&](const UnitJob& j, std::vector<std::unique_ptr<Orthogonalizer>>& orth, size_t stream) {
    if (j.batch == 0 || j.rows == 0 || j.cols == 0) return;  // an empty matrix: nothing to compute
    const size_t g = static_cast<size_t>(s.group_of[static_cast<size_t>(j.param)]);
    const GroupOptions& o = in.options[g];
    float* v_mean = j.v ? s.v_mean_scratch[stream].as<float>() : nullptr;
    s.backend->muon_units(*orth[g], j.data, j.batch, j.rows, j.cols, j.v, v_mean, o.normuon_beta2, s.options.comm_dtype);
  };
  if (streams <= 1) {
    for (const UnitJob& j : jobs) run_job(j, s.orth, 0);
    return;
  }
  // Several streams: each takes whole jobs, largest first (work ~ numel × the Gram side). The
  // order only balances the streams; a job's result does not depend on the stream that runs it.
  // The step has set the backend to one thread (optimizer.cpp) while streams > 1.
  prepare_streams(s, streams - 1);
  std::vector<double> work(jobs.size());
  for (size_t k = 0; k < jobs.size(); ++k) {
    const UnitJob& j = jobs[k];
    work[k] = static_cast<double>(j.batch) * static_cast<double>(j.rows) * static_cast<double>(j.cols) *
              static_cast<double>(std::min(j.rows, j.cols));
  }
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return work[a] > work[b]; });
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  const size_t n = jobs.size();
  auto run = [&](std::vector<std::unique_ptr<Orthogonalizer>>& orth, size_t stream) {
    try {
      for (size_t k; (k = next.fetch_add(1)) < n;) run_job(jobs[order[k]], orth, stream);
      s.backend->synchronize();  // a device fault of this stream's kernels surfaces here, caught
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = n;  // the others stop taking jobs
    }
  };
  for (size_t w = 0; w + 1 < streams; ++w) {
    auto* orth = &s.extra_orth[w];
    s.extra_streams[w]->submit([&run, orth, w] { run(*orth, w + 1); });
  }
  run(s.orth, 0);  // this stream is the first
  // Wait for every stream before leaving (their jobs use this frame); a stream whose job failed
  // anyway (its end-of-job synchronization) runs nothing more: the streams are made anew next time.
  bool stream_failed = false;
  for (size_t w = 0; w + 1 < streams; ++w) try {
      s.extra_streams[w]->synchronize();
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      stream_failed = true;
    }
  if (stream_failed) s.extra_streams.clear();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace dmuon::detail
