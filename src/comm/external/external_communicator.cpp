// The external backend (include/dmuon/comm_external.h): a Communicator over an application
// transport. Validation, byte counters, groups and deadlines stay in the Communicator base and in
// Work (shared with the mpi backend); this file posts through the transport, polls its op handles,
// words its failures like the mpi backend's ("[c10d] rank R: all_to_all 'label' ... failed: ..."),
// and keeps the broken-after-timeout state shared by a root communicator and its splits.
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "comm/memory_space.h"
#include "comm/work_impl.h"
#include "dmuon/comm_external.h"
#include "dmuon/error.h"

namespace dmuon {

ExternalOp::~ExternalOp() = default;
ExternalTransport::~ExternalTransport() = default;
void ExternalTransport::order_after(void* cuda_event) { detail::wait_on_host({cuda_event}, backend()); }

namespace {

// Shared by a root communicator and every communicator split from it (mpi's MpiRuntime, per root).
struct ExternalRuntime {
  std::string backend;  // WorkInfo::backend views this string: Works keep the runtime alive
  int world_rank = 0;
  bool broken = false;  // a wait timed out: nothing more is posted, destructors do not wait
};

class ExternalWork final : public detail::WorkImpl {
 public:
  ExternalWork(detail::WorkInfo info, std::shared_ptr<ExternalRuntime> rt, std::shared_ptr<ExternalTransport> transport,
               std::unique_ptr<ExternalOp> op)
      : WorkImpl(std::move(info)), rt_(std::move(rt)), transport_(std::move(transport)), op_(std::move(op)) {}

  ~ExternalWork() override {
    // An op the transport may still write through (after a timeout) is leaked, like an MPI request.
    if (!done && rt_->broken) (void)op_.release();
  }

  bool poll() override {
    if (!op_) return true;
    bool complete = false;
    try {
      complete = op_->test();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      const detail::WorkInfo& w = info();
      detail::throw_error(detail::concat("[", w.backend, "] rank ", w.world_rank, ": ", w.op, " '", w.label,
                                         "' failed on communicator '", w.comm_name, "' (rank ", w.comm_rank, " of ",
                                         w.comm_size, "): ", e.what()));
    }
    if (complete) op_.reset();  // let go of the transport's state (tensors, handles) now
    return complete;
  }
  void on_timeout() override {
    if (!rt_->broken) {
      rt_->broken = true;
      transport_->on_timeout();
    }
  }
  bool destructor_may_wait() const override { return !rt_->broken; }

 private:
  std::shared_ptr<ExternalRuntime> rt_;
  std::shared_ptr<ExternalTransport> transport_;
  std::unique_ptr<ExternalOp> op_;
};

class ExternalCommunicator final : public Communicator {
 public:
  ExternalCommunicator(std::shared_ptr<ExternalTransport> transport, std::shared_ptr<ExternalRuntime> rt, int rank,
                       int size, std::string name)
      : Communicator(rank, size, std::move(name)), transport_(std::move(transport)), rt_(std::move(rt)) {}

  std::string_view backend() const override { return rt_->backend; }
  bool device_buffers() const override { return transport_->device_buffers(); }

