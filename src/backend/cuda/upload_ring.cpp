// Internal: the pinned upload ring (upload_ring.h) and its eager-release switch (cuda_backend.h).
#include "backend/cuda/upload_ring.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <utility>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/shared/cuda_error.h"

namespace meshmuon::detail {
namespace {

std::atomic<bool> eager_release{true};  // set_upload_ring_eager_release

}  // namespace

void UploadRing::upload(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  const size_t need = round_up(bytes);
  // Uploads the device has done give their events back (oldest first; the stream runs them in
  // order), so a ring holds only as many events as uploads in flight.
  while (eager_release.load(std::memory_order_relaxed) && !live_.empty() && query_event(live_.front().done) == cudaSuccess) {
    events_->put(live_.front().done);
    live_.pop_front();
  }
  if (need > cap_) grow(need);
  if (head_ + need > cap_) head_ = 0;  // wrap
  // The uploads that used this region before: their copies must have run (normally long done, so
  // the waits return at once; the host waits only when the GPU is a whole ring behind).
  for (auto g = live_.begin(); g != live_.end();) {
    if (g->begin < head_ + need && head_ < g->end) {
      check_cuda(cudaEventSynchronize(g->done), "upload ring");
      events_->put(g->done);
      g = live_.erase(g);
    } else {
      ++g;
    }
  }
  std::byte* at = static_cast<std::byte*>(base_) + head_;
  std::memcpy(at, src, bytes);
  check_cuda(cudaMemcpyAsync(dst, at, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpy to device");
  if (!events_) events_ = std::make_unique<EventPool>();
  cudaEvent_t e = events_->take();
  const cudaError_t recorded = cudaEventRecord(e, stream);
  if (recorded != cudaSuccess) events_->put(e);
  check_cuda(recorded, "cudaEventRecord (upload)");
  live_.push_back({head_, head_ + need, e});
  head_ += need;
}

void UploadRing::swap(UploadRing& o) noexcept {
  std::swap(base_, o.base_), std::swap(cap_, o.cap_), std::swap(head_, o.head_);
  live_.swap(o.live_), events_.swap(o.events_);
}

void UploadRing::grow(size_t need) {
  for (const Segment& g : live_) check_cuda(cudaEventSynchronize(g.done), "upload ring"), events_->put(g.done);
  live_.clear();
  if (base_ != nullptr) check_cuda(cudaFreeHost(base_), "cudaFreeHost (upload ring)");
  base_ = nullptr, cap_ = 0, head_ = 0;
  const size_t cap = std::max<size_t>(size_t{1} << 20, std::bit_ceil(need) * 4);
  check_cuda(cudaMallocHost(&base_, cap), "cudaMallocHost (upload ring)");
  cap_ = cap;
}

void UploadRing::release() noexcept {
  for (const Segment& g : live_) (void)cudaEventSynchronize(g.done), events_->put(g.done);
  live_.clear();
  if (base_ != nullptr) (void)cudaFreeHost(base_);
  base_ = nullptr, cap_ = 0, head_ = 0;
}

bool set_upload_ring_eager_release(bool on) { return eager_release.exchange(on); }

}  // namespace meshmuon::detail
