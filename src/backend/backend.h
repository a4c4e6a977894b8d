// Internal: the device seam. A Backend owns where the step's memory lives and how its kernels run:
// buffers from its allocator, streams and events, the element-wise update kernels, batched
// orthogonalization (Gram Newton–Schulz with a reduce callback, so no BLAS call lives outside a
// backend) and its thread control. The executor and LocalOptimizer call only this interface.
// Implementations: `cpu` (cpu/: OpenBLAS, oneDNN), `cuda` (cuda/: cuBLAS and meshmuon's kernels; a
// build without CUDA compiles no_cuda.cpp instead).
//
// Contract: pointers passed to a kernel are the backend's device memory (host memory for cpu).
// Kernels run on the calling thread (cpu) unless submitted to a Stream. Numerics are those of the
// kernels in update.h / orthogonalize.h; for a given backend the results do not depend on the
// stream, the thread or the thread count (the basis of bitwise layout invariance).
// Completion: a device backend's kernels (momentum, apply_update, adamw and their _multi forms, qk_clip_rows,
// round_to_comm, pack, zero, muon_units, gram_newton_schulz) are ordered on the calling thread's
// stream and may still run when they return: later calls on the same thread see their results,
// anything else (a communicator, another Stream, the host, a state hook, the caller after a step)
// only after the thread's synchronize(), or on the device after a wait for its fence(). copy,
// first_non_finite(_of) and the FSDP data movement (convert, ordered_sum, divide, fill_zero)
// complete before returning. A Stream's job ends with its work complete (its Events mean the
// results are in memory) unless the stream was made JobEnd::Queued. On the cpu backend everything
// completes before returning.
// Device order without the host: fence() records a point in a stream's work and wait() makes another
// stream (or, through Communicator::order_after, a communicator) wait for it on the device; the
// pipeline hands a chunk's arena to the communicators and to the compute stream, and the compute
// stream's results back, this way.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "backend/pack.h"
#include "meshmuon/device.h"
#include "meshmuon/orthogonalize.h"
#include "meshmuon/qk_clip.h"
#include "meshmuon/tensor.h"
#include "meshmuon/update.h"
#include "meshmuon/update.h"

namespace meshmuon::detail {

enum class MemoryKind : unsigned char { Host, PinnedHost, Device };

// Owning memory from a backend's allocator (move-only; freed by the backend that made it).
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, size_t bytes, MemoryKind kind, Device device, std::function<void(void*)> free)
      : data_(data), bytes_(bytes), kind_(kind), device_(device), free_(std::move(free)) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  ~Buffer() { reset(); }
  void reset();
  void* data() const { return data_; }
  template <class T> T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }
  MemoryKind kind() const { return kind_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::Host;
  Device device_;
  std::function<void(void*)> free_;
};

// Completion of the work a stream had when the event was recorded.
class Event {
 public:
  Event() : done_(std::make_shared<std::atomic<bool>>(true)) {}
  explicit Event(std::shared_ptr<std::atomic<bool>> done) : done_(std::move(done)) {}
  bool done() const { return done_->load(std::memory_order_acquire); }

 private:
  std::shared_ptr<std::atomic<bool>> done_;
};

// A point in one stream's device work: a device backend's event (from a pool it goes back to when the
// last copy is gone) that another stream or a communicator waits for without the host. Empty on the
// cpu backend, whose work is complete when its calls return. Waiting on it later waits for the point
// it was recorded at (the event is not recorded again while a copy lives).
class Fence {
 public:
  Fence() = default;
  explicit Fence(std::shared_ptr<void> event) : event_(std::move(event)) {}
  DeviceEvent event() const { return {event_.get()}; }
  bool empty() const { return !event_; }

 private:
  std::shared_ptr<void> event_;
};

