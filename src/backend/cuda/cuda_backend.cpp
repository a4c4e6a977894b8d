// Internal: the cuda backend (backend.h) on one CUDA device. Buffers from cudaMalloc /
// cudaMallocHost / calloc; the element-wise kernels of cuda_kernels.cu (the cpu kernels' bits);
// Newton–Schulz batched over matrices of one shape, its products through cuBLASLt / cuBLAS
// (batched_gemm.h: a matrix's bits do not depend on its batch), both dlopen'd at first use
// (libdmuon links only the static cudart, so it loads and runs its cpu paths on machines without a
// GPU, a driver or cuBLAS).
//
// Stream-ordered: a kernel call enqueues on the calling thread's current stream (a CudaStream's
// while one of its jobs runs, else the legacy default stream) and returns; later calls on the same
// thread are ordered after it; synchronize() waits for it on the host, fence() / wait() order
// another stream after it on the device (the caller does one or the other before handing the
// results to a communicator, another stream or the host: backend.h). Calls that return host
// values or bytes (copy, first_non_finite) and the FSDP data movement (convert, ordered_sum,
// divide, fill_zero, whose results go straight to communicators) complete before returning. A
// CudaStream runs its host jobs in order on a worker thread (the cpu stream) with its own
// cudaStream_t current. JobEnd::Complete: it synchronizes that stream when each job ends, so its
// Events (the cpu stream's) mean the jobs' device work is in memory. JobEnd::Queued: a job ends
// once its work is queued, between two timing events (the stream's busy_seconds is device time);
// readers of its results wait for a fence the job records.
#include "backend/cuda/cuda_backend.h"

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/batched_gemm.h"
#include "backend/cuda/cublas_loader.h"
#include "backend/cuda/cuda_kernels.h"
#include "dmuon/error.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/update_args.h"

namespace dmuon::detail {
namespace {

thread_local cudaStream_t tl_stream = nullptr;  // the current stream of this thread (nullptr: legacy default)
// The scratch a muon_batch call takes at most at a time (set_cuda_ns_batch_bytes): the batch is cut
// into parts that fit, one matrix at least. Each part's matrices get the bits they would get alone.
std::atomic<size_t> ns_batch_bytes{size_t{512} << 20};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_error(concat("[cuda] ", what, ": ", cudaGetErrorString(e)));
}

// cudaEventQuery, with cudaErrorNotReady (not reached yet, not an error) cleared from the thread's
// last error, where CUDA runtimes have left it: the next launch would report it (PyTorch clears it
// after every query too). cudaEventElapsedTime likewise.
cudaError_t query(cudaEvent_t e) {
  const cudaError_t r = cudaEventQuery(e);
  if (r == cudaErrorNotReady) (void)cudaGetLastError();
  return r;
}
cudaError_t elapsed_ms(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const cudaError_t r = cudaEventElapsedTime(ms, start, end);
  if (r == cudaErrorNotReady) (void)cudaGetLastError();
  return r;
}

// Ends a kernel call: its launch errors; the work stays queued on the thread's stream.
void finish(cudaError_t launch, const char* what) { check(launch, what); }
// Ends a call that completes before returning: launch errors, then the stream's completion.
void finish_sync(cudaError_t launch, const char* what) {
  check(launch, what);
  check(cudaStreamSynchronize(tl_stream), what);
}

// Events (timing off) for reuse, shared by threads: a fence's event goes back when its last copy is
// gone (CUDA's waits take the event's state when they are enqueued), an upload's when its ring
// region is written again.
class EventPool {
 public:
  // timing: events that cudaEventElapsedTime can read (else cudaEventDisableTiming, cheaper to wait on).
  explicit EventPool(bool timing = false) : flags_(timing ? cudaEventDefault : cudaEventDisableTiming) {}
  ~EventPool() {
    for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
  }
  cudaEvent_t take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, flags_), "cudaEventCreate");
    return e;
  }
  void put(cudaEvent_t e) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(e);
  }

 private:
  unsigned int flags_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

std::atomic<bool> eager_release{true};  // set_upload_ring_eager_release

// Uploads of host tables (pack tables, QK-clip factors, multi-tensor tables) through a ring of pinned memory, so that
// cudaMemcpyAsync stays asynchronous: a copy from pageable memory may synchronize the stream first
// (CUDA stages it), a host wait per pack call. A region is written again only once the copy out of
// it has run (an event per upload); the host waits only when the whole ring is still in flight.
class UploadRing {
 public:
  UploadRing() = default;
  UploadRing(UploadRing&& o) noexcept { swap(o); }
  UploadRing& operator=(UploadRing&& o) noexcept {
    swap(o);
    return *this;
  }
  ~UploadRing() { release(); }
  bool empty() const { return base_ == nullptr && live_.empty(); }