 protected:
  void do_order_after(DeviceEvent ready) override {
    DMUON_CHECK_RUNTIME(!rt_->broken, "[", rt_->backend, "] rank ", rt_->world_rank, ": cannot order communicator '",
                        name(), "' after device work: an earlier collective timed out and communication is unusable; "
                        "end the job (dmuon::abort_all)");
    try {
      transport_->order_after(ready.cuda_event);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      detail::throw_error(detail::concat("[", rt_->backend, "] rank ", rt_->world_rank, ": ordering communicator '", name(),
                                         "' after device work failed: ", e.what()));
    }
  }
  Work post_all_to_all_v(InBuffer send, std::span<const int64_t> send_counts, std::span<const int64_t> send_displs,
                         OutBuffer recv, std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                         std::string_view label) override {
    return post("all_to_all", label, [&] {
      return transport_->all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs);
    });
  }
  Work post_all_gather_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts,
                         std::span<const int64_t> recv_displs, std::string_view label) override {
    return post("all_gather", label, [&] { return transport_->all_gather_v(send, recv, recv_counts, recv_displs); });
  }
  Work post_reduce_scatter_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts, ReduceOp op,
                             std::string_view label) override {
    return post("reduce_scatter", label, [&] { return transport_->reduce_scatter_v(send, recv, recv_counts, op); });
  }
  Work post_all_reduce(InBuffer send, OutBuffer recv, ReduceOp op, std::string_view label) override {
    return post("all_reduce", label, [&] { return transport_->all_reduce(send, recv, op); });
  }
  Work post_broadcast(OutBuffer buf, int root, std::string_view label) override {
    return post("broadcast", label, [&] { return transport_->broadcast(buf, root); });
  }
  Work post_barrier(std::string_view label) override {
    return post("barrier", label, [&] { return transport_->barrier(); });
  }
  Work post_p2p(std::span<const detail::P2pOp> ops, std::string_view op, std::string_view label) override {
    std::vector<ExternalP2p> batch;
    batch.reserve(ops.size());
    for (const detail::P2pOp& o : ops) batch.push_back({o.is_send, o.peer, o.buf});
    return post(op, label, [&] { return transport_->p2p(batch); });
  }

  std::unique_ptr<Communicator> do_split(int color, int key, std::string name) override {
    // pass 1: all-gather (color, key) under the deadline, so a missing rank is a timeout error
    // naming "split", never a hang in the transport's blocking group creation of pass 2.
    const int mine[2] = {color, key};
    std::vector<int> all(2 * static_cast<size_t>(size()));
    const std::vector<int64_t> counts(static_cast<size_t>(size()), 2);
    const std::vector<int64_t> displs = packed_displs(counts);
    post("split", name, [&] {
      return transport_->all_gather_v(InBuffer(mine, CommType::I32, 2),
                                      OutBuffer(all.data(), CommType::I32, all.size()), counts, displs);
    }).wait();
    std::vector<int> colors(static_cast<size_t>(size())), keys(static_cast<size_t>(size()));
    for (size_t i = 0; i < colors.size(); ++i) colors[i] = all[2 * i], keys[i] = all[2 * i + 1];
    // the new rank and size, as MPI_Comm_split orders them: by (key, rank) within a color
    int new_rank = 0, new_size = 0;
    for (int j = 0; j < size(); ++j) {
      const auto u = static_cast<size_t>(j);
      if (color < 0 || colors[u] != color) continue;
      new_size += 1;
      if (keys[u] < key || (keys[u] == key && j < rank())) new_rank += 1;
    }
    // pass 2: the transport's own group (every rank calls it: group creation may be collective)
    std::shared_ptr<ExternalTransport> sub;
    try {
      sub = transport_->split(colors, keys, name);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      detail::throw_error(detail::concat("[", rt_->backend, "] rank ", rt_->world_rank, ": split '", name,
                                         "' of communicator '", this->name(), "' failed: ", e.what()));
    }
    if (color < 0) return nullptr;
    DMUON_CHECK_RUNTIME(sub != nullptr, "[", rt_->backend, "] rank ", rt_->world_rank, ": split '", name,
                        "': the transport returned no group for color ", color);
    return std::make_unique<ExternalCommunicator>(std::move(sub), rt_, new_rank, new_size, std::move(name));
  }

 private:
  template <class Post>
  Work post(std::string_view op, std::string_view label, Post&& call) {
    DMUON_CHECK_RUNTIME(!rt_->broken, "[", rt_->backend, "] rank ", rt_->world_rank, ": cannot post ", op, " '", label,
                        "' on communicator '", name(), "': an earlier collective timed out and communication is "
                        "unusable; end the job (dmuon::abort_all)");
    detail::WorkInfo info{rt_->backend, op, std::string(label), name(), rt_->world_rank, rank(), size(), default_timeout()};
    std::unique_ptr<ExternalOp> handle;
    try {
      handle = call();
    } catch (const Error&) {
      throw;
    } catch (const std::invalid_argument&) {
      throw;
    } catch (const std::exception& e) {
      detail::throw_error(detail::concat("[", rt_->backend, "] rank ", rt_->world_rank, ": posting ", op, " '", label,
                                         "' on communicator '", name(), "' failed: ", e.what()));
    }
    const bool complete = handle == nullptr;  // the transport finished it during the call
    auto work = std::make_unique<ExternalWork>(std::move(info), rt_, transport_, std::move(handle));
    work->done = complete;
    return Work(std::move(work));
  }

  std::shared_ptr<ExternalTransport> transport_;
  std::shared_ptr<ExternalRuntime> rt_;
};

}  // namespace

std::unique_ptr<Communicator> make_external_communicator(std::shared_ptr<ExternalTransport> transport, int rank,
                                                         int size, std::string name, int world_rank) {
  DMUON_CHECK(transport != nullptr, "[comm] make_external_communicator: the transport is null");
  DMUON_CHECK(size > 0 && rank >= 0 && rank < size, "[comm] make_external_communicator: rank ", rank,
              " is not in [0, ", size, ")");
  auto rt = std::make_shared<ExternalRuntime>();
  rt->backend = std::string(transport->backend());
  DMUON_CHECK(!rt->backend.empty(), "[comm] make_external_communicator: the transport names no backend");
  rt->world_rank = world_rank < 0 ? rank : world_rank;
  return std::make_unique<ExternalCommunicator>(std::move(transport), std::move(rt), rank, size, std::move(name));
}

}  // namespace dmuon
