// Internal: EventPool, CUDA events kept for reuse (the backend's fences, the upload rings, the
// streams' timing spans).
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

namespace meshmuon::detail {

// Events for reuse, shared by threads: a fence's event goes back when its last copy is gone (CUDA's
// waits take the event's state when they are enqueued), an upload's when its ring region is written
// again, a timing span's when the stream has counted it.
class EventPool {
 public:
  // timing: events that cudaEventElapsedTime can read (else cudaEventDisableTiming, cheaper to wait on).
  explicit EventPool(bool timing = false);
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // A free event, or a new one (throws meshmuon::Error when CUDA cannot make one).
  cudaEvent_t take();
  void put(cudaEvent_t e) noexcept;

 private:
  unsigned int flags_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

}  // namespace meshmuon::detail
