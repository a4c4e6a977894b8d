// The `mpi` transport: each collective is one Open MPI non-blocking call (MPI_Ialltoallv, ...), each
// send/recv one MPI_Isend/MPI_Irecv (tag 0: MPI's order per (peer, tag, communicator) is the
// matching rule); an op polls its requests with MPI_Testall until completion or its deadline.
// MPI is called through the table of mpi_api.h (libmpi loaded at run time).
// Counts beyond MPI's int limit are split into pieces or sent in contiguous units (mpi_counts.h).
// Where any rank may hold device memory (agreed when the communicator is made), every operation
// takes the staged path instead (mpi_staging.h: rounds over pinned staging buffers).
#include <vector>

#include "comm/staging.h"
#include "comm/mpi/mpi_counts.h"
#include "comm/mpi/mpi_runtime.h"
#include "comm/mpi/mpi_staging.h"
#include "comm/work_impl.h"
#include "meshmuon/comm_transport.h"
#include "meshmuon/error.h"

namespace meshmuon {
namespace {

using detail::MpiRuntime;

// What both kinds of MPI op share: a timed-out operation marks the process's MPI state broken and
// counts as stuck until it completes (mpi_runtime.h), after which a destructor may no longer wait.
class MpiTimedOp : public TransportOp {
 public:
  bool on_timeout() override {
    MpiRuntime& rt = detail::mpi_runtime();
    rt.broken = true;
    if (!timed_out_) rt.stuck += 1;
    timed_out_ = true;
    return true;
  }
  bool destructor_may_wait() const override { return !detail::mpi_runtime().broken; }

 protected:
  bool completed(bool done) {  // call from test() with its result
    if (done && timed_out_) detail::mpi_runtime().stuck -= 1;
    return done;
  }

 private:
  bool timed_out_ = false;
};

// Posted requests plus what MPI reads until they complete (count and displacement arrays).
class MpiOp final : public MpiTimedOp {
 public:
  const detail::MpiApi& api = detail::mpi_api();
  std::vector<MPI_Request> requests;
  std::vector<int> arrays[4];

  MPI_Request* add() { return &requests.emplace_back(api.REQUEST_NULL); }  // call before posting, one at a time
  bool test() override {
    int flag = 0;
    MESHMUON_CHECK_MPI(api.Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE));
    return completed(flag != 0);
  }
};

// A staged operation: testing drives every staged communicator's queue (mpi_staging.h).
class MpiStagedOp final : public MpiTimedOp {
 public:
  MpiStagedOp(std::shared_ptr<detail::Staging> staging, std::shared_ptr<detail::StagedOp> op)
      : staging_(std::move(staging)), op_(std::move(op)) {}
  bool test() override {
    if (!op_->done) detail::progress_all_staging();
    return completed(op_->done);
  }

 private:
  std::shared_ptr<detail::Staging> staging_;  // declared first: outlives op_
  std::shared_ptr<detail::StagedOp> op_;
};

// Values in units of `unit` elements (mpi_unit made them fit).
std::vector<int> to_int(std::span<const int64_t> v, int64_t unit = 1) {
  std::vector<int> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<int>(v[i] / unit);
  return out;
}

// The element type in units of `unit` elements: the basic type, or a contiguous type that is freed
// when this goes out of scope (MPI keeps it alive for operations already posted with it).
class UnitType {
 public:
  UnitType(CommType t, int64_t unit) : api(detail::mpi_api()), type_(detail::mpi_datatype(t)) {
    if (unit == 1) return;
    MPI_Datatype basic = type_;
    MESHMUON_CHECK_MPI(api.Type_contiguous(static_cast<int>(unit), basic, &type_));
    MESHMUON_CHECK_MPI(api.Type_commit(&type_));
    owned_ = true;
  }
  ~UnitType() {
    if (owned_) api.Type_free(&type_);
  }
  UnitType(const UnitType&) = delete;
  UnitType& operator=(const UnitType&) = delete;
  MPI_Datatype get() const { return type_; }

