// Communicator: asynchronous collectives over a group of ranks, returning Work handles with deadlines.
// Backends (each a Transport under the one Communicator: meshmuon/comm_transport.h): `single` (size 1,
// always built), `mpi` (Open MPI non-blocking collectives; a build without MPI throws from
// make_mpi_communicator; device buffers are staged through pinned host memory, so several ranks may
// share one GPU), `nccl` (meshmuon/comm_nccl.h) and an application's own transport (e.g. "c10d" over a
// torch.distributed ProcessGroup, same contract). Layers above never see MPI.
//
// Contract for every collective below (unless it says otherwise):
// - COLLECTIVE: all ranks of this communicator must call it, in the same order, with matching
//   counts (what rank i sends to j equals what j expects from i). Mismatches are the caller's bug
//   and cannot be detected locally: a rank that skips a collective makes the others time out; j
//   expecting fewer elements than i sends is an MPI error (meshmuon::Error); expecting more leaves the
//   tail of that block unwritten. Receive blocks must not overlap each other.
// - BUFFERS: the caller keeps send and receive buffers alive and untouched until the returned Work
//   completes (wait() returned or test() returned true). Send and receive buffers must not overlap,
//   except all_reduce, where send == recv exactly means in place. Counts and displacements are in
//   ELEMENTS of the buffer type; the arrays passed in may be freed right after the call (copied).
// - DEVICE BUFFERS (mpi): where any rank may hold CUDA memory (agreed when the communicator is
//   made), every operation stages through pinned host memory: copies device -> pinned before and
//   pinned -> device after, collectives in rounds of MESHMUON_STAGING_CHUNK_BYTES (default 16 MiB; must
//   be the same on every rank), pinned buffers cached up to MESHMUON_STAGING_POOL_BYTES (64 MiB).
//   Device buffers must hold their data when the call is made, or be ordered with order_after().
// - DEVICE ORDER: order_after(event) makes the operations posted after it read their buffers only
//   once the device work recorded in `event` (a cudaEvent_t on the stream that writes them) has run:
//   nccl makes its stream wait for the event on the device (the host does not wait); mpi staging,
//   single and host transports wait for it on the host at that call. A writer that synchronizes
//   its stream before posting needs none.
// - VALIDATION: wrong-sized count arrays, negative counts, a count past the end of a buffer, type
//   mismatch between send and receive, overlap, or a self-block that does not match (rank r sends
//   to itself a different count than it expects from itself) throw std::invalid_argument before
//   any communication is posted.
// - THREADS: one thread at a time may call a communicator and its Works (MPI_THREAD_SERIALIZED).
//   Intended use: the thread that drives the step makes every call, compute threads never do.
//   Open MPI progresses non-blocking collectives only inside MPI calls, so for overlap the driving
//   thread calls test() on outstanding Works between compute slices. wait() spins ~50 us, then
//   yields, then sleeps at most 200 us between polls (oversubscribed ranks leave the core to peers).
// - DEADLINES: every wait has one. wait() uses the communicator's default timeout, counted from the
//   call to wait(); it is MESHMUON_TIMEOUT_S (seconds, default 300) when the communicator was made.
//   On timeout wait() throws meshmuon::Error naming the world rank, collective, label and communicator:
//   "[mpi] rank 2: all_to_all 'chunk 3 gather' timed out after 30 s on communicator 'world' ...".
//   After a timeout the MPI state of the process is unusable: later collectives on any mpi
//   communicator throw meshmuon::Error. The job must end through meshmuon::abort_all (the CLI does).
// - COUNTERS: see CommCounters and the comm_bytes_* predictors (the planner uses the same ones).
// - LIMITS: counts are size_t / int64_t here; a backend that cannot address a count (MPI's are C
//   ints) splits the operation where it can and otherwise throws std::invalid_argument "[mpi] ..."
//   (mpi: reduce_scatter over 2^31-1 elements in all; all_to_all_v / all_gather_v whose counts and
//   displacements above it share no factor that brings them under it).
// - POINT-TO-POINT (send/recv, groups) is not collective: see the contract above send().
// - REDUCTIONS: max and min are exact. Integer sums are exact (wrap on overflow). fp32/bf16 sums
//   are exact while every partial sum is representable (integer-valued data in tests); otherwise
//   the summation order is the MPI library's and may change with rank count and message size.
//   bf16 sums round to bf16 after each addition. For bitwise layout-invariance use data movement
//   (all_to_all, all_gather) and reduce locally in a fixed order.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "meshmuon/dtype.h"
#include "meshmuon/device.h"
#include "meshmuon/export.h"
#include "meshmuon/tensor.h"

