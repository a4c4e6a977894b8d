// Internal: UploadRing, a thread's pinned staging ring for host-to-device uploads of small host
// tables (pack tables, QK-clip factors, multi-tensor tables).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <deque>
#include <memory>

#include "backend/cuda/event_pool.h"

namespace meshmuon::detail {

// Uploads through a ring of pinned memory, so that cudaMemcpyAsync stays asynchronous: a copy from
// pageable memory may synchronize the stream first (CUDA stages it), a host wait per pack call. A
// region is written again only once the copy out of it has run (an event per upload); the host
// waits only when the whole ring is still in flight. set_upload_ring_eager_release (cuda_backend.h)
// says whether an upload first gives back the events of the uploads the device has done.
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
  void upload(void* dst, const void* src, size_t bytes, cudaStream_t stream);

 private:
  struct Segment {
    size_t begin, end;
    cudaEvent_t done;
  };
  static size_t round_up(size_t b) { return (b + 255) / 256 * 256; }
  void swap(UploadRing& o) noexcept;
  void grow(size_t need);
  void release() noexcept;

  void* base_ = nullptr;
  size_t cap_ = 0, head_ = 0;
  std::deque<Segment> live_;  // uploads whose region was not written again yet, oldest first
  std::unique_ptr<EventPool> events_;  // made at the first upload; destroys the events last
};

}  // namespace meshmuon::detail