 private:
  const detail::MpiApi& api;
  MPI_Datatype type_;
  bool owned_ = false;
};

const std::byte* at(const void* p, int64_t offset, CommType t) {
  return static_cast<const std::byte*>(p) + offset * static_cast<int64_t>(comm_type_size(t));
}

// MPI implementations may reject null buffers even for zero counts.
const void* nonnull(const void* p) {
  static const char dummy = 0;
  return p != nullptr ? p : &dummy;
}
void* nonnull(void* p) {
  static char dummy = 0;
  return p != nullptr ? p : &dummy;
}

class MpiTransport final : public Transport {
 public:
  MpiTransport(MPI_Comm comm, int rank, int size, std::shared_ptr<detail::MemorySpace> space,
               detail::StagingOptions options, bool staged, std::chrono::milliseconds drain_timeout)
      : comm_(comm), rank_(rank), size_(size), space_(std::move(space)), options_(options), drain_timeout_(drain_timeout) {
    if (staged) {
      staging_ = std::make_shared<detail::Staging>(comm_, rank, size, space_, options_);
      detail::Staging::track(staging_);
    }
  }

  ~MpiTransport() override {
    int finalized = 0;
    api.Finalized(&finalized);
    // Ops may outlive their transport: post the staged rounds still queued before the handle goes
    // (bounded by the default timeout; after a timeout nothing more is posted anyway).
    const auto deadline = CommClock::now() + drain_timeout_;
    while (!finalized && staging_ && !detail::mpi_runtime().broken && !staging_->all_posted() &&
           CommClock::now() < deadline) {
      try {
        detail::progress_all_staging();
      } catch (...) {
        break;  // destructors do not throw; the Works report the failure
      }
    }
    if (!finalized && comm_ != api.COMM_NULL) api.Comm_free(&comm_);  // deferred by MPI if ops are pending
  }

  // `comm` (errors returned, not fatal) as a transport: rank and size from MPI.
  static std::shared_ptr<MpiTransport> wrap(MPI_Comm comm, std::shared_ptr<detail::MemorySpace> space,
                                            detail::StagingOptions options, bool staged,
                                            std::chrono::milliseconds drain_timeout) {
    const detail::MpiApi& api = detail::mpi_api();
    MESHMUON_CHECK_MPI(api.Comm_set_errhandler(comm, api.ERRORS_RETURN));
    int rank = 0, size = 0;
    MESHMUON_CHECK_MPI(api.Comm_rank(comm, &rank));
    MESHMUON_CHECK_MPI(api.Comm_size(comm, &size));
    return std::make_shared<MpiTransport>(comm, rank, size, std::move(space), options, staged, drain_timeout);
  }

