// The mpi backend's staged path (mpi_staging.h): the per-communicator queue that keeps MPI's call
// order the same on every rank, and StagedOp's staging buffers (the operations: mpi_staged_ops.cpp).
#include "comm/mpi/mpi_staging.h"

#include <algorithm>
#include <mutex>
#include <cstring>

#include "comm/mpi/mpi_counts.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {

Staging::Staging(MPI_Comm comm, int rank, int size, std::shared_ptr<MemorySpace> space, StagingOptions options)
    : comm_(comm), rank_(rank), size_(size), space_(std::move(space)), options_(options),
      pool_(space_, options.pool_bytes) {}

namespace {
std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<std::weak_ptr<Staging>>& registry() {
  static std::vector<std::weak_ptr<Staging>> r;
  return r;
}
}  // namespace

void Staging::track(const std::shared_ptr<Staging>& s) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  std::erase_if(r, [](const std::weak_ptr<Staging>& w) { return w.expired(); });
  r.push_back(s);
}

void progress_all_staging() {
  std::vector<std::shared_ptr<Staging>> live;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (const auto& w : registry())
      if (auto s = w.lock()) live.push_back(std::move(s));
  }
  for (const auto& s : live) s->progress();
}

void Staging::add(std::shared_ptr<StagedOp> op) {
  if (op->rounds == 0) {
    op->done = true;
    return;
  }
  active_.push_back(std::move(op));
  progress_all_staging();
}

void Staging::progress() {
  bool blocked = false;  // an earlier operation has rounds left to post
  for (auto it = active_.begin(); it != active_.end();) {
    StagedOp& op = **it;
    if (op.in_flight) {
      const MpiApi& api = mpi_api();
      int flag = 0;
      MESHMUON_CHECK_MPI(api.Testall(static_cast<int>(op.requests.size()), op.requests.data(), &flag, MPI_STATUSES_IGNORE));
      if (flag) {
        op.requests.clear();
        op.in_flight = false;
        op.finish(op.posted - 1);
        if (op.posted == op.rounds) op.done = true;
      }
    }
    if (!op.done && !op.in_flight && !blocked) {
      op.in_flight = true;  // before post: a throwing post leaves no round to post again
      op.post(op.posted);
      op.posted += 1;
    }
    if (op.posted < op.rounds) blocked = true;
    if (op.done) {
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Staging::all_posted() const {
  for (const auto& op : active_)
    if (op->posted < op->rounds) return false;
  return true;
}

StagedOp::~StagedOp() { release_all(); }

void* StagedOp::take(size_t bytes) {
  void* p = s_.pool().acquire(bytes);
  if (p != nullptr) held_.push_back(p);
  return p;
}

void StagedOp::release_all() noexcept {
  for (void* p : held_) s_.pool().release(p);
  held_.clear();
}

void StagedOp::load(void* staging, const void* src, size_t bytes, bool device) {
  if (bytes == 0) return;
  if (device) {
    s_.space().copy_to_host(staging, src, bytes);
  } else {
    std::memcpy(staging, src, bytes);
  }
}

void StagedOp::store(void* dst, const void* staging, size_t bytes, bool device) {
  if (bytes == 0) return;
  if (device) {
    s_.space().copy_to_device(dst, staging, bytes);
  } else {
    std::memcpy(dst, staging, bytes);
  }
}

}  // namespace meshmuon::detail
