// Internal: the mpi backend's staged path (memory_space.h). On a communicator where any rank may
// hold device memory, every operation runs as rounds of MPI calls over pinned staging buffers:
// device buffers are copied device -> pinned before a round is posted and pinned -> device after it
// completes; host buffers go through the same staging with memcpy (one code path, and the MPI call
// schedule cannot depend on where a rank's buffers live, or ranks would post different calls).
//
// Rounds: all_reduce / broadcast in pieces of at most chunk_bytes; reduce_scatter_v / all_gather_v
// in rounds where block j moves its elements [k*P', (k+1)*P') (P' = chunk elements / size), so the
// rounds depend only on counts every rank knows; all_to_all_v as send/recv pieces per pair (tag 1;
// only the two ends of a pair need to agree on its pieces); send / recv batches staged whole in one
// round (tag 0, MPI's order per peer is the matching rule). A round's staging buffers come from the
// communicator's PinnedPool and go back when the round completes.
//
// Memory: pinned bytes in use are those of the rounds in flight: at most one round of a multi-round
// operation (the queue lets one post at a time) plus operations of one round, each within
// chunk_bytes per direction, and send / recv batches, staged whole. In-flight memory is not capped
// (a recv in flight may wait for a send posted after it: waiting for memory there could deadlock);
// the pool keeps at most pool_bytes cached between operations.
// Progress: polling any staged Work drives the queues of every staged communicator of the process
// (as MPI_Test progresses every request), so waiting on one communicator never starves another's
// later rounds that a peer waits for.
//
// Order: MPI needs collectives posted in the same order on every rank, and p2p pieces on one tag in
// the same order at both ends. An operation posts round k+1 only after round k completed, so each
// communicator keeps its unfinished operations in call order and lets one post only once every
// earlier one has posted its last round. Any Work's test() drives the whole queue.
#pragma once

#include <list>
#include <memory>
#include <string>
#include <vector>

#include "comm/staging.h"
#include "comm/mpi/mpi_runtime.h"

namespace meshmuon::detail {

class StagedOp;

// Per communicator (shared with its Works, so that leaked Works keep the pool alive).
class Staging {
 public:
  Staging(MPI_Comm comm, int rank, int size, std::shared_ptr<MemorySpace> space, StagingOptions options);

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  MemorySpace& space() { return *space_; }
  const std::shared_ptr<MemorySpace>& space_ptr() const { return space_; }
  PinnedPool& pool() { return pool_; }
  const StagingOptions& options() const { return options_; }

  // Appends an operation (call order) and drives every queue once.
  void add(std::shared_ptr<StagedOp> op);
  // Tests what is in flight, finishes completed rounds, posts what may be posted. Throws on MPI errors.
  void progress();

  // True when every queued operation has posted its last round (nothing waits to be posted).
  bool all_posted() const;

  // Registers a staging (weakly) for progress_all_staging.
  static void track(const std::shared_ptr<Staging>& s);

 private:
  MPI_Comm comm_;
  int rank_, size_;
  std::shared_ptr<MemorySpace> space_;
  StagingOptions options_;
  PinnedPool pool_;
  std::list<std::shared_ptr<StagedOp>> active_;  // unfinished, in call order
};

// One operation as rounds of MPI calls.
class StagedOp {
 public:
  explicit StagedOp(Staging& s) : s_(s) {}
  virtual ~StagedOp();
  StagedOp(const StagedOp&) = delete;
  StagedOp& operator=(const StagedOp&) = delete;

  int rounds = 1;   // 0: nothing to post (complete when added)
  int posted = 0;   // rounds posted so far
  bool in_flight = false;
  bool done = false;
  std::vector<MPI_Request> requests;

  // Copies round k's inputs into staging and posts its MPI calls (adding to `requests`).
  virtual void post(int k) = 0;
  // Round k completed: copies its outputs out of staging and releases its buffers.
  virtual void finish(int k) = 0;

 protected:
  const MpiApi& api = mpi_api();  // libmpi's table (mpi_api.h)
  MPI_Request* add_request() { return &requests.emplace_back(api.REQUEST_NULL); }
  void* take(size_t bytes);  // a staging buffer for this round (released by release_all)
  void release_all() noexcept;
  // Copies between a caller buffer (device or host, as `device` says) and staging.
  void load(void* staging, const void* src, size_t bytes, bool device);
  void store(void* dst, const void* staging, size_t bytes, bool device);

  Staging& s_;
  std::vector<void*> held_;
};

// Drives the queues of every live staged communicator once (StagedWork::poll).
void progress_all_staging();

// The staged operations (mpi_staging.cpp). Arguments are validated by the Communicator base.
std::shared_ptr<StagedOp> staged_all_to_all_v(Staging& s, InBuffer send, std::span<const int64_t> send_counts,
                                              std::span<const int64_t> send_displs, OutBuffer recv,
                                              std::span<const int64_t> recv_counts,
                                              std::span<const int64_t> recv_displs);
std::shared_ptr<StagedOp> staged_all_gather_v(Staging& s, InBuffer send, OutBuffer recv,
                                              std::span<const int64_t> recv_counts,
                                              std::span<const int64_t> recv_displs);
std::shared_ptr<StagedOp> staged_reduce_scatter_v(Staging& s, InBuffer send, OutBuffer recv,
                                                  std::span<const int64_t> recv_counts, ReduceOp op);
std::shared_ptr<StagedOp> staged_all_reduce(Staging& s, InBuffer send, OutBuffer recv, ReduceOp op);
std::shared_ptr<StagedOp> staged_broadcast(Staging& s, OutBuffer buf, int root);
std::shared_ptr<StagedOp> staged_barrier(Staging& s);
std::shared_ptr<StagedOp> staged_p2p(Staging& s, std::span<const P2pOp> ops);

}  // namespace meshmuon::detail
