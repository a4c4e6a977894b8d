// Internal: how the communicators that move host memory only (mpi, single) carry device buffers:
// staged through pinned host memory of the buffers' MemorySpace (backend/memory_space.h), in rounds
// of bounded size (the mpi backend: src/comm/mpi/mpi_staging.cpp). Also the internal makers of those
// communicators with an explicit memory space.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/memory_space.h"
#include "meshmuon/comm.h"

namespace meshmuon::detail {

// How the mpi backend stages device buffers.
// - chunk_bytes: a collective moves at most this many bytes per direction per round; larger
//   collectives run as several rounds (the same rounds on every rank: they depend only on counts
//   known to every rank, the element size and chunk_bytes, which must agree, checked at creation).
//   all_to_all_v runs as per-pair send/recv pieces of at most chunk_bytes / size bytes.
// - pool_bytes: pinned buffers are kept for reuse up to this many bytes in all; beyond it a buffer
//   is freed when released. Point-to-point batches are staged whole (chunking them could deadlock
//   on a cycle of peers), so one batch larger than the pool allocates past it, then frees.
struct StagingOptions {
  size_t chunk_bytes = size_t{16} << 20;
  size_t pool_bytes = size_t{64} << 20;
};
// MESHMUON_STAGING_CHUNK_BYTES / MESHMUON_STAGING_POOL_BYTES over the defaults; std::invalid_argument for
// values that are not positive integers, chunk_bytes above 2^30 or a pool below 2 chunks.
StagingOptions staging_options_from_env();
void check_staging_options(const StagingOptions& o);

// What the pool allocates for a request of `bytes` (64-byte granules).
inline size_t pinned_block_bytes(size_t bytes) { return (bytes + 63) / 64 * 64; }

// Reusable pinned buffers of one communicator (and its Works). Not thread-safe beyond the
// communicator's own rule (one thread at a time); a mutex guards it anyway (cheap, and Works may
// be destroyed on another thread).
class PinnedPool {
 public:
  PinnedPool(std::shared_ptr<MemorySpace> space, size_t retain_bytes);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A buffer of at least `bytes` (a cached one when one fits), nullptr for 0 bytes.
  void* acquire(size_t bytes);
  void release(void* p) noexcept;

  struct Stats {
    size_t allocations = 0;    // alloc_pinned calls
    size_t held_bytes = 0;     // allocated and not freed (in use + cached)
    size_t peak_held_bytes = 0;
    size_t in_use_bytes = 0;
  };
  Stats stats() const;
  MemorySpace& space() const { return *space_; }

 private:
  struct Block {
    void* p;
    size_t bytes;
    bool in_use;
  };
  std::shared_ptr<MemorySpace> space_;
  size_t retain_bytes_;
  mutable std::mutex mu_;
  std::vector<Block> blocks_;
  Stats stats_;
};

}  // namespace meshmuon::detail

namespace meshmuon {
// The mpi backend over MPI_COMM_WORLD with an explicit memory space and staging options (tests;
// make_mpi_communicator uses default_memory_space() and staging_options_from_env()). COLLECTIVE.
// Internal (src/comm/mpi/mpi_communicator.cpp; a build without MPI throws like make_mpi_communicator).
std::unique_ptr<Communicator> make_mpi_communicator(std::shared_ptr<detail::MemorySpace> space,
                                                    detail::StagingOptions options);
// The single backend with a memory space (engines on a device backend): a copy touching the space's
// device memory goes through copy_to_host / copy_to_device; make_single_communicator() is this with
// no space (plain memmove). Internal (src/comm/single/single_communicator.cpp).
std::unique_ptr<Communicator> make_single_communicator(std::shared_ptr<detail::MemorySpace> space);
}  // namespace meshmuon
