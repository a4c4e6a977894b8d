// Transports: what moves a Communicator's data. Every backend is one (single, mpi with its staged
// path, nccl, and an application's own: meshmuon.torch's c10d transport over a torch.distributed
// ProcessGroup). The Communicator (comm.h) does everything else once, over any transport: argument
// validation, byte counters, p2p groups, the deadline of every wait (timeout errors name world rank,
// op, label and communicator), the broken-after-timeout state of a root and its splits, and the
// agreement that precedes a split.
//
// Transport contract (what the Communicator calls):
// - Each operation is called with ALREADY-VALIDATED arguments in the Communicator's vocabulary
//   (element counts and displacements of the buffer type, one entry per rank of this transport,
//   ranks numbered as in this communicator) and POSTS it without blocking; it returns an op handle
//   whose test() is non-blocking, or nullptr when the operation already completed during the call.
//   Semantics (reductions included) are those of comm.h: max / min exact, integer sums wrapping,
//   bf16 sums rounded to bf16 after each addition.
// - test() returns true once receive buffers are written and send buffers are free; it is polled
//   (never concurrently) until then, from the thread that drives the communicator. A failure throws
//   (any std::exception): the communicator rethrows it as meshmuon::Error naming rank, op and label.
// - After a wait on any communicator of the same root timed out (and its op's on_timeout() said that
//   breaks communication), or while usable() is false, the communicator posts nothing more
//   (meshmuon::Error "communication is unusable") and destroys unfinished ops without waiting; the
//   transport's on_timeout() is told once per root.
// - split() is called by every rank of the transport after the communicator has all-gathered every
//   rank's (color, key) through this transport under the deadline (so every rank is known to have
//   arrived): it returns the transport of this rank's group (members ordered by (key, rank);
//   color < 0: nullptr) and may block.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "meshmuon/comm.h"
#include "meshmuon/export.h"

namespace meshmuon {

// One operation a transport posted.
class MESHMUON_API TransportOp {
 public:
  virtual ~TransportOp();
  // Non-blocking: true when complete. Throws on failure.
  virtual bool test() = 0;
  // A wait on this op passed its deadline (called before the error is thrown). Returns whether
  // communication is now unusable (default): the root communicator is then marked broken and the
  // transport told. False where a timeout harms nothing else (the single backend's unmatched send).
  virtual bool on_timeout() { return true; }
  // Whether destroying the op unfinished may first wait for it (default timeout): false where no
  // one else can complete it (the single backend's unmatched send, one rank, one thread).
  virtual bool destructor_may_wait() const { return true; }
  // Called when the op is destroyed unfinished without having been waited for: true when the
  // transport has let go of the buffers (the op is then freed), false to leak it on purpose (MPI or
  // NCCL may still read or write through it; the job is ending anyway).
  virtual bool abandon() { return false; }
};

class MESHMUON_API Transport {
 public:
  virtual ~Transport();
  // The communicator's backend() and the "[name]" prefix of its errors: "single", "mpi", "nccl", "c10d".
  virtual std::string_view backend() const = 0;
  // True when every operation accepts device memory (Communicator::device_buffers); false by
  // default: a transport that moves host memory only (c10d over gloo).
  virtual bool device_buffers() const { return false; }
  // False once the transport refuses new operations for a reason of its own (mpi: a collective timed
  // out somewhere in the process); the communicator then refuses them with its usual message.
  virtual bool usable() const { return true; }

  using Counts = std::span<const int64_t>;
  virtual std::unique_ptr<TransportOp> all_to_all_v(InBuffer send, Counts send_counts, Counts send_displs, OutBuffer recv,
                                                    Counts recv_counts, Counts recv_displs) = 0;
  virtual std::unique_ptr<TransportOp> all_gather_v(InBuffer send, OutBuffer recv, Counts recv_counts,
                                                    Counts recv_displs) = 0;
  // send holds size blocks packed in rank order (block j: recv_counts[j] elements); recv gets block rank's reduction.
  virtual std::unique_ptr<TransportOp> reduce_scatter_v(InBuffer send, OutBuffer recv, Counts recv_counts,
                                                        ReduceOp op) = 0;
  // send.data == recv.data: in place.
  virtual std::unique_ptr<TransportOp> all_reduce(InBuffer send, OutBuffer recv, ReduceOp op) = 0;
  virtual std::unique_ptr<TransportOp> broadcast(OutBuffer buf, int root) = 0;
  virtual std::unique_ptr<TransportOp> barrier() = 0;
  // At least one op, posted in order (comm.h's matching rule: the i-th send a->b meets the i-th recv
  // on b from a); peer == own rank is a local copy through the same matching.
  virtual std::unique_ptr<TransportOp> p2p(std::span<const P2pOp> ops) = 0;
  // colors[i], keys[i]: rank i's arguments (colors < 0 already mapped to -1). See the contract above.
  virtual std::shared_ptr<Transport> split(std::span<const int> colors, std::span<const int> keys,
                                           const std::string& name) = 0;
  // A wait on this transport (or one split from the same root) passed its deadline.
  virtual void on_timeout() {}
  // Communicator::order_after: operations posted after this call wait for `event` (DeviceEvent::handle:
  // the device API's event recorded by the engine's backend, never null here; valid during the call
  // only: it is pooled and recorded again later, so wait for it now, never keep it). Default: a host
  // wait for it through the process's memory space (MemorySpace::wait_on_host); a transport that
  // posts on a device stream of its own makes that stream wait instead (nccl). A failure may throw
  // any std::exception (rethrown as meshmuon::Error).
  virtual void order_after(void* event);
};

// A communicator of `size` ranks (this one is `rank`) over `transport`, named `name` ("world" for
// the job's); `world_rank` (default: rank) is the rank its errors name. Makes no call on the
// transport. std::invalid_argument for a null transport or rank outside [0, size).
MESHMUON_API std::unique_ptr<Communicator> make_communicator(std::shared_ptr<Transport> transport, int rank, int size,
                                                          std::string name = "world", int world_rank = -1);

}  // namespace meshmuon