// What a device stream's job leaves behind when it ends. Complete: its device work is in memory (the
// job ends with its stream synchronized), so the stream's Events mean "in memory". Queued: the job
// ends once its work is queued on the device; its Events mean only that, and whoever reads its
// results waits for a fence the job records at its end (Backend::fence inside the job, then
// Backend::wait or Communicator::order_after): the job's thread goes on to the next job while the
// device still runs this one. The cpu backend's jobs are always complete.
enum class JobEnd : unsigned char { Complete, Queued };

// An ordered queue of work (cpu: a worker thread, or the caller's thread when synchronous).
class Stream {
 public:
  virtual ~Stream() = default;
  // Runs `job` after everything submitted before. `after`: a fence of another stream of this
  // backend that the job's device work waits for, on the device, before anything of it (and before
  // the point busy_seconds() counts from); kept until the job has run. Empty on the cpu backend.
  virtual void submit(std::function<void()> job, Fence after = {}) = 0;
  virtual Event record() = 0;  // done once all jobs submitted so far have ended (JobEnd)
  // Work queued or running: jobs on the host, and for a Queued stream device work not yet done.
  virtual bool busy() = 0;
  // Waits for all work (a Queued stream's device work too); rethrows its first error.
  virtual void synchronize() = 0;
  // Waits until every job submitted so far has ended on the host (JobEnd: a Queued stream's device
  // work may still run); rethrows its first error. The same as synchronize() for Complete streams.
  virtual void wait_queued() { synchronize(); }
  virtual void rethrow() = 0;  // rethrows a failed job's error, if any
  // Time spent running jobs: host time on the cpu backend and for Complete streams; for a Queued
  // stream, device time from each job's first to its last operation, counted once the device has
  // done it (a job still running on the device counts later).
  virtual double busy_seconds() const = 0;
};

struct BackendCaps {
  bool bf16_products = false;     // NsOptions::matmul_dtype BF16
  bool gram_newton_schulz = true;
  bool batched = true;            // expert stacks / same-shape batches in one call
  bool batches_units = false;     // muon_batch runs several units' products together (device backends)
  bool device_memory = false;     // buffers live off the host
  int max_streams = 0;            // 0: no limit
};

