// Internal: the DEVICE INTERFACE of a backend, what the components that move memory need: the
// communicators' staging (with MemorySpace, memory_space.h), the state store and its offload, the
// executor's arenas and pipeline. A backend implements it together with the kernel interface
// (kernels.h); `Backend` (backend.h) is the two together. Nothing here names a device API: a device
// backend keeps its native handles (a stream, an event) behind `void*` and Fence / DeviceEvent.
//
// Contract (every implementation; the conformance suite, tests/conformance, runs it over the backends):
// - Memory: allocate() returns zero-filled memory of the kind asked (Host, PinnedHost, Device;
//   Device only where device_caps().device_memory, else std::invalid_argument). A Buffer frees itself
//   through the backend that made it.
// - copy(dst, src, bytes) moves bytes between any two of the backend's memories and is complete when
//   it returns; copy_queued() is the same copy ordered on the calling thread's stream only.
// - Streams: make_stream() gives an ordered queue of jobs (Stream below); a job's kernels run on that
//   stream; synchronize() waits for the calling thread's stream.
// - Device order without the host: fence() records a point in a stream's queued work (empty when
//   everything is complete on return, the cpu), wait() makes a stream's later work wait for one.
//   A communicator waits for the same point through Communicator::order_after (DeviceEvent).
// - Completion on a host-only backend: everything is complete when a call returns, fences are empty.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>

#include "meshmuon/device.h"

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

// What the device side offers: where buffers live and how many streams it may run at once.
struct DeviceCaps {
  bool device_memory = false;     // buffers live off the host
  int max_streams = 0;            // 0: no limit
};

class DeviceServices {
 public:
  virtual ~DeviceServices() = default;
  virtual std::string_view name() const = 0;  // the registered name (registry.h): "cpu", ...
  virtual Device device() const = 0;
  virtual DeviceCaps device_caps() const = 0;

  virtual Buffer allocate(size_t bytes, MemoryKind kind) = 0;  // zero-filled
  // Copies `bytes` between any two of this backend's memories (host, pinned host, device; the
  // ranges must not overlap) on the calling thread: the bytes are at `dst` when it returns. Inside a
  // job of one of this backend's streams it runs on that stream (a device backend: an asynchronous copy
  // on the stream's native queue, then its synchronization), so the asynchronous form is a copy submitted to
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
  // default one), else a native stream of this backend's device (the device API's stream
  // handle; for the cuda backend also its legacy default stream, which is PyTorch's default stream).
  // fence: a point after everything queued on `stream` so far. wait: work queued on `stream` after
  // the call runs after `e` (a fence of any stream of this device, or an event of the caller's).
  virtual Fence fence(void* stream = nullptr) {
    (void)stream;
    return {};
  }
  virtual void wait(DeviceEvent e, void* stream = nullptr) { (void)e, (void)stream; }
};

}  // namespace meshmuon::detail
