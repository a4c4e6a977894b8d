// The `mpi` backend: each collective is one Open MPI non-blocking call (MPI_Ialltoallv, ...), each
// send/recv one MPI_Isend/MPI_Irecv (tag 0: MPI's order per (peer, tag, communicator) is the
// matching rule); a Work polls its requests with MPI_Testall until completion or its deadline.
// Counts beyond MPI's int limit are split into pieces or sent in contiguous units (mpi_counts.h).
#include <vector>

#include "comm/mpi/mpi_counts.h"
#include "comm/mpi/mpi_runtime.h"
#include "comm/work_impl.h"
#include "dmuon/error.h"

namespace dmuon {
namespace {

using detail::MpiRuntime;
using detail::WorkInfo;

// Posted requests plus what MPI reads until they complete (count and displacement arrays).
class MpiWork final : public detail::WorkImpl {
 public:
  explicit MpiWork(WorkInfo info) : WorkImpl(std::move(info)) {}
  std::vector<MPI_Request> requests;
  std::vector<int> arrays[4];

  MPI_Request* add() { return &requests.emplace_back(MPI_REQUEST_NULL); }  // call before posting, one at a time
  bool poll() override {
    int flag = 0;
    DMUON_CHECK_MPI(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag && timed_out_) detail::mpi_runtime().stuck -= 1;
    return flag != 0;
  }
  void on_timeout() override {
    MpiRuntime& rt = detail::mpi_runtime();
    rt.broken = true;
    if (!timed_out_) rt.stuck += 1;
    timed_out_ = true;
  }
  bool destructor_may_wait() const override { return !detail::mpi_runtime().broken; }

 private:
  bool timed_out_ = false;
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
  UnitType(CommType t, int64_t unit) : type_(detail::mpi_datatype(t)) {
    if (unit == 1) return;
    MPI_Datatype basic = type_;
    DMUON_CHECK_MPI(MPI_Type_contiguous(static_cast<int>(unit), basic, &type_));
    DMUON_CHECK_MPI(MPI_Type_commit(&type_));
    owned_ = true;
  }
  ~UnitType() {
    if (owned_) MPI_Type_free(&type_);
  }
  UnitType(const UnitType&) = delete;
  UnitType& operator=(const UnitType&) = delete;
  MPI_Datatype get() const { return type_; }