  // Queues a copy of `bytes` at src into device memory `dst` on `stream`; src may be reused at once.
  void upload(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return;
    const size_t need = round_up(bytes);
    // Uploads the device has done give their events back (oldest first; the stream runs them in
    // order), so a ring holds only as many events as uploads in flight.
    while (eager_release.load(std::memory_order_relaxed) && !live_.empty() && query(live_.front().done) == cudaSuccess) {
      events_->put(live_.front().done);
      live_.pop_front();
    }
    if (need > cap_) grow(need);
    if (head_ + need > cap_) head_ = 0;  // wrap
    // The uploads that used this region before: their copies must have run (normally long done, so
    // the waits return at once; the host waits only when the GPU is a whole ring behind).
    for (auto g = live_.begin(); g != live_.end();) {
      if (g->begin < head_ + need && head_ < g->end) {
        check(cudaEventSynchronize(g->done), "upload ring");
        events_->put(g->done);
        g = live_.erase(g);
      } else {
        ++g;
      }
    }
    std::byte* at = static_cast<std::byte*>(base_) + head_;
    std::memcpy(at, src, bytes);
    check(cudaMemcpyAsync(dst, at, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpy to device");
    if (!events_) events_ = std::make_unique<EventPool>();
    cudaEvent_t e = events_->take();
    const cudaError_t recorded = cudaEventRecord(e, stream);
    if (recorded != cudaSuccess) events_->put(e);
    check(recorded, "cudaEventRecord (upload)");
    live_.push_back({head_, head_ + need, e});
    head_ += need;
  }

 private:
  struct Segment {
    size_t begin, end;
    cudaEvent_t done;
  };
  static size_t round_up(size_t b) { return (b + 255) / 256 * 256; }
  void swap(UploadRing& o) noexcept {
    std::swap(base_, o.base_), std::swap(cap_, o.cap_), std::swap(head_, o.head_);
    live_.swap(o.live_), events_.swap(o.events_);
  }
  void grow(size_t need) {
    for (const Segment& g : live_) check(cudaEventSynchronize(g.done), "upload ring"), events_->put(g.done);
    live_.clear();
    if (base_ != nullptr) check(cudaFreeHost(base_), "cudaFreeHost (upload ring)");
    base_ = nullptr, cap_ = 0, head_ = 0;
    const size_t cap = std::max<size_t>(size_t{1} << 20, std::bit_ceil(need) * 4);
    check(cudaMallocHost(&base_, cap), "cudaMallocHost (upload ring)");
    cap_ = cap;
  }
  void release() noexcept {
    for (const Segment& g : live_) (void)cudaEventSynchronize(g.done), events_->put(g.done);
    live_.clear();
    if (base_ != nullptr) (void)cudaFreeHost(base_);
    base_ = nullptr, cap_ = 0, head_ = 0;
  }

  void* base_ = nullptr;
  size_t cap_ = 0, head_ = 0;
  std::deque<Segment> live_;  // uploads whose region was not written again yet, oldest first
  std::unique_ptr<EventPool> events_;  // made at the first upload; destroys the events last
};

// The calling thread's cuBLAS handle and Newton–Schulz scratch per device, freed when the thread
// ends: a pipeline runs its compute stream on a worker thread of its own each step, and resources kept
// for the process would leak a handle and a scratch every step. The main thread's go at exit before
// the runtime's own teardown (thread-local destructors run before atexit handlers); errors there are
// ignored.
struct ThreadResources {
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
    bool legacy = false;  // last used on the legacy stream (outside a CudaStream job)
  };
  struct OnDevice {
    cublasHandle_t blas = nullptr;
    Scratch scratch[2];  // ScratchSlot
    UploadRing uploads;
    Scratch readback;  // pinned host memory (download)
  };
  std::vector<OnDevice> devices;
  ~ThreadResources() {
    for (size_t d = 0; d < devices.size(); ++d) {
      OnDevice& r = devices[d];
      // a device this thread never used: setting it current would make a context there
      if (r.blas == nullptr && r.scratch[0].p == nullptr && r.scratch[1].p == nullptr && r.uploads.empty() &&
          r.readback.p == nullptr)
        continue;
      if (cudaSetDevice(static_cast<int>(d)) != cudaSuccess) continue;
      // What used the memory is done: a CudaStream synchronizes its stream before its worker thread
      // ends; a slot the thread used on the legacy stream waits for that stream here (cudaFree does
      // not wait for memory from cudaMallocAsync). A worker thread never waits for the legacy stream
      // (PyTorch's default stream, busy with unrelated work).
      if (r.scratch[0].legacy || r.scratch[1].legacy) (void)cudaStreamSynchronize(nullptr);
      r.uploads = UploadRing();  // waits for its copies, frees its memory and events
      if (r.readback.p != nullptr) (void)cudaFreeHost(r.readback.p);
      if (r.blas != nullptr) (void)cublas().destroy(r.blas);
      for (const Scratch& x : r.scratch)
        if (x.p != nullptr) (void)cudaFree(x.p);
    }
  }
  OnDevice& on(int device) {
    if (static_cast<int>(devices.size()) <= device) devices.resize(static_cast<size_t>(device) + 1);
    return devices[static_cast<size_t>(device)];
  }
};
thread_local ThreadResources tl_resources;

// This thread's handle on `device` (make_blas_handle: fp32 products in true fp32, bf16 on tensor
// cores), on the thread's current stream.
cublasHandle_t blas_handle(int device) {
  cublasHandle_t& h = tl_resources.on(device).blas;
  if (h == nullptr) h = make_blas_handle("cublasCreate");
  check_blas(cublas().set_stream(h, tl_stream), "cublasSetStream");
  return h;
}

// ---- device memory helpers -----------------------------------------------------------------------

// Scratch of the calling thread on `device` that grows to the largest request and is kept while the
// thread lives (ThreadResources): muon_units runs once per chunk on each compute stream's thread, and
// a cudaMalloc / cudaFree pair per call would synchronize the device every time (cudaFree waits for
// all of its work, NCCL's included). Two slots: Newton–Schulz's work (NsWork, muon_units) and the
// small tables and work of the other calls (pack, qk_clip_rows, first_non_finite,
// gram_newton_schulz), which never nest with each other or with muon_units on one thread. Valid
// until the thread's next request for the same slot. Kernels are stream-ordered, so a slot is safe
// to reuse on the stream that last used it, and the engine keeps each slot to one stream per
// thread: a thread that runs compute jobs on a compute stream's cudaStream_t (a stream that is not
// threaded runs them on its caller's thread) uses the NS slot only there (the engine calls
// muon_units / muon_batch only in compute jobs), the aux slot only for its own calls on its
// current stream outside the jobs. A caller that uses a slot from two streams (the bench runs
// everything on one) orders the second after the first.
enum ScratchSlot { kNsScratch = 0, kAuxScratch = 1 };
std::byte* thread_scratch(int device, size_t bytes, ScratchSlot slot) {
  ThreadResources::Scratch& s = tl_resources.on(device).scratch[slot];
  if (s.bytes < bytes) {
    // Stream-ordered (the slot's one stream, below): the old block is freed once that stream's
    // earlier work, its last user, has run; no host or device wait (cudaFree would wait for the
    // whole device, a stall of every stream mid-step when a compute thread meets a larger matrix).
    if (s.p != nullptr) check(cudaFreeAsync(s.p, tl_stream), "cudaFreeAsync (scratch)");
    s.p = nullptr, s.bytes = 0;
    check(cudaMallocAsync(&s.p, bytes, tl_stream), "cudaMallocAsync (scratch)");
    s.bytes = bytes;
  }
  s.legacy = s.legacy || tl_stream == nullptr;
  return static_cast<std::byte*>(s.p);
}

// A host table to device memory on the thread's stream, through its pinned upload ring (no host
// wait); `src` may be reused when it returns.
void upload(int device, void* dst, const void* src, size_t bytes) {
  tl_resources.on(device).uploads.upload(dst, src, bytes, tl_stream);
}
// Device bytes to host memory on the thread's stream, through the thread's pinned read-back buffer
// (a copy into pageable memory is staged by CUDA and waits on its own): one host wait.
void download(int device, void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  ThreadResources::Scratch& h = tl_resources.on(device).readback;
  if (h.bytes < bytes) {
    if (h.p != nullptr) check(cudaFreeHost(h.p), "cudaFreeHost (read-back)");
    h.p = nullptr, h.bytes = 0;
    const size_t cap = std::max<size_t>(bytes, 4096);
    check(cudaMallocHost(&h.p, cap), "cudaMallocHost (read-back)");
    h.bytes = cap;
  }
  check(cudaMemcpyAsync(h.p, src, bytes, cudaMemcpyDeviceToHost, tl_stream), "cudaMemcpy to host");
  check(cudaStreamSynchronize(tl_stream), "cudaMemcpy to host");
  std::memcpy(dst, h.p, bytes);
}

// Makes `device` current until the end of the scope, then the previous one again.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    int current = 0;
    check(cudaGetDevice(&current), "cudaGetDevice");
    if (current != device) check(cudaSetDevice(device), "cudaSetDevice"), previous_ = current;
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: the device was already current
};