namespace meshmuon {

// Element types a collective moves. F32 / BF16 are the DType values; integers for flags, counts
// and fingerprints; U8 for raw bytes.
enum class CommType : uint8_t { F32, BF16, I32, I64, U64, U8 };
MESHMUON_API std::string_view to_string(CommType t);  // "fp32", "bf16", "int32", "int64", "uint64", "uint8"
MESHMUON_API size_t comm_type_size(CommType t);
constexpr CommType comm_type(DType t) { return t == DType::F32 ? CommType::F32 : CommType::BF16; }

template <class T> struct CommTypeOf;
template <> struct CommTypeOf<float> { static constexpr CommType value = CommType::F32; };
template <> struct CommTypeOf<BFloat16> { static constexpr CommType value = CommType::BF16; };
template <> struct CommTypeOf<int32_t> { static constexpr CommType value = CommType::I32; };
template <> struct CommTypeOf<int64_t> { static constexpr CommType value = CommType::I64; };
template <> struct CommTypeOf<uint64_t> { static constexpr CommType value = CommType::U64; };
template <> struct CommTypeOf<uint8_t> { static constexpr CommType value = CommType::U8; };
template <> struct CommTypeOf<std::byte> { static constexpr CommType value = CommType::U8; };

// Sum, Max, Min. "any" of boolean flags is Max over 0/1 integers; "all" is Min.
enum class ReduceOp : uint8_t { Sum, Max, Min };
MESHMUON_API std::string_view to_string(ReduceOp op);  // "sum", "max", "min"

// A buffer a collective reads: pointer, element type, element count. Does not own memory.
struct MESHMUON_API InBuffer {
  const void* data = nullptr;
  CommType type = CommType::F32;
  size_t count = 0;

  InBuffer() = default;
  InBuffer(const void* d, CommType t, size_t n) : data(d), type(t), count(n) {}
  template <class T>
  InBuffer(std::span<T> s) : InBuffer(s.data(), CommTypeOf<std::remove_const_t<T>>::value, s.size()) {}
  template <class T> InBuffer(const std::vector<T>& v) : InBuffer(v.data(), CommTypeOf<T>::value, v.size()) {}
  // Throws std::invalid_argument unless the view is contiguous.
  explicit InBuffer(const TensorView& view);
  size_t nbytes() const { return count * comm_type_size(type); }
};

// A buffer a collective writes. Does not own memory.
struct MESHMUON_API OutBuffer {
  void* data = nullptr;
  CommType type = CommType::F32;
  size_t count = 0;

  OutBuffer() = default;
  OutBuffer(void* d, CommType t, size_t n) : data(d), type(t), count(n) {}
  template <class T> OutBuffer(std::span<T> s) : OutBuffer(s.data(), CommTypeOf<T>::value, s.size()) {}
  template <class T> OutBuffer(std::vector<T>& v) : OutBuffer(v.data(), CommTypeOf<T>::value, v.size()) {}
  explicit OutBuffer(const TensorView& view);
  size_t nbytes() const { return count * comm_type_size(type); }
  InBuffer as_input() const { return InBuffer(data, type, count); }
};

using CommClock = std::chrono::steady_clock;
using Deadline = CommClock::time_point;

class Work;
class Transport;    // what moves a communicator's data (meshmuon/comm_transport.h)
class TransportOp;  // one operation a transport posted
namespace detail {
class WorkImpl;  // one posted operation: its transport op and how to name it (src/comm/work_impl.h)
struct CommRoot;  // what a root communicator and its splits share (src/comm/work_impl.h)
bool poll_work(Work& w, std::chrono::steady_clock::time_point posted, std::chrono::milliseconds timeout);  // src/comm/poll.h
}  // namespace detail

// One validated send or recv as a transport posts it. A recv writes through buf.data (a send only reads).
struct P2pOp {
  bool is_send = false;
  int peer = 0;
  InBuffer buf;
};

// Handle to one posted collective (c10d style). Move-only; collectives return it [[nodiscard]]. A default-constructed Work is complete.
// Destroying an unfinished Work waits for it with the default timeout (buffers stay valid for MPI);
// after a timeout anywhere in the process it does not wait (the job must be aborted anyway). On the
// single backend an unmatched send/recv is withdrawn instead (no other rank could complete it).
class MESHMUON_API Work {
 public:
  Work();
  explicit Work(std::unique_ptr<detail::WorkImpl> impl);
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;
  ~Work();

