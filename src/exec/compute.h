// Internal: the compute side of a step. The pipeline's compute stream (kept from step to step, with
// what lives on its thread: on cuda its cudaStream_t, cuBLAS handle and Newton–Schulz scratch),
// streams 2..k of OptimizerOptions::compute_streams, each with an Orthogonalizer per Muon group,
// and NorMuon's per-stream scratch. compute() orthogonalizes (+ NorMuon) a chunk's units, fanned out
// over the step's streams; which stream or batch runs a matrix changes none of its bits.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "meshmuon/optim_options.h"

namespace meshmuon::detail {

// One unit batch to orthogonalize (+ NorMuon when v): `batch` matrices rows × cols at data.
struct UnitJob {
  int param = 0;
  float* data = nullptr;
  float* v = nullptr;
  int64_t batch = 1, rows = 0, cols = 0;
};

class ComputeStreams {
 public:
  ComputeStreams() = default;
  ComputeStreams(const ComputeStreams&) = delete;
  ComputeStreams& operator=(const ComputeStreams&) = delete;
  ~ComputeStreams() { drop(); }

  // An Orthogonalizer per Muon group (null for the others).
  void init(Backend& backend, std::span<const ParamGroup> groups);

  // Orthogonalizers for the groups whose Newton–Schulz options changed since the last step (null
  // where unchanged); made before the step's agreement (they may fail), adopted after it.
  std::vector<std::unique_ptr<Orthogonalizer>> refreshed(std::span<const GroupOptions> options) const;
  void adopt(std::vector<std::unique_ptr<Orthogonalizer>> fresh);

  // The step's stream count (≥ 1); the step sets the backend's threads to one when it is above one.
  void set_step_streams(int streams) { step_streams_ = streams < 1 ? 1 : streams; }
  int step_streams() const { return step_streams_; }

  // The pipeline's compute stream, made on first use (or again after a failed step, or when
  // `threaded` changed): queued on a thread of its own when threaded (JobEnd::Queued); else it runs
  // its jobs on the caller's thread, whose per-thread device resources another optimizer may use
  // next, so its jobs end complete.
  Stream& pipeline_stream(bool threaded);
  // Its device time not yet counted in a step's stats (StepStats::orthogonalize_seconds).
  double take_busy_seconds();

  // Orthogonalizes every job (called on the pipeline's compute stream). `group_of`: each
  // parameter's group; `options`: the step's group options.
  void compute(std::span<const UnitJob> jobs, std::span<const int> group_of, std::span<const GroupOptions> options,
               DType comm_dtype);

  // Every stream goes (after a failure): their destructors wait for their device work and join
  // their threads. Made anew when next needed.
  void drop() {
    pipeline_.reset();
    extra_.clear();
  }

 private:
  void prepare_extra(size_t extra);
  std::vector<std::vector<size_t>> batch_jobs(std::span<const UnitJob> jobs, std::span<const int> group_of) const;

  Backend* backend_ = nullptr;
  std::vector<std::unique_ptr<Orthogonalizer>> orth_;  // per group (null: not Muon); the pipeline stream's
  std::unique_ptr<Stream> pipeline_;
  bool threaded_ = false;
  double counted_ = 0;  // the pipeline stream's busy_seconds() already counted (0 for a new stream)
  // Streams 2..k (persistent, JobEnd::Queued), each with its Orthogonalizer per group.
  std::vector<std::unique_ptr<Stream>> extra_;
  std::vector<std::vector<std::unique_ptr<Orthogonalizer>>> extra_orth_;  // [stream − 1][group]
  int step_streams_ = 1;
  std::vector<Buffer> v_mean_scratch_;  // NorMuon's v_mean per stream (backend memory, grown as needed)
};

}  // namespace meshmuon::detail
