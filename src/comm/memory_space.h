// Internal: where a communicator's buffers live, for backends that can only move host memory (the
// mpi backend on a machine with GPUs: several ranks may share one GPU, which NCCL refuses).
//
// A MemorySpace answers "is this pointer device memory?" and copies between device memory and
// pinned host memory it allocates. The mpi backend consults one per communicator and stages every
// device buffer through a bounded pool of pinned buffers (src/comm/mpi/mpi_staging.cpp). The real
// one is cudart's (src/comm/cuda_memory_space.cpp, CUDA builds with a device); the host one says no
// pointer is device memory; tests supply their own (tests/dist/comm_staging_test.cpp marks ranges
// of an inaccessible mapping as "device", so MPI touching them directly would fault).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "dmuon/comm.h"

namespace dmuon::detail {

class MemorySpace {
 public:
  virtual ~MemorySpace();
  virtual std::string_view name() const = 0;  // "host", "cuda", or a test's name
  // True when some pointer may be device memory in this process (a device is present). A
  // communicator stages when this is true on any of its ranks (agreed at creation).
  virtual bool has_devices() const = 0;
  // True when [p, p + bytes) is device memory that MPI must not touch. Never throws.
  virtual bool is_device(const void* p) const = 0;
  // Pinned (page-locked) host memory for staging; free_pinned never throws.
  virtual void* alloc_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* p) noexcept = 0;
  // Synchronous copies: when they return the destination holds the data.
  virtual void copy_to_host(void* host, const void* device, size_t bytes) = 0;
  virtual void copy_to_device(void* device, const void* host, size_t bytes) = 0;
};

// No device memory: is_device is always false, pinned memory is plain aligned heap memory.
std::shared_ptr<MemorySpace> host_memory_space();
// cudart's in a CUDA build when a device is visible, else the host one. A failing device probe
// (no driver, no device) gives the host one: CPU-only runs never notice CUDA.
std::shared_ptr<MemorySpace> default_memory_space();
// Waits on the host until the device work recorded in `e` has run (cudaEventSynchronize; an empty
// event returns at once): Communicator::order_after for backends that cannot wait on the device.
// dmuon::Error "[<who>] ..." on a device error, or a non-empty event in a build without CUDA.
void wait_on_host(DeviceEvent e, std::string_view who);
#ifdef DMUON_HAVE_CUDA
// nullptr when no CUDA device is usable (src/comm/cuda_memory_space.cpp).
std::shared_ptr<MemorySpace> cuda_memory_space();
#endif

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
// DMUON_STAGING_CHUNK_BYTES / DMUON_STAGING_POOL_BYTES over the defaults; std::invalid_argument for
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

}  // namespace dmuon::detail

namespace dmuon {
// The mpi backend over MPI_COMM_WORLD with an explicit memory space and staging options (tests;
// make_mpi_communicator uses default_memory_space() and staging_options_from_env()). COLLECTIVE.
// Internal (src/comm/mpi/mpi_communicator.cpp; a build without MPI throws like make_mpi_communicator).
std::unique_ptr<Communicator> make_mpi_communicator(std::shared_ptr<detail::MemorySpace> space,
                                                    detail::StagingOptions options);
// The single backend with a memory space (engines on a device backend): a copy touching the space's
// device memory goes through copy_to_host / copy_to_device; make_single_communicator() is this with
// no space (plain memmove). Internal (src/comm/single/single_communicator.cpp).
std::unique_ptr<Communicator> make_single_communicator(std::shared_ptr<detail::MemorySpace> space);
}  // namespace dmuon