  // Non-blocking: drives progress once; true when the collective has completed (then buffers are
  // free). Never times out. Throws meshmuon::Error on an MPI failure.
  bool test();
  // Blocks until complete or until the deadline, then throws meshmuon::Error (message above).
  // A Work that timed out may be waited again (it stays posted), but the process stays marked
  // as broken for new collectives.
  void wait();                                // communicator's default timeout, from now
  void wait(std::chrono::milliseconds timeout);
  void wait(Deadline deadline);

  bool completed() const;          // true after test()/wait() saw completion (or default-constructed)
  std::string_view op() const;     // "all_to_all", ..., "" for a default-constructed Work
  std::string_view label() const;

 private:
  friend bool detail::poll_work(Work&, CommClock::time_point, std::chrono::milliseconds);
  void wait_until(Deadline deadline, std::chrono::milliseconds budget);  // budget: for the message
  std::unique_ptr<detail::WorkImpl> impl_;
};

// Payload this rank exchanges with OTHER ranks (self-copies excluded), in bytes, as defined by the
// collective's logical data movement, not by the wire algorithm MPI picks:
// - all_to_all_v: sent = sum over peers j != r of send_counts[j]; recv = sum over j != r of recv_counts[j].
// - all_gather_v: sent = counts[r] * (size - 1); recv = sum over j != r of counts[j].
// - reduce_scatter_v: sent = sum over j != r of counts[j]; recv = counts[r] * (size - 1).
// - all_reduce of n elements = reduce_scatter_v then all_gather_v over the balanced split
//   (block j has n / size elements, plus one for j < n % size): sent = recv = (n - b_r) + (size - 1) * b_r.
// - broadcast of n elements: the root sends n * (size - 1); every other rank receives n.
// - barrier and split: 0 bytes.
// All multiplied by the element size. A size-1 communicator always counts 0 bytes.
struct ByteCount {
  uint64_t sent = 0;
  uint64_t recv = 0;
};
MESHMUON_API ByteCount comm_bytes_all_to_all_v(int rank, std::span<const int64_t> send_counts,
                                            std::span<const int64_t> recv_counts, size_t elem_size);
MESHMUON_API ByteCount comm_bytes_all_gather_v(int rank, std::span<const int64_t> counts, size_t elem_size);
MESHMUON_API ByteCount comm_bytes_reduce_scatter_v(int rank, std::span<const int64_t> counts, size_t elem_size);
MESHMUON_API ByteCount comm_bytes_all_reduce(int rank, int size, int64_t count, size_t elem_size);
MESHMUON_API ByteCount comm_bytes_broadcast(int rank, int size, int root, int64_t count, size_t elem_size);
// The balanced split used by all_reduce accounting: block sizes for `count` elements over `size`.
MESHMUON_API std::vector<int64_t> balanced_counts(int64_t count, int size);
// Exclusive prefix sums: displacements of blocks packed back to back.
MESHMUON_API std::vector<int64_t> packed_displs(std::span<const int64_t> counts);

// Point-to-point: a send of `count` elements to `peer` counts as sent, a recv from `peer` as
// received; 0 when peer == rank (a self-copy). A group counts the sum of its sends and recvs.
MESHMUON_API ByteCount comm_bytes_send(int rank, int peer, int64_t count, size_t elem_size);
MESHMUON_API ByteCount comm_bytes_recv(int rank, int peer, int64_t count, size_t elem_size);

// Per communicator, summed over the collectives posted on it since creation or reset_counters()
// (counted when posted). Sub-communicators count separately; split() itself is not counted.
// Point-to-point counts as one "collective" per ungrouped send or recv and one per group_end
// (an empty group included), when posted; sends and recvs inside a group count at group_end.
struct CommCounters {
  uint64_t bytes_sent = 0;
  uint64_t bytes_recv = 0;
  uint64_t collectives = 0;
};

// One communicator: this validation, counting, grouping and waiting, over one Transport (every
// backend is a transport: meshmuon/comm_transport.h). Made by the make_*_communicator functions.
class MESHMUON_API Communicator {
 public:
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string_view backend() const;  // "single" | "mpi" | "nccl" | an application transport's ("c10d")
  // True when every operation accepts device (CUDA) memory as its buffers: nccl; mpi where it stages
  // through pinned memory (a device was visible on some rank when it was made); single made for a
  // device (make_single_communicator("cuda")); an external transport that says so. Inherited by
  // split(). An engine whose buffers live on a device (OptimizerOptions::device "cuda") refuses a
  // communicator without it: the host would dereference device memory.
  bool device_buffers() const;
  const std::string& name() const { return name_; }  // "world", or the name given to split()

