// Internal: the cuda backend's stream (cuda_stream.h).
#include "backend/cuda/cuda_stream.h"

#include <cuda_runtime_api.h>

#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "backend/cpu/shared/cpu_backend.h"
#include "backend/cuda/shared/cuda_error.h"
#include "backend/cuda/shared/device_guard.h"
#include "backend/cuda/event_pool.h"
#include "backend/cuda/thread_resources.h"

namespace meshmuon::detail {
namespace {

class CudaStream final : public Stream {
 public:
  CudaStream(int device, bool threaded, JobEnd end) : device_(device), end_(end) {
    const DeviceGuard guard(device);
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    host_ = make_cpu_stream(threaded);
  }
  ~CudaStream() override {
    // The jobs first, then their device work (a Queued job's may still run), and only then the
    // worker thread, whose exit frees what lives on it (its scratch, cuBLAS handle, workspace).
    try {
      host_->synchronize();
    } catch (...) {  // a failed job: its error was the step's
    }
    (void)cudaStreamSynchronize(stream_);
    host_.reset();
    for (const Span& t : pending_) (void)cudaEventDestroy(t.start), (void)cudaEventDestroy(t.end);
    cudaStreamDestroy(stream_);
  }
  void submit(std::function<void()> job, Fence after = {}) override {
    host_->submit([this, job = std::move(job), after = std::move(after)] {
      // The caller's thread runs the job when the stream is not threaded: its current device comes
      // back after (declared first: goes last, after the job's end).
      const DeviceGuard guard(device_);
      const cudaStream_t before = tl_stream;
      tl_stream = stream_;
      struct Restore {  // on an error too: nothing the job queued runs on after it
        cudaStream_t before, stream;
        bool synced = false;
        ~Restore() {
          if (!synced) (void)cudaStreamSynchronize(stream);
          tl_stream = before;
        }
      } restore{before, stream_};
      if (!after.empty())
        check_cuda(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(after.event().handle), 0), "cudaStreamWaitEvent (job)");
      if (end_ == JobEnd::Complete) {
        job();
        restore.synced = true;  // the check below either synchronized or throws a device error
        check_cuda(cudaStreamSynchronize(stream_), "stream job");  // the job's Event means its work is in memory
        return;
      }
      // Queued: the job's device time is the span between two timing events around its work; the
      // job ends once its work is queued.
      Span span{timing_.take(), nullptr};
      const cudaError_t r = cudaEventRecord(span.start, stream_);
      if (r != cudaSuccess) timing_.put(span.start);
      check_cuda(r, "cudaEventRecord (job start)");
      try {
        job();
        span.end = timing_.take();
        const cudaError_t e = cudaEventRecord(span.end, stream_);
        if (e != cudaSuccess) timing_.put(span.end), span.end = nullptr;
        check_cuda(e, "cudaEventRecord (job end)");
      } catch (...) {
        timing_.put(span.start);
        throw;
      }
      restore.synced = true;
      std::lock_guard<std::mutex> lock(mu_);
      harvest();
      pending_.push_back(span);
    });
  }
  Event record() override { return host_->record(); }  // Complete: in memory; Queued: queued
  bool busy() override {
    if (host_->busy()) return true;
    if (end_ == JobEnd::Complete) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.empty()) return false;
    const cudaError_t q = query_event(pending_.back().end);
    note(q);
    return q == cudaErrorNotReady;
  }
  void synchronize() override {
    host_->synchronize();
    if (end_ == JobEnd::Complete) return;
    rethrow_device();
    const DeviceGuard guard(device_);
    check_cuda(cudaStreamSynchronize(stream_), "stream synchronize");
  }
  void wait_queued() override {
    host_->synchronize();
    rethrow_device();
  }
  void rethrow() override {
    host_->rethrow();
    rethrow_device();
  }
  double busy_seconds() const override {
    if (end_ == JobEnd::Complete) return host_->busy_seconds();
    std::lock_guard<std::mutex> lock(mu_);
    harvest();
    return device_seconds_;
  }

 private:
  // Counts the spans the device has done, in order, and returns their events to the pool. Under mu_
  // (busy_seconds, and each Queued job's end: a stream nobody reads the time of keeps no backlog).
  void harvest() const {
    while (!pending_.empty()) {
      const Span t = pending_.front();
      cudaError_t q = query_event(t.end);
      float ms = 0;
      if (q == cudaSuccess) q = elapsed_ms(&ms, t.start, t.end);
      if (q != cudaSuccess) {
        note(q);
        break;
      }
      device_seconds_ += static_cast<double>(ms) / 1e3;
      pending_.pop_front();
      timing_.put(t.start), timing_.put(t.end);
    }
  }
  // A device error a query met (a Queued job's kernels faulted after the job ended): kept for
  // rethrow(), wait_queued() and synchronize(), so the stream's owner sees it as a job's error.
  // Under mu_.
  void note(cudaError_t e) const {
    if (e == cudaSuccess || e == cudaErrorNotReady || device_error_) return;
    try {
      check_cuda(e, "a stream's queued device work (a compute job's kernels or the state offload's copies)");
    } catch (...) {
      device_error_ = std::current_exception();
    }
  }
  void rethrow_device() {
    std::lock_guard<std::mutex> lock(mu_);
    if (device_error_) std::rethrow_exception(device_error_);
  }
  struct Span {
    cudaEvent_t start, end;
  };

  int device_;
  JobEnd end_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Stream> host_;
  mutable std::mutex mu_;  // the spans: pushed by the job's thread, read by the stream's owner
  mutable std::deque<Span> pending_;
  mutable EventPool timing_{true};  // the spans' events (their own lock)
  mutable double device_seconds_ = 0;
  mutable std::exception_ptr device_error_;
};

}  // namespace

std::unique_ptr<Stream> make_cuda_stream(int device, bool threaded, JobEnd end) {
  return std::make_unique<CudaStream>(device, threaded, end);
}

}  // namespace meshmuon::detail