// Gram NS's collective: sums `a` (count floats, an s×s Gram matrix) over the shard group in place.
// `ready`: the backend's point after which `a` is written (empty: it is in memory now); the
// collective is ordered after it (Communicator::order_after). When the callback returns, the sum is
// in `a` for the backend's later work.
using GramReduce = std::function<void(float* a, size_t count, int step, DeviceEvent ready)>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;  // "cpu" | "cuda"
  virtual Device device() const = 0;
  virtual BackendCaps capabilities() const = 0;

  virtual Buffer allocate(size_t bytes, MemoryKind kind) = 0;  // zero-filled
  // Copies `bytes` between any two of this backend's memories (host, pinned host, device; the
  // ranges must not overlap) on the calling thread: the bytes are at `dst` when it returns. Inside a
  // job of one of this backend's streams it runs on that stream (cuda: cudaMemcpyAsync on the
  // stream's cudaStream_t, then its synchronization), so the asynchronous form is a copy submitted to
  // a stream: it overlaps the work of the other streams and completes with the stream's Events
  // (state offload streams state this way, state/state_offload.h).
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // copy, but only queued on a device backend: on the calling thread's stream (a Stream job's own),
  // ordered before the thread's later work, in memory after its synchronize() or, for another
  // stream, after a wait for a fence() recorded after it. Host memory in it must be pinned (pageable
  // memory would make the copy synchronous, or be read after the call returns). cpu: copy.
  virtual void copy_queued(void* dst, const void* src, size_t bytes) { copy(dst, src, bytes); }
  // threaded = false: a stream that runs each job on the caller's thread at submit. `end`: what a
  // job leaves behind (JobEnd; ignored where every job's work completes on the host, the cpu).
  virtual std::unique_ptr<Stream> make_stream(bool threaded, JobEnd end = JobEnd::Complete) = 0;
  // Waits until every kernel the calling thread enqueued on its current stream has completed (the
  // completion contract above; inside a job of a Stream, that stream's; cpu: nothing to wait for).
  // Throws a device error it reports.
  virtual void synchronize() {}
  // Device order between streams, without the host (device backends; no-ops on the cpu backend).
  // `stream`: nullptr for the calling thread's stream (a Stream job's own, else the thread's
  // default one), else a native stream of this backend's device (cuda: a cudaStream_t;
  // cudaStreamLegacy for the legacy default stream, which is PyTorch's default stream).
  // fence: a point after everything queued on `stream` so far. wait: work queued on `stream` after
  // the call runs after `e` (a fence of any stream of this device, or an event of the caller's).
  virtual Fence fence(void* stream = nullptr) {
    (void)stream;
    return {};
  }
  virtual void wait(DeviceEvent e, void* stream = nullptr) { (void)e, (void)stream; }

  // Thread control of the backend's own kernels (cpu: the BLAS thread count); 0 leaves it. Returns
  // the previous value. Loads the libraries it needs: a missing one fails here (meshmuon::Error).
  virtual int set_threads(int threads) = 0;
  virtual int threads() const = 0;

  // Runs a pack table (pack.h) over `bases` (the buffers its runs name), on the calling thread.
  virtual void pack(std::span<const PackRun> runs, std::span<std::byte* const> bases) = 0;

  // ---- element-wise update kernels (update.h, qk_clip.h numerics) ----
  virtual void momentum(const MomentumOptions& o, float* buf, const TensorView& grad, float* update) = 0;
  virtual void apply_update(const ApplyOptions& o, float* param, const float* update, int64_t n) = 0;
  virtual void adamw(const AdamWOptions& o, float* param, const TensorView& grad, float* exp_avg, float* exp_avg_sq) = 0;
  // Multi-tensor forms of momentum (+ round_to_comm of each update to `comm`) and apply_update: each
  // tensor gets the bits of the single-tensor calls; a device backend runs a list as one launch
  // (the cuda backend checks every tensor's arguments first). The tensors of one call must not
  // overlap each other (a device runs them concurrently). The defaults call the single forms.
  struct MomentumTensor {
    MomentumOptions o;
    float* buf = nullptr;
    TensorView grad;
    float* update = nullptr;
  };
  virtual void momentum_multi(std::span<const MomentumTensor> tensors, DType comm) {
    for (const MomentumTensor& t : tensors) {
      momentum(t.o, t.buf, t.grad, t.update);
      round_to_comm(t.update, t.grad.numel(), comm);
    }
  }
  struct ApplyTensor {
    ApplyOptions o;
    float* param = nullptr;
    const float* update = nullptr;
    int64_t n = 0;
  };
  virtual void apply_multi(std::span<const ApplyTensor> tensors) {
    for (const ApplyTensor& t : tensors) apply_update(t.o, t.param, t.update, t.n);
  }
  // One tensor of adamw_multi.
  struct AdamWTensor {
    AdamWOptions o;
    float* param = nullptr;
    TensorView grad;
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
  };
  // adamw over several tensors, each getting the bits adamw gives it alone (a device backend runs
  // them as one multi-tensor launch: one kernel, not one per tensor; the cuda backend checks every
  // tensor's arguments before it). The default calls adamw per tensor.
  virtual void adamw_multi(std::span<const AdamWTensor> tensors) {
    for (const AdamWTensor& t : tensors) adamw(t.o, t.param, t.grad, t.exp_avg, t.exp_avg_sq);
  }
  virtual void qk_clip_rows(const QkTag& tag, std::span<const float> logits, double threshold, float* w,
                            int64_t row_begin, int64_t row_end, int64_t cols) = 0;
  // Rounds n values to the communication dtype and back (bf16: as the wire format; fp32: no-op).
  virtual void round_to_comm(float* x, int64_t n, DType comm) = 0;
  // Index of the first non-finite element of a contiguous fp32 / bf16 view, or -1.
  virtual int64_t first_non_finite(const TensorView& g) = 0;
  // The index of the first of `views` (in order) holding a non-finite element, or -1; empty views
  // (TensorView::is_none) are skipped. A device backend scans them all into device flags and reads
  // them back once (one host synchronization for the step's gradients, not one per tensor).
  virtual int64_t first_non_finite_of(std::span<const TensorView> views) {
    for (size_t i = 0; i < views.size(); ++i)
      if (!views[i].is_none() && first_non_finite(views[i]) >= 0) return static_cast<int64_t>(i);
    return -1;
  }

  // ---- FSDP data movement (sharded_params.h numerics; src/fsdp) ----
  // n elements of src (fp32 | bf16) into dst (fp32 | bf16): bits when the dtypes match, fp32 -> bf16
  // round to nearest even (NaN -> 0x7FC0), bf16 -> fp32 exact.
  virtual void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) = 0;
  // `blocks_n` blocks of n elements (dtype fp32 | bf16) back to back: out = block 0 (widened), then
  // out += block j for j = 1..blocks_n-1, per element in this order, in fp32.
  virtual void ordered_sum(const void* blocks, DType dtype, int64_t n, int blocks_n, float* out) = 0;
  // x[k] = x[k] / d (one fp32 division per element).
  virtual void divide(float* x, int64_t n, float d) = 0;
  // bytes of zeros at p.
  virtual void fill_zero(void* p, size_t bytes) = 0;
  // bytes of zeros at p, as an update kernel: ordered on the calling thread's stream (the completion
  // contract above), no host wait. The default is fill_zero.
  virtual void zero(void* p, size_t bytes) { fill_zero(p, bytes); }

  // ---- orthogonalization ----
  virtual std::unique_ptr<Orthogonalizer> make_orthogonalizer(const NsOptions& o) = 0;
  // `batch` matrices rows × cols back to back, input already rounded to the comm dtype: each
  // orthogonalized in place, then NorMuon when `v` is not null (v: batch × normuon_state_size
  // values; v_mean: scratch of one matrix's size), then rounded to the comm dtype.
  virtual void muon_units(Orthogonalizer& orth, float* u, int64_t batch, int64_t rows, int64_t cols, float* v,
                          float* v_mean, double beta2, DType comm) = 0;
  // One unit of a muon_batch call: `batch` matrices back to back at u, their NorMuon state at v
  // (batch × normuon_state_size values) or null.
  struct UnitRef {
    float* u = nullptr;
    int64_t batch = 0;
    float* v = nullptr;
  };
  // muon_units over several units of one shape and one Orthogonalizer: each matrix gets exactly the
  // bits muon_units gives it (a device backend runs their products as batches: capabilities()
  // batches_units). The default calls muon_units per unit.
  virtual void muon_batch(Orthogonalizer& orth, std::span<const UnitRef> units, int64_t rows, int64_t cols,
                          float* v_mean, double beta2, DType comm) {
    for (const UnitRef& r : units) muon_units(orth, r.u, r.batch, rows, cols, r.v, v_mean, beta2, comm);
  }
  // Gram Newton–Schulz on a slice of a matrix sharded along its long dim: x is the local slice
  // (local_rows × local_cols, row-major), the Gram side is rows when `wide` (else cols) of size s;
  // `reduce` sums each step's s×s Gram matrix over the shard group. Result rounded to `comm`.
  virtual void gram_newton_schulz(const NsOptions& o, float* x, int64_t local_rows, int64_t local_cols, bool wide,
                                  int64_t s, const GramReduce& reduce, DType comm) = 0;
};

std::shared_ptr<Backend> make_cpu_backend();
std::shared_ptr<Backend> make_cuda_backend(int device);

}  // namespace meshmuon::detail
