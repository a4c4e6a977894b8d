// Staging options and the pinned pool (staging.h).
#include "comm/staging.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "meshmuon/error.h"

namespace meshmuon::detail {
namespace {

size_t env_bytes(const char* name, size_t fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(env, &end, 10);
  MESHMUON_CHECK(end != env && *end == '\0' && v > 0 && env[0] != '-', "[comm] ", name, "='", env,
              "' is not a positive number of bytes; unset it for the default (", fallback, ")");
  return static_cast<size_t>(v);
}

}  // namespace

void check_staging_options(const StagingOptions& o) {
  MESHMUON_CHECK(o.chunk_bytes >= 8 && o.chunk_bytes <= (size_t{1} << 30), "[comm] staging chunk of ", o.chunk_bytes,
              " bytes is outside [8, 2^30]");
  MESHMUON_CHECK(o.pool_bytes >= 2 * o.chunk_bytes, "[comm] staging pool of ", o.pool_bytes,
              " bytes is smaller than two chunks (", o.chunk_bytes, " bytes each)");
}

StagingOptions staging_options_from_env() {
  StagingOptions o;
  o.chunk_bytes = env_bytes("MESHMUON_STAGING_CHUNK_BYTES", o.chunk_bytes);
  o.pool_bytes = env_bytes("MESHMUON_STAGING_POOL_BYTES", std::max(o.pool_bytes, 2 * o.chunk_bytes));
  check_staging_options(o);
  return o;
}

PinnedPool::PinnedPool(std::shared_ptr<MemorySpace> space, size_t retain_bytes)
    : space_(std::move(space)), retain_bytes_(retain_bytes) {}

PinnedPool::~PinnedPool() {
  for (const Block& b : blocks_) space_->free_pinned(b.p);
}

void* PinnedPool::acquire(size_t bytes) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  Block* best = nullptr;
  for (Block& b : blocks_)
    if (!b.in_use && b.bytes >= bytes && (best == nullptr || b.bytes < best->bytes)) best = &b;
  if (best == nullptr) {
    // Free cached blocks too small to serve this request while the new one would exceed the bound.
    for (auto it = blocks_.begin(); it != blocks_.end() && stats_.held_bytes + bytes > retain_bytes_;) {
      if (it->in_use) {
        ++it;
        continue;
      }
      space_->free_pinned(it->p);
      stats_.held_bytes -= it->bytes;
      it = blocks_.erase(it);
    }
    const size_t size = pinned_block_bytes(bytes);
    void* p = space_->alloc_pinned(size);
    blocks_.push_back({p, size, false});
    stats_.allocations += 1;
    stats_.held_bytes += size;
    stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, stats_.held_bytes);
    best = &blocks_.back();
  }
  best->in_use = true;
  stats_.in_use_bytes += best->bytes;
  return best->p;
}

void PinnedPool::release(void* p) noexcept {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
    if (it->p != p) continue;
    it->in_use = false;
    stats_.in_use_bytes -= it->bytes;
    if (stats_.held_bytes > retain_bytes_) {  // over the bound (a large p2p batch): give it back
      space_->free_pinned(it->p);
      stats_.held_bytes -= it->bytes;
      blocks_.erase(it);
    }
    return;
  }
}

PinnedPool::Stats PinnedPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace meshmuon::detail