  // Variable all-to-all: block j of send (send_displs[j], send_counts[j]) goes to rank j and lands
  // in rank j's recv at recv_displs[r]. All four arrays have size() entries.
  [[nodiscard]] Work all_to_all_v(InBuffer send, std::span<const int64_t> send_counts, std::span<const int64_t> send_displs,
                    OutBuffer recv, std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                    std::string_view label);
  // Equal blocks: send.count == recv.count, a multiple of size(); block j of send goes to rank j.
  [[nodiscard]] Work all_to_all(InBuffer send, OutBuffer recv, std::string_view label);

  // Variable all-gather: rank j's send (send.count == recv_counts[j]) lands at recv_displs[j].
  [[nodiscard]] Work all_gather_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts,
                    std::span<const int64_t> recv_displs, std::string_view label);
  // Same, blocks packed back to back in rank order.
  [[nodiscard]] Work all_gather_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts, std::string_view label);
  // Equal blocks: recv.count == size() * send.count.
  [[nodiscard]] Work all_gather(InBuffer send, OutBuffer recv, std::string_view label);

  // send holds size() blocks packed in rank order (block j has recv_counts[j] elements); rank r
  // receives the reduction over ranks of block r (recv.count >= recv_counts[r]).
  [[nodiscard]] Work reduce_scatter_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts, ReduceOp op,
                        std::string_view label);
  // Equal blocks: send.count == size() * recv.count.
  [[nodiscard]] Work reduce_scatter(InBuffer send, OutBuffer recv, ReduceOp op, std::string_view label);

  // Element-wise reduction over ranks; send.count == recv.count; send.data == recv.data is in place.
  [[nodiscard]] Work all_reduce(InBuffer send, OutBuffer recv, ReduceOp op, std::string_view label);
  [[nodiscard]] Work all_reduce(OutBuffer inout, ReduceOp op, std::string_view label);

  // buf on `root` is copied into buf on every rank (same count everywhere).
  [[nodiscard]] Work broadcast(OutBuffer buf, int root, std::string_view label);
  [[nodiscard]] Work barrier(std::string_view label);

  // Point-to-point (NCCL's vocabulary; not collective: only the two ends call). MATCHING: the i-th
  // send from rank a to rank b matches the i-th recv on b from a, counting in the order the ops are
  // posted on this communicator (ungrouped: at the call; grouped: at group_end, in call order).
  // Collectives and other communicators never match them. Both ends pass the same count and type:
  // a larger send than recv fails the wait (meshmuon::Error), a smaller one leaves the tail unwritten.
  // peer == rank() is a local copy through the same matching (post both before waiting on a send:
  // like MPI, a send may stay incomplete until its recv is posted; a group needs no such care).
  // VALIDATION (std::invalid_argument before posting): peer outside [0, size()), a null buffer
  // with a nonzero count. In an open group the rejected op is not added and the group stays open.
  // GROUPED (between group_begin and group_end) the op is only collected: the Work returned is a
  // default (complete) one and must not be used to wait; the group's Work from group_end is.
  // BUFFERS, THREADS, DEADLINES as for collectives; timeouts name the op "send", "recv" or "group".
  [[nodiscard]] Work send(InBuffer buf, int peer, std::string_view label);
  [[nodiscard]] Work recv(OutBuffer buf, int peer, std::string_view label);

  // Opens a group (ncclGroupStart): sends and recvs are collected until group_end. Local. Throws
  // std::invalid_argument when a group is already open (no nesting). While a group is open every
  // collective and split throws std::invalid_argument, posting nothing.
  void group_begin();
  // Posts the collected ops together (ncclGroupEnd; MPI: Isend/Irecv each, in call order) and
  // closes the group. The Work (op "group") completes when all of them have; an empty group gives
  // a complete Work. Throws std::invalid_argument without a group_begin, or (closing the group,
  // posting nothing) when a recv buffer overlaps another buffer of the group.
  [[nodiscard]] Work group_end(std::string_view label);
  bool in_group() const { return group_open_; }

  // Local: operations posted after this call (by this thread) read and write their device buffers
  // only after the work recorded in `ready` has run (DEVICE ORDER above). nccl: its stream waits
  // for the event, nothing waits on the host; every other backend waits for it here, on the host.
  // An empty event does nothing. Works posted before the call are not affected. Throws
  // meshmuon::Error when the device reports an error (or the build has no CUDA and the event is not
  // empty).
  void order_after(DeviceEvent ready);

  // COLLECTIVE and blocking (bounded by the default timeout): ranks with the same color form a new
  // communicator, ordered by (key, rank). color < 0: this rank joins none and gets nullptr.
  // `name` is used in error messages (default "<parent>/<color>").
  std::unique_ptr<Communicator> split(int color, int key, std::string_view name = {});
  // COLLECTIVE over this communicator: every rank passes the same list of distinct ranks; listed
  // ranks get a communicator ordered as the list, the others nullptr.
  std::unique_ptr<Communicator> subgroup(std::span<const int> ranks, std::string_view name = {});
  // COLLECTIVE: ranks laid out on a mesh (row-major extents `mesh_shape`, product == size(); this
  // rank at `coords`) form one communicator per combination of the OTHER dims; new rank = row-major
  // index over `dims` (in the order given). E.g. a 2x2 grid, dims {1}: the row communicators.
  // Throws meshmuon::Error when ranks disagree on the layout (groups of the wrong size).
  std::unique_ptr<Communicator> split_mesh_dims(std::span<const int64_t> mesh_shape,
                                                std::span<const int64_t> coords, std::span<const int> dims,
                                                std::string_view name = {});

  CommCounters counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }

  std::chrono::milliseconds default_timeout() const { return default_timeout_; }
  void set_default_timeout(std::chrono::milliseconds timeout);  // > 0, else std::invalid_argument

  // Internal: make_communicator (comm_transport.h) and split() make communicators.
  Communicator(std::shared_ptr<Transport> transport, std::shared_ptr<detail::CommRoot> root, int rank, int size,
               std::string name);

 private:
  void count(ByteCount b);
  void check_no_group(std::string_view op, std::string_view label) const;
  Work p2p(P2pOp op, std::string_view label);
  // Posts one validated operation through the transport as a Work named `op` (comm/comm_transport.cpp).
  Work post(std::string_view op, std::string_view label, const std::function<std::unique_ptr<TransportOp>()>& call);

  std::shared_ptr<Transport> transport_;
  std::shared_ptr<detail::CommRoot> root_;
  int rank_;
  int size_;
  std::string name_;
  std::chrono::milliseconds default_timeout_;
  CommCounters counters_;
  bool group_open_ = false;
  std::vector<P2pOp> group_;
};

