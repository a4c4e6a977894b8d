// Internal: the pool of reusable CUDA events (event_pool.h).
#include "backend/cuda/event_pool.h"

#include "backend/cuda/shared/cuda_error.h"

namespace meshmuon::detail {

EventPool::EventPool(bool timing) : flags_(timing ? cudaEventDefault : cudaEventDisableTiming) {}

EventPool::~EventPool() {
  for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
}

cudaEvent_t EventPool::take() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreateWithFlags(&e, flags_), "cudaEventCreate");
  return e;
}

void EventPool::put(cudaEvent_t e) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(e);
}

}  // namespace meshmuon::detail