  std::string_view backend() const override { return "mpi"; }
  bool staged() const { return staging_ != nullptr; }
  bool device_buffers() const override { return staged(); }
  // A timeout anywhere leaves the process's MPI state unusable: no communicator posts again.
  bool usable() const override { return !detail::mpi_runtime().broken; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  std::unique_ptr<TransportOp> all_to_all_v(InBuffer send, Counts send_counts, Counts send_displs, OutBuffer recv,
                                            Counts recv_counts, Counts recv_displs) override {
    if (staging_)
      return staged(detail::staged_all_to_all_v(*staging_, send, send_counts, send_displs, recv, recv_counts, recv_displs));
    const int64_t unit = detail::mpi_unit({send_counts, send_displs, recv_counts, recv_displs});
    check_unit(unit, "all_to_all");
    auto w = std::make_unique<MpiOp>();
    w->arrays[0] = to_int(send_counts, unit);
    w->arrays[1] = to_int(send_displs, unit);
    w->arrays[2] = to_int(recv_counts, unit);
    w->arrays[3] = to_int(recv_displs, unit);
    const UnitType t(send.type, unit);
    MESHMUON_CHECK_MPI(api.Ialltoallv(nonnull(send.data), w->arrays[0].data(), w->arrays[1].data(), t.get(),
                                   nonnull(recv.data), w->arrays[2].data(), w->arrays[3].data(), t.get(), comm_,
                                   w->add()));
    return w;
  }

  std::unique_ptr<TransportOp> all_gather_v(InBuffer send, OutBuffer recv, Counts recv_counts,
                                            Counts recv_displs) override {
    if (staging_) return staged(detail::staged_all_gather_v(*staging_, send, recv, recv_counts, recv_displs));
    const int64_t unit = detail::mpi_unit({recv_counts, recv_displs});  // send.count is recv_counts[rank]
    check_unit(unit, "all_gather");
    auto w = std::make_unique<MpiOp>();
    w->arrays[0] = to_int(recv_counts, unit);
    w->arrays[1] = to_int(recv_displs, unit);
    const UnitType t(send.type, unit);
    MESHMUON_CHECK_MPI(api.Iallgatherv(nonnull(send.data), static_cast<int>(static_cast<int64_t>(send.count) / unit),
                                    t.get(), nonnull(recv.data), w->arrays[0].data(), w->arrays[1].data(), t.get(),
                                    comm_, w->add()));
    return w;
  }

  std::unique_ptr<TransportOp> reduce_scatter_v(InBuffer send, OutBuffer recv, Counts recv_counts, ReduceOp op) override {
    if (staging_) return staged(detail::staged_reduce_scatter_v(*staging_, send, recv, recv_counts, op));
    // Reductions need the basic type (bf16 sums are a user op on elements): no unit type here, and
    // the total must fit too (MPI_Ireduce_scatter adds the counts up in an int).
    MESHMUON_CHECK(static_cast<int64_t>(send.count) <= detail::kMpiMaxCount, "[mpi] reduce_scatter: ", send.count,
                " elements in all exceed the 2^31-1 elements (C int counts) one MPI_Ireduce_scatter can address; "
                "split the buffer into smaller chunks");
    auto w = std::make_unique<MpiOp>();
    w->arrays[0] = to_int(recv_counts);
    MESHMUON_CHECK_MPI(api.Ireduce_scatter(nonnull(send.data), nonnull(recv.data), w->arrays[0].data(),
                                        detail::mpi_datatype(send.type), detail::mpi_op(op, send.type), comm_,
                                        w->add()));
    return w;
  }

  std::unique_ptr<TransportOp> all_reduce(InBuffer send, OutBuffer recv, ReduceOp op) override {
    if (staging_) return staged(detail::staged_all_reduce(*staging_, send, recv, op));
    // Element-wise, so pieces of at most 2^31-1 elements are independent all-reduces.
    auto w = std::make_unique<MpiOp>();
    const bool in_place = send.data == recv.data;
    for (const detail::MpiPiece& p : detail::mpi_pieces(static_cast<int64_t>(send.count))) {
      const void* src = in_place ? MPI_IN_PLACE : nonnull(at(send.data, p.offset, send.type));
      MESHMUON_CHECK_MPI(api.Iallreduce(src, nonnull(const_cast<std::byte*>(at(recv.data, p.offset, recv.type))), p.count,
                                     detail::mpi_datatype(send.type), detail::mpi_op(op, send.type), comm_, w->add()));
    }
    return w;
  }

  std::unique_ptr<TransportOp> broadcast(OutBuffer buf, int root) override {
    if (staging_) return staged(detail::staged_broadcast(*staging_, buf, root));
    auto w = std::make_unique<MpiOp>();
    for (const detail::MpiPiece& p : detail::mpi_pieces(static_cast<int64_t>(buf.count)))
      MESHMUON_CHECK_MPI(api.Ibcast(nonnull(const_cast<std::byte*>(at(buf.data, p.offset, buf.type))), p.count,
                                 detail::mpi_datatype(buf.type), root, comm_, w->add()));
    return w;
  }

  std::unique_ptr<TransportOp> barrier() override {
    if (staging_) return staged(detail::staged_barrier(*staging_));
    auto w = std::make_unique<MpiOp>();
    MESHMUON_CHECK_MPI(api.Ibarrier(comm_, w->add()));
    return w;
  }

  // The Communicator has all-gathered (color, key) under the deadline (through this transport, so
  // staged operations posted first), so the blocking MPI_Comm_split cannot hang on a missing peer.
  std::shared_ptr<Transport> split(std::span<const int> colors, std::span<const int> keys, const std::string&) override {
    const int color = colors[static_cast<size_t>(rank_)], key = keys[static_cast<size_t>(rank_)];
    MPI_Comm sub = api.COMM_NULL;
    MESHMUON_CHECK_MPI(api.Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
    if (sub == api.COMM_NULL) return nullptr;
    return wrap(sub, space_, options_, staged(), drain_timeout_);
  }

  std::unique_ptr<TransportOp> p2p(std::span<const P2pOp> ops) override {
    // Messages above 2^31-1 elements go as consecutive pieces; both ends split the same count the
    // same way, and MPI keeps their order, so piece i still matches piece i.
    if (staging_) return staged(detail::staged_p2p(*staging_, ops));
    auto w = std::make_unique<MpiOp>();
    for (const P2pOp& o : ops) {
      const MPI_Datatype t = detail::mpi_datatype(o.buf.type);
      for (const detail::MpiPiece& p : detail::mpi_pieces(static_cast<int64_t>(o.buf.count))) {
        const std::byte* data = at(o.buf.data, p.offset, o.buf.type);
        if (o.is_send)
          MESHMUON_CHECK_MPI(api.Isend(nonnull(data), p.count, t, o.peer, kP2pTag, comm_, w->add()));
        else
          MESHMUON_CHECK_MPI(api.Irecv(nonnull(const_cast<std::byte*>(data)), p.count, t, o.peer, kP2pTag, comm_, w->add()));
      }
    }
    return w;
  }

 private:
  static constexpr int kP2pTag = 0;  // one tag: matching is by order per (peer, communicator)

  // all_to_all_v / all_gather_v: counts or displacements past MPI's int limit with no common unit.
  static void check_unit(int64_t unit, std::string_view op) {
    MESHMUON_CHECK(unit > 0, "[mpi] ", op, ": counts or displacements exceed the 2^31-1 elements (C int) MPI can address "
                "and share no factor that brings them under it; split the exchange into smaller chunks");
  }

  // Queues a staged operation (posting what the queue allows now).
  std::unique_ptr<TransportOp> staged(std::shared_ptr<detail::StagedOp> staged_op) {
    staging_->add(staged_op);
    return std::make_unique<MpiStagedOp>(staging_, std::move(staged_op));
  }

  const detail::MpiApi& api = detail::mpi_api();
  MPI_Comm comm_;
  int rank_, size_;
  std::shared_ptr<detail::MemorySpace> space_;
  detail::StagingOptions options_;
  std::chrono::milliseconds drain_timeout_;
  std::shared_ptr<detail::Staging> staging_;  // null: plain MPI calls on the caller's buffers
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() {
  return make_mpi_communicator(detail::default_memory_space(), detail::staging_options_from_env());
}

std::unique_ptr<Communicator> make_mpi_communicator(std::shared_ptr<detail::MemorySpace> space,
                                                    detail::StagingOptions options) {
  // First: where no Open MPI loads, this is the error (naming what was tried and what to do).
  const detail::MpiApi& api = detail::mpi_api();
  MESHMUON_CHECK(space != nullptr, "[mpi] make_mpi_communicator: the memory space is null");
  detail::check_staging_options(options);
  const MpiRuntime& rt = detail::mpi_runtime();
  MESHMUON_CHECK_RUNTIME(!rt.broken, "[mpi] rank ", rt.world_rank,
                      ": cannot make a communicator after a collective timed out; end the job (meshmuon::abort_all)");
  // MPI_Comm_idup (not MPI_Comm_dup) so that a missing rank ends in a timeout error, not a hang.
  auto root = std::make_shared<detail::CommRoot>();
  root->backend = "mpi", root->world_rank = rt.world_rank;
  const auto wait = [&](std::unique_ptr<MpiOp> op, const char* what, const char* label, const char* comm_name) {
    Work(std::make_unique<detail::WorkImpl>(
             detail::WorkInfo{root->backend, what, label, comm_name, rt.world_rank, rt.world_rank, rt.world_size, {}}, root,
             nullptr, std::move(op)))
        .wait(detail::default_timeout_from_env());
  };
  MPI_Comm comm = api.COMM_NULL;
  auto dup = std::make_unique<MpiOp>();
  MESHMUON_CHECK_MPI(api.Comm_idup(api.COMM_WORLD, &comm, dup->add()));
  wait(std::move(dup), "comm_dup", "make_mpi_communicator", "MPI_COMM_WORLD");
  // Staging is on when any rank may hold device memory; the chunk size must agree (it sets the rounds).
  int64_t agree[3] = {space->has_devices() ? 1 : 0, static_cast<int64_t>(options.chunk_bytes),
                      -static_cast<int64_t>(options.chunk_bytes)};
  auto all = std::make_unique<MpiOp>();
  MESHMUON_CHECK_MPI(api.Iallreduce(MPI_IN_PLACE, agree, 3, api.INT64_T, api.MAX, comm, all->add()));
  wait(std::move(all), "all_reduce", "staging agreement", "world");
  MESHMUON_CHECK(agree[1] == -agree[2], "[mpi] rank ", rt.world_rank, ": the staging chunk size differs between ranks (",
              -agree[2], " to ", agree[1], " bytes); set MESHMUON_STAGING_CHUNK_BYTES alike on every rank");
  auto transport = MpiTransport::wrap(comm, std::move(space), options, agree[0] > 0, detail::default_timeout_from_env());
  const int rank = transport->rank(), size = transport->size();
  return make_communicator(std::move(transport), rank, size, "world", rt.world_rank);
}

}  // namespace meshmuon