// The size-1 communicator: every collective is a local copy (or nothing), complete when posted.
MESHMUON_API std::unique_ptr<Communicator> make_single_communicator();
// The same for an engine on `device` ("cpu", "cuda", "cuda:N"): its copies may touch that device's
// memory (through cudart where a pointer is device memory). A cuda name without a usable CUDA
// device, or in a build without CUDA, throws meshmuon::Error naming the device; a bad name throws
// std::invalid_argument.
MESHMUON_API std::unique_ptr<Communicator> make_single_communicator(std::string_view device);

// COLLECTIVE over MPI_COMM_WORLD (bounded by the default timeout): a communicator on a duplicate
// of MPI_COMM_WORLD (traffic separate from the application's), named "world"; each call makes a
// new one. Initializes MPI if nobody has (MPI_Init_thread asking MPI_THREAD_SERIALIZED) and then
// finalizes it at exit, unless a collective is still stuck after a timeout. If the application
// initialized MPI, finalizing stays its job (after destroying meshmuon's communicators); at
// MPI_THREAD_FUNNELED every meshmuon call must then come from the main thread; below that it throws.
// Throws meshmuon::Error in a build without MPI ("[mpi] meshmuon was built without MPI").
MESHMUON_API std::unique_ptr<Communicator> make_mpi_communicator();

// "single", "mpi" or "nccl" (meshmuon/comm_nccl.h: bootstrapped over MPI; throws meshmuon::Error naming
// the cause where it cannot run); anything else throws std::invalid_argument naming the choices.
MESHMUON_API std::unique_ptr<Communicator> make_communicator(std::string_view backend);

// True when this build has the mpi backend.
MESHMUON_API bool mpi_available();

// Ends the whole job: MPI_Abort(MPI_COMM_WORLD, code) when MPI is running, else _Exit(code).
// The ONLY way the CLI may end a job after a communication error (a timeout leaves collectives
// posted, so MPI_Finalize could hang). Library code never calls it.
[[noreturn]] MESHMUON_API void abort_all(int code);

}  // namespace meshmuon
