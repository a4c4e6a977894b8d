// The `mpi` backend: each collective is one Open MPI non-blocking call (MPI_Ialltoallv, ...) whose
// request a Work polls with MPI_Test until completion or its deadline.
#include <vector>

#include "comm/mpi/mpi_runtime.h"
#include "comm/work_impl.h"
#include "dmuon/error.h"

namespace dmuon {
namespace {

using detail::MpiRuntime;
using detail::WorkInfo;

// One posted request plus what MPI reads until it completes (count and displacement arrays).
class MpiWork final : public detail::WorkImpl {
 public:
  explicit MpiWork(WorkInfo info) : WorkImpl(std::move(info)) {}
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<int> arrays[4];

  bool poll() override {
    int flag = 0;
    DMUON_CHECK_MPI(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
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

std::vector<int> to_int(std::span<const int64_t> v) { return std::vector<int>(v.begin(), v.end()); }

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
    auto w = start("all_to_all", label);
    w->arrays[0] = to_int(send_counts);
    w->arrays[1] = to_int(send_displs);
    w->arrays[2] = to_int(recv_counts);
    w->arrays[3] = to_int(recv_displs);
    const MPI_Datatype t = detail::mpi_datatype(send.type);
    DMUON_CHECK_MPI(MPI_Ialltoallv(nonnull(send.data), w->arrays[0].data(), w->arrays[1].data(), t,
                                   nonnull(recv.data), w->arrays[2].data(), w->arrays[3].data(), t, comm_,
                                   &w->request));
    return Work(std::move(w));
  }

  Work post_all_gather_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts,
                         std::span<const int64_t> recv_displs, std::string_view label) override {
    auto w = start("all_gather", label);
    w->arrays[0] = to_int(recv_counts);
    w->arrays[1] = to_int(recv_displs);
    const MPI_Datatype t = detail::mpi_datatype(send.type);
    DMUON_CHECK_MPI(MPI_Iallgatherv(nonnull(send.data), static_cast<int>(send.count), t, nonnull(recv.data),
                                    w->arrays[0].data(), w->arrays[1].data(), t, comm_, &w->request));
    return Work(std::move(w));
  }

  Work post_reduce_scatter_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts, ReduceOp op,
                             std::string_view label) override {
    auto w = start("reduce_scatter", label);
    w->arrays[0] = to_int(recv_counts);
    DMUON_CHECK_MPI(MPI_Ireduce_scatter(nonnull(send.data), nonnull(recv.data), w->arrays[0].data(),
                                        detail::mpi_datatype(send.type), detail::mpi_op(op, send.type), comm_,
                                        &w->request));
    return Work(std::move(w));
  }

  Work post_all_reduce(InBuffer send, OutBuffer recv, ReduceOp op, std::string_view label) override {
    auto w = start("all_reduce", label);
    const void* src = send.data == recv.data ? MPI_IN_PLACE : nonnull(send.data);
    DMUON_CHECK_MPI(MPI_Iallreduce(src, nonnull(recv.data), static_cast<int>(send.count),
                                   detail::mpi_datatype(send.type), detail::mpi_op(op, send.type), comm_,
                                   &w->request));
    return Work(std::move(w));
  }

  Work post_broadcast(OutBuffer buf, int root, std::string_view label) override {
    auto w = start("broadcast", label);
    DMUON_CHECK_MPI(MPI_Ibcast(nonnull(buf.data), static_cast<int>(buf.count), detail::mpi_datatype(buf.type),
                               root, comm_, &w->request));
    return Work(std::move(w));
  }

  Work post_barrier(std::string_view label) override {
    auto w = start("barrier", label);
    DMUON_CHECK_MPI(MPI_Ibarrier(comm_, &w->request));
    return Work(std::move(w));
  }

  std::unique_ptr<Communicator> do_split(int color, int key, std::string name) override {
    // pass 1: a non-blocking all-gather of (color, key) under the deadline proves every rank
    // arrived, so the blocking MPI_Comm_split of pass 2 cannot hang on a missing peer.
    int mine[2] = {color, key};
    std::vector<int> all(2 * static_cast<size_t>(size()));
    {
      auto w = start("split", name);
      DMUON_CHECK_MPI(MPI_Iallgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, comm_, &w->request));
      Work(std::move(w)).wait();
    }
    // pass 2: the split itself.
    MPI_Comm sub = MPI_COMM_NULL;
    DMUON_CHECK_MPI(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
    if (sub == MPI_COMM_NULL) return nullptr;
    return wrap(sub, std::move(name));
  }

 private:
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
  DMUON_CHECK_MPI(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &w->request));
  Work(std::move(w)).wait(detail::default_timeout_from_env());
  return MpiCommunicator::wrap(comm, "world");
}

}  // namespace dmuon