// ---- the stream ----------------------------------------------------------------------------------

class CudaStream final : public Stream {
 public:
  CudaStream(int device, bool threaded, JobEnd end) : device_(device), end_(end) {
    const DeviceGuard guard(device);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
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
        check(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(after.event().cuda_event), 0), "cudaStreamWaitEvent (job)");
      if (end_ == JobEnd::Complete) {
        job();
        restore.synced = true;  // the check below either synchronized or throws a device error
        check(cudaStreamSynchronize(stream_), "stream job");  // the job's Event means its work is in memory
        return;
      }
      // Queued: the job's device time is the span between two timing events around its work; the
      // job ends once its work is queued.
      Span span{timing_.take(), nullptr};
      const cudaError_t r = cudaEventRecord(span.start, stream_);
      if (r != cudaSuccess) timing_.put(span.start);
      check(r, "cudaEventRecord (job start)");
      try {
        job();
        span.end = timing_.take();
        const cudaError_t e = cudaEventRecord(span.end, stream_);
        if (e != cudaSuccess) timing_.put(span.end), span.end = nullptr;
        check(e, "cudaEventRecord (job end)");
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
    const cudaError_t q = query(pending_.back().end);
    note(q);
    return q == cudaErrorNotReady;
  }
  void synchronize() override {
    host_->synchronize();
    if (end_ == JobEnd::Complete) return;
    rethrow_device();
    const DeviceGuard guard(device_);
    check(cudaStreamSynchronize(stream_), "stream synchronize");
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
      cudaError_t q = query(t.end);
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
      check(e, "a stream's queued device work (a compute job's kernels or the state offload's copies)");
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

// ---- the backend -----------------------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device), events_(std::make_shared<EventPool>()) {}

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return {DeviceKind::Cuda, device_}; }
  BackendCaps capabilities() const override {
    BackendCaps c;
    c.bf16_products = true;
    c.device_memory = true;
    c.batches_units = true;
    return c;
  }

