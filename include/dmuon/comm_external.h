// External communicator: a dmuon::Communicator whose operations are carried by a transport the
// application supplies (dmuon.torch's c10d transport over a torch.distributed ProcessGroup: gloo on
// CPU, NCCL later). The Communicator base still validates every call, counts bytes, applies the
// deadline of every wait (timeout errors name world rank, op, label and communicator) and collects
// p2p groups exactly as for the mpi backend; the transport only moves data.
//
// Transport contract (what make_external_communicator's communicator calls):
// - Each operation is called with ALREADY-VALIDATED arguments in the Communicator's vocabulary
//   (element counts and displacements of the buffer type, one entry per rank of this transport,
//   ranks numbered as in this communicator) and POSTS it without blocking; it returns an op handle
//   whose test() is non-blocking, or nullptr when the operation already completed during the call.
//   Semantics (reductions included) are those of comm.h: max / min exact, integer sums wrapping,
//   bf16 sums rounded to bf16 after each addition.
// - test() returns true once receive buffers are written and send buffers are free; it is polled
//   (never concurrently) until then, from the thread that drives the communicator. A failure throws
//   (any std::exception): the communicator rethrows it as dmuon::Error naming rank, op and label.
// - After a wait on any communicator of the same root timed out, the communicator posts nothing
//   more (dmuon::Error "communication is unusable") and destroys unfinished ops without waiting;
//   on_timeout() tells the transport once.
// - split() is called by every rank of the transport after the communicator has all-gathered every
//   rank's (color, key) under the deadline (so every rank is known to have arrived): it returns the
//   transport of this rank's group (members ordered by (key, rank); color < 0: nullptr) and may block.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "dmuon/comm.h"
#include "dmuon/export.h"

namespace dmuon {

// One operation a transport posted.
class DMUON_API ExternalOp {
 public:
  virtual ~ExternalOp();
  // Non-blocking: true when complete. Throws on failure.
  virtual bool test() = 0;
};

// One send or recv of a p2p batch, in this communicator's ranks. A recv writes through buf.data.
struct ExternalP2p {
  bool is_send = false;
  int peer = 0;
  InBuffer buf;
};

class DMUON_API ExternalTransport {
 public:
  virtual ~ExternalTransport();

  // The communicator's backend() and the "[name]" prefix of its errors, e.g. "c10d".
  virtual std::string_view backend() const = 0;
  // True when every operation accepts device (CUDA) memory (Communicator::device_buffers); false by
  // default: a transport that moves host memory only (c10d over gloo).
  virtual bool device_buffers() const { return false; }

  using Counts = std::span<const int64_t>;
  virtual std::unique_ptr<ExternalOp> all_to_all_v(InBuffer send, Counts send_counts, Counts send_displs, OutBuffer recv,
                                                   Counts recv_counts, Counts recv_displs) = 0;
  virtual std::unique_ptr<ExternalOp> all_gather_v(InBuffer send, OutBuffer recv, Counts recv_counts, Counts recv_displs) = 0;
  // send holds size blocks packed in rank order (block j: recv_counts[j] elements); recv gets block rank's reduction.
  virtual std::unique_ptr<ExternalOp> reduce_scatter_v(InBuffer send, OutBuffer recv, Counts recv_counts, ReduceOp op) = 0;
  // send.data == recv.data: in place.
  virtual std::unique_ptr<ExternalOp> all_reduce(InBuffer send, OutBuffer recv, ReduceOp op) = 0;
  virtual std::unique_ptr<ExternalOp> broadcast(OutBuffer buf, int root) = 0;
  virtual std::unique_ptr<ExternalOp> barrier() = 0;
  // At least one op, posted in order (comm.h's matching rule: the i-th send a->b meets the i-th recv
  // on b from a); peer == own rank is a local copy through the same matching.
  virtual std::unique_ptr<ExternalOp> p2p(std::span<const ExternalP2p> ops) = 0;
  // colors[i], keys[i]: rank i's arguments (colors < 0 already mapped to -1). See the contract above.
  virtual std::shared_ptr<ExternalTransport> split(std::span<const int> colors, std::span<const int> keys,
                                                   const std::string& name) = 0;
  // A wait on this transport (or one split from the same root) passed its deadline.
  virtual void on_timeout() {}
  // Communicator::order_after: operations posted after this call wait for `cuda_event` (a recorded
  // cudaEvent_t, never null here; valid during the call only: it is pooled and recorded again later,
  // so wait for it now, e.g. cudaStreamWaitEvent, never keep it). Default: a host wait for it
  // (cudaEventSynchronize); a transport that posts on a CUDA stream of its own makes that stream
  // wait instead (nccl). A failure may throw any std::exception (rethrown as dmuon::Error).
  virtual void order_after(void* cuda_event);
};

// A communicator of `size` ranks (this one is `rank`) over `transport`, named `name` ("world" for
// the job's); `world_rank` (default: rank) is the rank its errors name. Makes no call on the
// transport. std::invalid_argument for a null transport or rank outside [0, size).
DMUON_API std::unique_ptr<Communicator> make_external_communicator(std::shared_ptr<ExternalTransport> transport, int rank,
                                                                   int size, std::string name = "world",
                                                                   int world_rank = -1);

}  // namespace dmuon