 private:
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

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, std::string name)
      : Communicator(rank, size, std::move(name)), comm_(comm) {}

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);  // deferred by MPI if ops are pending
  }

  std::string_view backend() const override { return "mpi"; }

  static std::unique_ptr<Communicator> wrap(MPI_Comm comm, std::string name) {
    DMUON_CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    int rank = 0, size = 0;
    DMUON_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    DMUON_CHECK_MPI(MPI_Comm_size(comm, &size));
    return std::make_unique<MpiCommunicator>(comm, rank, size, std::move(name));
  }

 protected:
  Work post_all_to_all_v(InBuffer send, std::span<const int64_t> send_counts, std::span<const int64_t> send_displs,
                         OutBuffer recv, std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                         std::string_view label) override {
    const int64_t unit = detail::mpi_unit({send_counts, send_displs, recv_counts, recv_displs});
    check_unit(unit, "all_to_all", label);
    auto w = start("all_to_all", label);
    w->arrays[0] = to_int(send_counts, unit);
    w->arrays[1] = to_int(send_displs, unit);
    w->arrays[2] = to_int(recv_counts, unit);
    w->arrays[3] = to_int(recv_displs, unit);
    const UnitType t(send.type, unit);
    DMUON_CHECK_MPI(MPI_Ialltoallv(nonnull(send.data), w->arrays[0].data(), w->arrays[1].data(), t.get(),
                                   nonnull(recv.data), w->arrays[2].data(), w->arrays[3].data(), t.get(), comm_,
                                   w->add()));
    return Work(std::move(w));
  }

  Work post_all_gather_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts,
                         std::span<const int64_t> recv_displs, std::string_view label) override {
    const int64_t unit = detail::mpi_unit({recv_counts, recv_displs});  // send.count is recv_counts[rank]
    check_unit(unit, "all_gather", label);
    auto w = start("all_gather", label);
    w->arrays[0] = to_int(recv_counts, unit);
    w->arrays[1] = to_int(recv_displs, unit);
    const UnitType t(send.type, unit);
    DMUON_CHECK_MPI(MPI_Iallgatherv(nonnull(send.data), static_cast<int>(static_cast<int64_t>(send.count) / unit),
                                    t.get(), nonnull(recv.data), w->arrays[0].data(), w->arrays[1].data(), t.get(),
                                    comm_, w->add()));
    return Work(std::move(w));
  }

  Work post_reduce_scatter_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts, ReduceOp op,
                             std::string_view label) override {
    // Reductions need the basic type (bf16 sums are a user op on elements): no unit type here, and
    // the total must fit too (MPI_Ireduce_scatter adds the counts up in an int).
    DMUON_CHECK(static_cast<int64_t>(send.count) <= detail::kMpiMaxCount, "[mpi] reduce_scatter '", label, "': ",
                send.count, " elements in all exceed the 2^31-1 elements (C int counts) one MPI_Ireduce_scatter "
                "can address; split the buffer into smaller chunks");
    auto w = start("reduce_scatter", label);
    w->arrays[0] = to_int(recv_counts);
    DMUON_CHECK_MPI(MPI_Ireduce_scatter(nonnull(send.data), nonnull(recv.data), w->arrays[0].data(),
                                        detail::mpi_datatype(send.type), detail::mpi_op(op, send.type), comm_,
                                        w->add()));
    return Work(std::move(w));
  }

  Work post_all_reduce(InBuffer send, OutBuffer recv, ReduceOp op, std::string_view label) override {
    // Element-wise, so pieces of at most 2^31-1 elements are independent all-reduces.
    auto w = start("all_reduce", label);
    const bool in_place = send.data == recv.data;
    for (const detail::MpiPiece& p : detail::mpi_pieces(static_cast<int64_t>(send.count))) {
      const void* src = in_place ? MPI_IN_PLACE : nonnull(at(send.data, p.offset, send.type));
      DMUON_CHECK_MPI(MPI_Iallreduce(src, nonnull(const_cast<std::byte*>(at(recv.data, p.offset, recv.type))), p.count,
                                     detail::mpi_datatype(send.type), detail::mpi_op(op, send.type), comm_, w->add()));
    }
    return Work(std::move(w));
  }

  Work post_broadcast(OutBuffer buf, int root, std::string_view label) override {
    auto w = start("broadcast", label);
    for (const detail::MpiPiece& p : detail::mpi_pieces(static_cast<int64_t>(buf.count)))
      DMUON_CHECK_MPI(MPI_Ibcast(nonnull(const_cast<std::byte*>(at(buf.data, p.offset, buf.type))), p.count,
                                 detail::mpi_datatype(buf.type), root, comm_, w->add()));
    return Work(std::move(w));
  }

  Work post_barrier(std::string_view label) override {
    auto w = start("barrier", label);
    DMUON_CHECK_MPI(MPI_Ibarrier(comm_, w->add()));
    return Work(std::move(w));
  }

  std::unique_ptr<Communicator> do_split(int color, int key, std::string name) override {
    // pass 1: a non-blocking all-gather of (color, key) under the deadline proves every rank
    // arrived, so the blocking MPI_Comm_split of pass 2 cannot hang on a missing peer.
    int mine[2] = {color, key};
    std::vector<int> all(2 * static_cast<size_t>(size()));
    {
      auto w = start("split", name);
      DMUON_CHECK_MPI(MPI_Iallgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, comm_, w->add()));
      Work(std::move(w)).wait();
    }
    // pass 2: the split itself.
    MPI_Comm sub = MPI_COMM_NULL;
    DMUON_CHECK_MPI(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
    if (sub == MPI_COMM_NULL) return nullptr;
    return wrap(sub, std::move(name));
  }

  Work post_p2p(std::span<const detail::P2pOp> ops, std::string_view op, std::string_view label) override {
    // Messages above 2^31-1 elements go as consecutive pieces; both ends split the same count the
    // same way, and MPI keeps their order, so piece i still matches piece i.
    auto w = start(op, label);
    for (const detail::P2pOp& o : ops) {
      const MPI_Datatype t = detail::mpi_datatype(o.buf.type);
      for (const detail::MpiPiece& p : detail::mpi_pieces(static_cast<int64_t>(o.buf.count))) {
        const std::byte* data = at(o.buf.data, p.offset, o.buf.type);
        if (o.is_send)
          DMUON_CHECK_MPI(MPI_Isend(nonnull(data), p.count, t, o.peer, kP2pTag, comm_, w->add()));
        else
          DMUON_CHECK_MPI(MPI_Irecv(nonnull(const_cast<std::byte*>(data)), p.count, t, o.peer, kP2pTag, comm_, w->add()));
      }
    }
    return Work(std::move(w));
  }

 private:
  static constexpr int kP2pTag = 0;  // one tag: matching is by order per (peer, communicator)

  // all_to_all_v / all_gather_v: counts or displacements past MPI's int limit with no common unit.
  static void check_unit(int64_t unit, std::string_view op, std::string_view label) {
    DMUON_CHECK(unit > 0, "[mpi] ", op, " '", label, "': counts or displacements exceed the 2^31-1 elements (C int) "
                "MPI can address and share no factor that brings them under it; split the exchange into smaller chunks");
  }

  std::unique_ptr<MpiWork> start(std::string_view op, std::string_view label) {
    const MpiRuntime& rt = detail::mpi_runtime();
    DMUON_CHECK_RUNTIME(!rt.broken, "[mpi] rank ", rt.world_rank, ": cannot post ", op, " '", label,
                        "' on communicator '", name(), "': an earlier collective timed out and communication "
                        "is unusable; end the job (dmuon::abort_all)");
    return std::make_unique<MpiWork>(
        WorkInfo{"mpi", op, std::string(label), name(), rt.world_rank, rank(), size(), default_timeout()});
  }

  MPI_Comm comm_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() {
  const MpiRuntime& rt = detail::mpi_runtime();
  DMUON_CHECK_RUNTIME(!rt.broken, "[mpi] rank ", rt.world_rank,
                      ": cannot make a communicator after a collective timed out; end the job (dmuon::abort_all)");
  // MPI_Comm_idup (not MPI_Comm_dup) so that a missing rank ends in a timeout error, not a hang.
  MPI_Comm comm = MPI_COMM_NULL;
  auto w = std::make_unique<MpiWork>(WorkInfo{"mpi", "comm_dup", "make_mpi_communicator", "MPI_COMM_WORLD",
                                              rt.world_rank, rt.world_rank, rt.world_size, {}});
  DMUON_CHECK_MPI(MPI_Comm_idup(MPI_COMM_WORLD, &comm, w->add()));
  Work(std::move(w)).wait(detail::default_timeout_from_env());
  return MpiCommunicator::wrap(comm, "world");
}

}  // namespace dmuon