  Buffer allocate(size_t bytes, MemoryKind kind) override {
    const DeviceGuard guard = enter();
    if (bytes == 0) return Buffer(nullptr, 0, kind, device(), nullptr);
    void* p = nullptr;
    switch (kind) {
      case MemoryKind::Host:
        p = std::calloc(bytes, 1);
        DMUON_CHECK_RUNTIME(p, "[cuda] out of host memory allocating ", bytes, " bytes");
        return Buffer(p, bytes, kind, {}, [](void* q) { std::free(q); });
      case MemoryKind::PinnedHost:
        check(cudaMallocHost(&p, bytes), concat("cudaMallocHost of ", bytes, " bytes").c_str());
        std::memset(p, 0, bytes);
        return Buffer(p, bytes, kind, {}, [](void* q) { cudaFreeHost(q); });
      case MemoryKind::Device: {
        check(cudaMalloc(&p, bytes), concat("cudaMalloc of ", bytes, " bytes").c_str());
        Buffer b(p, bytes, kind, device(), [](void* q) { cudaFree(q); });
        check(cudaMemsetAsync(p, 0, bytes, tl_stream), "cudaMemset");
        check(cudaStreamSynchronize(tl_stream), "cudaMemset");
        return b;
      }
    }
    return {};
  }
  // cudaMemcpyDefault: unified addressing tells host, pinned host and device memory apart.
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    const DeviceGuard guard = enter();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, tl_stream), "cudaMemcpy (copy)");
    check(cudaStreamSynchronize(tl_stream), "cudaMemcpy (copy)");
  }
  void copy_queued(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    const DeviceGuard guard = enter();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, tl_stream), "cudaMemcpyAsync (queued copy)");
  }
  std::unique_ptr<Stream> make_stream(bool threaded, JobEnd end) override {
    return std::make_unique<CudaStream>(device_, threaded, end);
  }

  void synchronize() override {
    const DeviceGuard guard = enter();
    check(cudaStreamSynchronize(tl_stream), "synchronize");
  }

  Fence fence(void* stream) override {
    const DeviceGuard guard = enter();
    cudaEvent_t e = events_->take();
    const cudaError_t r = cudaEventRecord(e, stream ? static_cast<cudaStream_t>(stream) : tl_stream);
    if (r != cudaSuccess) events_->put(e);
    check(r, "cudaEventRecord (fence)");
    return Fence(std::shared_ptr<void>(e, [pool = events_](void* q) { pool->put(static_cast<cudaEvent_t>(q)); }));
  }
  void wait(DeviceEvent e, void* stream) override {
    if (e.empty()) return;
    const DeviceGuard guard = enter();
    check(cudaStreamWaitEvent(stream ? static_cast<cudaStream_t>(stream) : tl_stream, static_cast<cudaEvent_t>(e.cuda_event), 0),
          "cudaStreamWaitEvent");
  }

  int set_threads(int) override { return 1; }
  int threads() const override { return 1; }

  void pack(std::span<const PackRun> runs, std::span<std::byte* const> bases) override {
    const DeviceGuard guard = enter();
    std::vector<PackRun> live;
    std::vector<int64_t> prefix{0};
    for (const PackRun& r : runs)
      if (r.len > 0 && r.rows > 0) live.push_back(r), prefix.push_back(prefix.back() + r.len * r.rows);
    if (live.empty()) return;
    const size_t runs_bytes = live.size() * sizeof(PackRun), prefix_bytes = prefix.size() * sizeof(int64_t);
    const size_t bases_bytes = bases.size() * sizeof(std::byte*);
    std::vector<std::byte> table(runs_bytes + prefix_bytes + bases_bytes);  // one upload
    std::memcpy(table.data(), live.data(), runs_bytes);
    std::memcpy(table.data() + runs_bytes, prefix.data(), prefix_bytes);
    std::memcpy(table.data() + runs_bytes + prefix_bytes, bases.data(), bases_bytes);
    std::byte* d = thread_scratch(device_, table.size(), kAuxScratch);
    upload(device_, d, table.data(), table.size());
    finish(cuda::pack(reinterpret_cast<const PackRun*>(d), reinterpret_cast<const int64_t*>(d + runs_bytes),
                      static_cast<int>(live.size()), reinterpret_cast<std::byte* const*>(d + runs_bytes + prefix_bytes),
                      prefix.back(), tl_stream),
           "pack");
  }

  // ---- element-wise kernels: the cpu kernels' argument checks, then the same arithmetic ----

  // The single-tensor forms are the multi-tensor kernels on a table of one (one device code path,
  // the one tests/unit/cuda_kernels_host_test.cpp runs on the host).
  void momentum(const MomentumOptions& o, float* buf, const TensorView& grad, float* update) override {
    const MomentumTensor one{o, buf, grad, update};
    momentum_multi(std::span<const MomentumTensor>(&one, 1), DType::F32);
  }
  void apply_update(const ApplyOptions& o, float* param, const float* update, int64_t n) override {
    const ApplyTensor one{o, param, update, n};
    apply_multi(std::span<const ApplyTensor>(&one, 1));
  }
  void adamw(const AdamWOptions& o, float* p, const TensorView& grad, float* m, float* v) override {
    const AdamWTensor one{o, p, grad, m, v};
    adamw_multi(std::span<const AdamWTensor>(&one, 1));
  }

  // A multi-tensor table to the device through the pinned ring, then its launch.
  template <class Item, class Launch>
  void launch_table(const std::vector<Item>& items, int64_t blocks, Launch launch, const char* what) {
    if (items.empty()) return;
    DMUON_CHECK(blocks <= INT_MAX && items.size() <= INT_MAX, "[cuda] ", what, ": ", items.size(), " tensors need ", blocks,
                " blocks; at most ", INT_MAX);
    const DeviceGuard guard = enter();
    const size_t bytes = items.size() * sizeof(Item);
    auto* d = reinterpret_cast<Item*>(thread_scratch(device_, bytes, kAuxScratch));
    upload(device_, d, items.data(), bytes);  // no host wait
    finish(launch(d, static_cast<int>(items.size()), blocks, tl_stream), what);
  }

  void momentum_multi(std::span<const MomentumTensor> tensors, DType comm) override {
    std::vector<cuda::MomentumItem> items;
    items.reserve(tensors.size());
    int64_t blocks = 0;
    for (const MomentumTensor& t : tensors) {  // every tensor checked before the launch
      DMUON_CHECK(t.grad.is_contiguous(), "[momentum] gradient view is not contiguous");
      const int64_t n = t.grad.numel();
      cpu::check_momentum_args(t.o, t.buf, t.grad.data, t.update, n);
      if (n == 0) continue;
      cuda::MomentumItem it{};
      it.buf = t.buf, it.grad = t.grad.data, it.update = t.update, it.n = n, it.block0 = blocks;
      it.w_grad = cpu::to_scalar(1.0 - t.o.momentum), it.mu = cpu::to_scalar(t.o.momentum);
      it.grad_bf16 = t.grad.dtype == DType::BF16;
      it.heavy_ball = t.o.kind != MomentumKind::Ema, it.nesterov = t.o.nesterov, it.round_bf16 = comm != DType::F32;
      items.push_back(it);
      blocks += cuda::multi_tensor_blocks(n);
    }
    launch_table(items, blocks, cuda::momentum_multi, "momentum (multi-tensor)");
  }

  void apply_multi(std::span<const ApplyTensor> tensors) override {
    std::vector<cuda::ApplyItem> items;
    items.reserve(tensors.size());
    int64_t blocks = 0;
    for (const ApplyTensor& t : tensors) {
      cpu::check_apply_args(t.o, t.param, t.update, t.n);
      if (t.n == 0) continue;
      cuda::ApplyItem it{};
      it.p = t.param, it.u = t.update, it.n = t.n, it.block0 = blocks, it.cautious = t.o.cautious;
      // as apply_update's scalars: cautious (adjusted lr, lr·wd), decoupled (1 − lr·wd, −adjusted lr)
      it.a = cpu::to_scalar(t.o.cautious ? t.o.adjusted_lr : 1.0 - t.o.lr * t.o.weight_decay);
      it.b = cpu::to_scalar(t.o.cautious ? t.o.lr * t.o.weight_decay : -t.o.adjusted_lr);
      items.push_back(it);
      blocks += cuda::multi_tensor_blocks(t.n);
    }
    launch_table(items, blocks, cuda::apply_multi, "apply_update (multi-tensor)");
  }

  void adamw_multi(std::span<const AdamWTensor> tensors) override {
    std::vector<cuda::AdamWItem> items;
    items.reserve(tensors.size());
    int64_t blocks = 0;
    for (const AdamWTensor& t : tensors) {  // every tensor checked before the launch
      DMUON_CHECK(t.grad.is_contiguous(), "[adamw] gradient view is not contiguous");
      const int64_t n = t.grad.numel();
      const cpu::AdamScalars sc = cpu::adamw_args(t.o, t.param, t.grad.data, t.exp_avg, t.exp_avg_sq, n);
      if (n == 0) continue;
      items.push_back({sc, t.param, t.grad.data, t.exp_avg, t.exp_avg_sq, n, blocks, t.grad.dtype == DType::BF16, 0});
      blocks += cuda::multi_tensor_blocks(n);
    }
    launch_table(items, blocks, cuda::adamw_multi, "adamw (multi-tensor)");
  }

  void qk_clip_rows(const QkTag& tag, std::span<const float> logits, double tau, float* w, int64_t row_begin,
                    int64_t row_end, int64_t cols) override {
    validate_qk_tag(tag, "<unnamed>");
    validate_qk_logits(tag, logits, "<unnamed>");
    DMUON_CHECK(std::isfinite(tau) && tau > 0, "[qk_clip] threshold ", tau, " must be finite and > 0");
    DMUON_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= qk_tag_rows(tag), "[qk_clip] row range [",
                row_begin, ", ", row_end, ") is outside the ", qk_tag_rows(tag), " rows of the tagged parameter");
    DMUON_CHECK(cols >= 0, "[qk_clip] cols ", cols, " is negative");
    DMUON_CHECK(w != nullptr || row_begin == row_end || cols == 0, "[qk_clip] rows is null");
    const int64_t rows = row_end - row_begin;
    if (rows == 0 || cols == 0) return;
    std::vector<float> f(static_cast<size_t>(rows));  // the factors on the host (double math, as the cpu)
    bool any = false;
    for (int64_t r = 0; r < rows; ++r) {
      f[static_cast<size_t>(r)] = qk_clip_row_factor(tag, logits, tau, row_begin + r);
      any = any || f[static_cast<size_t>(r)] != 1.0f;
    }
    if (!any) return;
    const DeviceGuard guard = enter();
    auto* d = reinterpret_cast<float*>(thread_scratch(device_, f.size() * sizeof(float), kAuxScratch));
    upload(device_, d, f.data(), f.size() * sizeof(float));
    finish(cuda::scale_rows(w, d, rows, cols, tl_stream), "qk_clip_rows");
  }

  void round_to_comm(float* x, int64_t n, DType comm) override {
    if (comm == DType::F32 || n <= 0) return;
    const DeviceGuard guard = enter();
    finish(cuda::round_bf16(x, n, tl_stream), "round_to_comm");
  }

  // ---- FSDP data movement: one launch each, complete before returning (communicators read them) ----
  void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) override {
    if (n <= 0) return;
    if (dst_dtype == src_dtype) return copy(dst, src, static_cast<size_t>(n) * dtype_size(dst_dtype));
    const DeviceGuard guard = enter();
    if (src_dtype == DType::F32)
      finish_sync(cuda::to_bf16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n, tl_stream), "convert to bf16");
    else
      finish_sync(cuda::from_bf16(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n, tl_stream), "convert to fp32");
  }
  void ordered_sum(const void* blocks, DType dtype, int64_t n, int blocks_n, float* out) override {
    if (n <= 0) return;
    const DeviceGuard guard = enter();
    finish_sync(cuda::ordered_sum(blocks, dtype == DType::BF16, n, blocks_n, out, tl_stream), "ordered_sum");
  }
  void divide(float* x, int64_t n, float d) override {
    if (n <= 0) return;
    const DeviceGuard guard = enter();
    finish_sync(cuda::divide(x, n, d, tl_stream), "divide");
  }
  void fill_zero(void* p, size_t bytes) override {
    if (bytes == 0) return;
    const DeviceGuard guard = enter();
    finish_sync(cudaMemsetAsync(p, 0, bytes, tl_stream), "fill_zero");
  }
  void zero(void* p, size_t bytes) override {
    if (bytes == 0) return;
    const DeviceGuard guard = enter();
    finish(cudaMemsetAsync(p, 0, bytes, tl_stream), "zero");
  }

  // One flag per view (the index of its first non-finite element, ~0 for none), all views scanned by
  // one multi-tensor launch, read back by one copy: one host synchronization for the step's gradients.
  std::vector<unsigned long long> non_finite_flags(std::span<const TensorView> views) {
    std::vector<unsigned long long> idx(views.size(), ~0ull);
    if (views.empty()) return idx;
    std::vector<cuda::NonFiniteItem> items;  // one multi-tensor launch over every view
    int64_t blocks = 0;
    for (size_t i = 0; i < views.size(); ++i) {
      const TensorView& g = views[i];
      if (g.is_none() || g.numel() == 0) continue;
      items.push_back({g.data, g.numel(), blocks, g.dtype == DType::BF16, static_cast<int32_t>(i)});
      blocks += cuda::multi_tensor_blocks(g.numel());
    }
    DMUON_CHECK(blocks <= INT_MAX && views.size() <= INT_MAX, "[cuda] non-finite scan: ", views.size(), " tensors need ",
                blocks, " blocks; at most ", INT_MAX);
    const DeviceGuard guard = enter();
    // the flags, then the table (256-byte aligned), in the thread's scratch
    const size_t flag_bytes = views.size() * sizeof(unsigned long long), table_at = (flag_bytes + 255) / 256 * 256;
    std::byte* scratch = thread_scratch(device_, table_at + items.size() * sizeof(cuda::NonFiniteItem), kAuxScratch);
    auto* flags = reinterpret_cast<unsigned long long*>(scratch);
    auto* table = reinterpret_cast<cuda::NonFiniteItem*>(scratch + table_at);
    check(cudaMemsetAsync(flags, 0xFF, flag_bytes, tl_stream), "cudaMemset");
    if (!items.empty()) {
      upload(device_, table, items.data(), items.size() * sizeof(cuda::NonFiniteItem));
      check(cuda::first_non_finite_multi(table, static_cast<int>(items.size()), blocks, flags, tl_stream), "first_non_finite");
    }
    download(device_, idx.data(), flags, flag_bytes);  // the one synchronization
    return idx;
  }
  int64_t first_non_finite_of(std::span<const TensorView> views) override {
    const std::vector<unsigned long long> idx = non_finite_flags(views);
    for (size_t i = 0; i < idx.size(); ++i)
      if (idx[i] != ~0ull) return static_cast<int64_t>(i);
    return -1;
  }
  int64_t first_non_finite(const TensorView& g) override {
    const unsigned long long idx = non_finite_flags(std::span<const TensorView>(&g, 1))[0];
    return idx == ~0ull ? -1 : static_cast<int64_t>(idx);
  }

  // ---- orthogonalization ----

  // The Orthogonalizer carries the options and the schedule (validated as on the cpu); its run() is
  // the cpu kernel, so on this backend only muon_units uses it.
  std::unique_ptr<Orthogonalizer> make_orthogonalizer(const NsOptions& o) override {
    DMUON_CHECK(!o.bf16_rounding,
                "[cuda] bf16_rounding (torch's bf16 emulation) is not implemented on the cuda backend; use "
                "matmul_dtype bf16 or the cpu backend");
    return std::make_unique<Orthogonalizer>(o);
  }

  void muon_units(Orthogonalizer& orth, float* u, int64_t batch, int64_t rows, int64_t cols, float* v, float* v_mean,
                  double beta2, DType comm) override {
    const UnitRef one{u, batch, v};
    muon_batch(orth, std::span<const UnitRef>(&one, 1), rows, cols, v_mean, beta2, comm);
  }

  // The matrices of every unit, ns_batch_bytes of scratch at a time (set_cuda_ns_batch_bytes): Newton–Schulz on the whole
  // batch (orthogonalize, one batched call per product), then per matrix the copy back, NorMuon and
  // the comm rounding. A matrix's bits do not depend on its batch (batched_gemm.h).
  void muon_batch(Orthogonalizer& orth, std::span<const UnitRef> units, int64_t rows, int64_t cols, float* v_mean,
                  double beta2, DType comm) override {
    if (rows == 0 || cols == 0) return;
    DMUON_CHECK(rows <= INT_MAX && cols <= INT_MAX, "[orth] matrix ", rows, "x", cols,
                " exceeds the BLAS int range; split it or orthogonalize per expert");
    const int64_t len = normuon_state_size(rows, cols);
    std::vector<Matrix> mats;
    for (const UnitRef& r : units)
      for (int64_t e = 0; e < r.batch; ++e)
        mats.push_back({r.u + e * rows * cols, r.v != nullptr ? r.v + e * len : nullptr});
    if (mats.empty()) return;
    for (const Matrix& x : mats)
      DMUON_CHECK(x.v == nullptr || v_mean != nullptr, "[cuda] muon_units: NorMuon needs the v_mean scratch");
    const DeviceGuard guard = enter();
    const bool bf16 = orth.options().matmul_dtype == DType::BF16;
    NsPointers unused;
    const size_t per_matrix = ns_layout(rows, cols, bf16, len, 2, nullptr, unused) - ns_layout(rows, cols, bf16, len, 1, nullptr, unused);
    const size_t cap = std::max<size_t>(1, ns_batch_bytes.load() / std::max<size_t>(per_matrix, 1));
    const float w_v = cpu::to_scalar(1.0 - beta2);  // normuon_finish's weight
    for (size_t first = 0; first < mats.size(); first += cap) {
      const std::span<const Matrix> part(mats.data() + first, std::min(cap, mats.size() - first));
      NsWork w(device_, rows, cols, bf16, len, static_cast<int64_t>(part.size()));
      const float* result = orthogonalize(orth, part, rows, cols, w);
      for (size_t i = 0; i < part.size(); ++i) {
        float* x = part[i].x;
        check(cudaMemcpyAsync(x, result + static_cast<int64_t>(i) * w.sx, static_cast<size_t>(rows * cols) * sizeof(float),
                              cudaMemcpyDeviceToDevice, tl_stream),
              "ns copy");
        if (part[i].v != nullptr) check(cuda::normuon(x, rows, cols, v_mean, part[i].v, w_v, w.nm, tl_stream), "normuon");
        round_to_comm(x, rows * cols, comm);
      }
    }
  }

  // The gram_allreduce strategy's iteration, as the cpu backend's: per step the local slice's Gram
  // matrix (exactly symmetric: the lower triangle mirrored), summed over the shard group by `reduce`
  // on device memory (the communicator stages or runs NCCL), A² and the polynomial, X ← a·X + Z·X.
  // Step 0's Gram of the unnormalized slice gives ‖G‖² as its trace: one host synchronization there.
  void gram_newton_schulz(const NsOptions& ns, float* x, int64_t m, int64_t n, bool wide, int64_t sd,
                          const GramReduce& reduce, DType comm) override {
    const DeviceGuard guard = enter();
    const int64_t ld = wide ? n : m, numel = m * n, ss = sd * sd;
    DMUON_CHECK(sd <= INT_MAX && ld <= INT_MAX && m <= INT_MAX && n <= INT_MAX, "[cuda] gram_newton_schulz: ", m, "x",
                n, " (Gram side ", sd, ") exceeds the BLAS int range");
    // A, A², the copy of X and the norm in the thread's scratch, each 256-byte aligned
    const auto up = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t a_bytes = up(static_cast<size_t>(ss) * sizeof(float)), tmp_bytes = up(static_cast<size_t>(numel) * sizeof(float));
    std::byte* work = thread_scratch(device_, 2 * a_bytes + tmp_bytes + sizeof(double), kAuxScratch);
    float *a = reinterpret_cast<float*>(work), *a2 = reinterpret_cast<float*>(work + a_bytes),
          *tmp = reinterpret_cast<float*>(work + 2 * a_bytes);
    auto* norm_dev = reinterpret_cast<double*>(work + 2 * a_bytes + tmp_bytes);
    const auto gram = [&](int step) {
      if (ld > 0) {
        // row-major x is column-major xᵀ (ld n): wide A = X·Xᵀ = (xᵀ)ᵀ·xᵀ; tall A = Xᵀ·X = xᵀ·(xᵀ)ᵀ.
        if (wide) gemm(true, false, sd, sd, n, x, n, x, n, a, sd, false);
        else gemm(false, true, sd, sd, m, x, n, x, n, a, sd, false);
        check(cuda::mirror_lower(a, sd, ss, 1, tl_stream), "gram mirror");
      } else {
        check(cudaMemsetAsync(a, 0, static_cast<size_t>(ss) * sizeof(float), tl_stream), "cudaMemset");
      }
      const Fence written = fence(nullptr);  // the collective reads it on its own stream, after this point
      reduce(a, static_cast<size_t>(ss), step, written.event());
    };
    const std::vector<Coefficients> coef = make_schedule(ns);
    gram(0);
    check(cuda::trace(a, sd, norm_dev, tl_stream), "gram trace");
    double norm2 = 0;
    download(device_, &norm2, norm_dev, sizeof norm2);
    const double norm = std::sqrt(norm2) * ns.scale;
    const double d = ns.eps_mode == EpsMode::Add ? norm + ns.eps : std::max(norm, static_cast<double>(ns.eps));
    if (norm2 == 0 || d == 0) {  // every rank sees the same sum: all leave here together
      finish(cudaMemsetAsync(x, 0, static_cast<size_t>(numel) * sizeof(float), tl_stream), "gram zeros");
      return;
    }
    const float inv = static_cast<float>(1.0 / d), inv2 = static_cast<float>(1.0 / (d * d));
    check(cuda::scale(x, x, numel, inv, tl_stream), "gram normalize");
    check(cuda::scale(a, a, ss, inv2, tl_stream), "gram normalize");
    const int S = static_cast<int>(sd), M = static_cast<int>(m), N = static_cast<int>(n);
    for (size_t t = 0; t < coef.size(); ++t) {
      if (t > 0) gram(static_cast<int>(t));
      // a2 = c·A·A + b·A (row-major products through column-major identities; A is symmetric)
      gemm(false, false, S, S, S, a, S, a, S, a2, S, false, static_cast<float>(coef[t].c));
      check(cuda::add_scaled(a2, a, ss, static_cast<float>(coef[t].b), tl_stream), "gram polynomial");
      if (numel == 0) continue;
      check(cudaMemcpyAsync(tmp, x, static_cast<size_t>(numel) * sizeof(float), cudaMemcpyDeviceToDevice, tl_stream),
            "gram copy");
      // wide: X = a2·tmp + a·X (row-major) = column-major xᵀ = tmpᵀ·a2ᵀ + a·xᵀ; tall: X = tmp·a2 + a·X.
      if (wide) gemm(false, false, N, M, S, tmp, N, a2, S, x, N, false, 1.0f, static_cast<float>(coef[t].a));
      else gemm(false, false, N, M, S, a2, S, tmp, N, x, N, false, 1.0f, static_cast<float>(coef[t].a));
    }
    round_to_comm(x, numel, comm);
  }

 private:
  // This backend's device, current for the calling scope; the caller's current device comes back
  // at its end (torch's current device on the caller's thread is left as it was).
  DeviceGuard enter() const { return DeviceGuard(device_); }

  // A matrix of a muon_batch call and its NorMuon state (or null).
  struct Matrix {
    float* x;
    float* v;
  };
  // Device pointers of a muon_batch part's scratch (NsWork's pieces). Each matrix of the part has a
  // slot `sx` (m×n) or `sg` (s×s) elements apart in the slabs, padded to 128 elements so that every
  // slot starts at the first one's 256-byte alignment (fp32 and bf16 alike).
  struct NsPointers {
    double *norm2 = nullptr, *partials = nullptr;
    cuda::NormuonScratch nm{};
    float *x0 = nullptr, *x1 = nullptr, *g = nullptr, *g2 = nullptr, *z = nullptr;
    uint16_t *xb = nullptr, *gb = nullptr, *zb = nullptr;
    int64_t sx = 0, sg = 0;
  };
  // Lays the pieces out from `base` (256-byte aligned; base null: only measures) and returns the
  // bytes: the norm and its partial sums, NorMuon's step (len floats) and scalars (used by one
  // matrix after another, stream-ordered), the ping-pong X slabs, the G, G², Z slabs, and the bf16
  // operand copies.
  static size_t ns_layout(int64_t m, int64_t n, bool bf16, int64_t len, int64_t batch, std::byte* base, NsPointers& p) {
    const auto pad = [](int64_t e) { return (e + 127) / 128 * 128; };
    p.sx = pad(m * n), p.sg = pad(std::min(m, n) * std::min(m, n));
    const size_t bx = static_cast<size_t>(batch * p.sx), bg = static_cast<size_t>(batch * p.sg);
    size_t off = 0;
    auto take = [&](size_t bytes) {
      std::byte* at = base ? base + off : nullptr;
      off += (bytes + 255) / 256 * 256;
      return at;
    };
    p.norm2 = reinterpret_cast<double*>(take(sizeof(double)));
    p.partials = reinterpret_cast<double*>(take(cuda::kSumSquaresBlocks * sizeof(double)));
    p.nm.norm = reinterpret_cast<double*>(take(sizeof(double)));
    p.nm.ratio = reinterpret_cast<float*>(take(sizeof(float)));
    p.nm.step = reinterpret_cast<float*>(take(static_cast<size_t>(len) * sizeof(float)));
    p.x0 = reinterpret_cast<float*>(take(bx * sizeof(float)));
    p.x1 = reinterpret_cast<float*>(take(bx * sizeof(float)));
    p.g = reinterpret_cast<float*>(take(bg * sizeof(float)));
    p.g2 = reinterpret_cast<float*>(take(bg * sizeof(float)));
    p.z = reinterpret_cast<float*>(take(bg * sizeof(float)));
    if (bf16) {
      p.xb = reinterpret_cast<uint16_t*>(take(bx * sizeof(uint16_t)));
      p.gb = reinterpret_cast<uint16_t*>(take(bg * sizeof(uint16_t)));
      p.zb = reinterpret_cast<uint16_t*>(take(bg * sizeof(uint16_t)));
    }
    return off;
  }
  // Scratch of one muon_batch part, laid out in the thread's scratch on the device (call enter()
  // first). Valid until the thread's next muon_batch.
  struct NsWork : NsPointers {
    NsWork(int device, int64_t m, int64_t n, bool bf16, int64_t len, int64_t batch) : s(std::min(m, n)), batch(batch) {
      NsPointers unused;
      ns_layout(m, n, bf16, len, batch,
                thread_scratch(device, ns_layout(m, n, bf16, len, batch, nullptr, unused), kNsScratch), *this);
    }
    int64_t s, batch;
  };

  // Column-major C (M×N) = alpha·op(A)·op(B) + beta·C, fp32 or bf16 operands with fp32 accumulation and
  // output (gram_newton_schulz's products: one matrix, alpha and beta).
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B, int64_t ldb,
            float* C, int64_t ldc, bool bf16, float alpha = 1.0f, float beta = 0.0f) {
    detail::gemm(blas_handle(device_), ta, tb, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), A,
                 static_cast<int>(lda), B, static_cast<int>(ldb), C, static_cast<int>(ldc), bf16, alpha, beta,
                 bf16 ? "cublasGemmEx (bf16)" : "cublasGemmEx (fp32)");
  }

  // `batch` column-major products C_i (M×N) = op(A_i)·op(B_i), the operands' matrices sa / sb / sc
  // elements apart (batched_gemm.h: the same bits for a matrix whatever the batch).
  void bgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, int64_t sa, const void* B,
             int64_t ldb, int64_t sb, float* C, int64_t ldc, int64_t sc, bool bf16, int64_t batch) {
    GemmCall c;
    c.ta = ta, c.tb = tb, c.m = static_cast<int>(M), c.n = static_cast<int>(N), c.k = static_cast<int>(K);
    c.a = A, c.lda = static_cast<int>(lda), c.stride_a = sa;
    c.b = B, c.ldb = static_cast<int>(ldb), c.stride_b = sb;
    c.d = C, c.ldd = static_cast<int>(ldc), c.stride_d = sc;
    c.bf16 = bf16;
    batched_gemm(c, batch, device_, tl_stream, blas_handle(device_));
  }

  // `batch` s×s symmetric products into the row-major slab `out` (matrices `stride` apart):
  // symmetric, the column-major view's block columns [c0, c1) over rows [0, c1) (the row-major lower
  // block triangle; cuda::lower_blocks) then a mirror; else one full product. `block(c0, c1)` issues
  // the batched GEMM of one block column with c1 rows. Every matrix gets the same calls whatever its
  // batch (bitwise layout invariance).
  template <class Block>
  void symmetric_product(int64_t s, float* out, int64_t stride, int64_t batch, bool symmetric, Block&& block) {
    const int64_t blocks = symmetric ? cuda::lower_blocks(s) : 1;
    for (int64_t b = 0; b < blocks; ++b)
      block(symmetric ? cuda::lower_bound(s, b) : 0, symmetric ? cuda::lower_bound(s, b + 1) : s);
    if (blocks > 1) check(cuda::mirror_lower(out, s, stride, batch, tl_stream), "ns mirror");
  }

  // G = X·Xᵀ (wide) or Xᵀ·X (tall) of the row-major m×n matrices of the slab `xa` (fp32 or bf16,
  // w.sx apart) into the s×s slab g (w.sg apart). In the column-major view A = xa (n×m, ld n): wide
  // G = Aᵀ·A, block Aᵀ[0:c1]·A[:, c0:c1]; tall G = A·Aᵀ, block A[0:c1, :]·(A[c0:c1, :])ᵀ.
  void gram_product(const void* xa, int64_t m, int64_t n, float* g, bool bf16, bool symmetric, const NsWork& w) {
    const int64_t s = w.s, k = std::max(m, n);
    const size_t elem = bf16 ? 2 : 4;
    const auto* base = static_cast<const std::byte*>(xa);
    symmetric_product(s, g, w.sg, w.batch, symmetric, [&](int64_t c0, int64_t c1) {
      if (m <= n)
        bgemm(true, false, c1, c1 - c0, k, base, n, w.sx, base + static_cast<size_t>(c0 * n) * elem, n, w.sx, g + c0 * s,
              s, w.sg, bf16, w.batch);
      else
        bgemm(false, true, c1, c1 - c0, k, base, n, w.sx, base + static_cast<size_t>(c0) * elem, n, w.sx, g + c0 * s, s,
              w.sg, bf16, w.batch);
    });
  }

  // g2 = G·G for the symmetric s×s matrices of the slab `ga` (fp32 or bf16): block G[0:c1, :]·G[:, c0:c1].
  void square_product(const void* ga, float* g2, bool bf16, bool symmetric, const NsWork& w) {
    const int64_t s = w.s;
    const size_t elem = bf16 ? 2 : 4;
    const auto* base = static_cast<const std::byte*>(ga);
    symmetric_product(s, g2, w.sg, w.batch, symmetric, [&](int64_t c0, int64_t c1) {
      bgemm(false, false, c1, c1 - c0, s, base, s, w.sg, base + static_cast<size_t>(c0 * s) * elem, s, w.sg, g2 + c0 * s,
            s, w.sg, bf16, w.batch);
    });
  }

  // Newton–Schulz on the row-major m×n device matrices `mats`, as the cpu Orthogonalizer::run, into
  // the slab it returns (w.x0 or w.x1, matrices w.sx apart): X₀ = x / (‖x‖·scale + eps) (or max), per
  // step G = X·Xᵀ (wide) / XᵀX (tall), Z = aI + bG + cG², X ← Z·X / X·Z. Row-major X is column-major Xᵀ
  // (ld n) for cuBLAS. G and G² are formed on their block triangle (gram_product, square_product)
  // unless the method is plain; method gram runs as symmetric here. Each product is one batched call
  // over the part.
  const float* orthogonalize(Orthogonalizer& orth, std::span<const Matrix> mats, int64_t m, int64_t n, NsWork& w) {
    const NsOptions& o = orth.options();
    const bool bf16 = o.matmul_dtype == DType::BF16;
    const int64_t b = w.batch;
    // X₀ = x / denom with the norm kept on the device (no host synchronization per matrix); an
    // all-zero x gives +0 throughout, which the products keep exactly (the cpu returns zeros too).
    for (int64_t i = 0; i < b; ++i) {
      const float* x = mats[static_cast<size_t>(i)].x;
      check(cuda::sum_squares(x, m * n, w.partials, w.norm2, tl_stream), "ns norm");
      check(cuda::normalize(x, w.x0 + i * w.sx, m * n, w.norm2, static_cast<double>(o.scale), static_cast<double>(o.eps),
                            o.eps_mode == EpsMode::Add, tl_stream),
            "ns normalize");
    }
    const bool wide = m <= n;
    const bool symmetric = o.method != NsMethod::Plain;  // gram runs as symmetric here
    const int64_t s = w.s;
    float* cur = w.x0;
    float* other = w.x1;
    for (const Coefficients& k : orth.coefficients()) {
      const void* xa = cur;
      if (bf16) check(cuda::to_bf16(cur, w.xb, b * w.sx, tl_stream), "ns bf16"), xa = w.xb;
      gram_product(xa, m, n, w.g, bf16, symmetric, w);
      const void* ga = w.g;
      if (bf16) check(cuda::to_bf16(w.g, w.gb, b * w.sg, tl_stream), "ns bf16"), ga = w.gb;
      square_product(ga, w.g2, bf16, symmetric, w);
      check(cuda::ns_polynomial(w.g, w.g2, w.z, s, w.sg, b, static_cast<float>(k.a), static_cast<float>(k.b),
                                static_cast<float>(k.c), tl_stream),
            "ns polynomial");
      const void* za = w.z;
      if (bf16) check(cuda::to_bf16(w.z, w.zb, b * w.sg, tl_stream), "ns bf16"), za = w.zb;
      if (wide) bgemm(false, false, n, m, m, xa, n, w.sx, za, m, w.sg, other, n, w.sx, bf16, b);
      else bgemm(false, false, n, m, n, za, n, w.sg, xa, n, w.sx, other, n, w.sx, bf16, b);
      std::swap(cur, other);
    }
    return cur;
  }

  int device_;
  std::shared_ptr<EventPool> events_;  // shared with the fences, which may outlive the backend
};

}  // namespace

size_t set_cuda_ns_batch_bytes(size_t bytes) { return ns_batch_bytes.exchange(bytes); }

bool cuda_device_available(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    if (why) *why = cudaGetErrorString(e);
    return false;
  }
  if (count == 0) {
    if (why) *why = "cudaGetDeviceCount found 0 devices";
    return false;
  }
  return true;
}

bool set_upload_ring_eager_release(bool on) { return eager_release.exchange(on); }

std::shared_ptr<Backend> make_cuda_backend(int device) {
  std::string why;
  if (!cuda_device_available(&why)) throw_error(concat("[cuda] no CUDA device: ", why));
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  DMUON_CHECK_RUNTIME(device >= 0 && device < count, "[cuda] device ", device, " requested but only ", count,
                      " CUDA device(s) are visible");
  const DeviceGuard guard(device);  // creates the device's context, leaves the caller's device current
  return std::make_shared<CudaBackend>(device);
}

}  // namespace dmuon::detail
