// The `single` backend: one rank, so every collective is a local copy and completes when posted.
// Lets one process run the whole engine without MPI (mlx's EmptyGroup).
#include <cstring>

#include "comm/work_impl.h"
#include "dmuon/comm.h"

namespace dmuon {
namespace {

void copy_elems(void* dst, int64_t dst_off, const void* src, int64_t src_off, int64_t n, size_t elem) {
  if (n <= 0 || (dst == src && dst_off == src_off)) return;
  std::memmove(static_cast<std::byte*>(dst) + dst_off * static_cast<int64_t>(elem),
               static_cast<const std::byte*>(src) + src_off * static_cast<int64_t>(elem),
               static_cast<size_t>(n) * elem);
}

class SingleCommunicator final : public Communicator {
 public:
  explicit SingleCommunicator(std::string name) : Communicator(0, 1, std::move(name)) {}
  std::string_view backend() const override { return "single"; }

 protected:
  Work post_all_to_all_v(InBuffer send, std::span<const int64_t> send_counts, std::span<const int64_t> send_displs,
                         OutBuffer recv, std::span<const int64_t>, std::span<const int64_t> recv_displs,
                         std::string_view label) override {
    copy_elems(recv.data, recv_displs[0], send.data, send_displs[0], send_counts[0], comm_type_size(send.type));
    return done("all_to_all", label);
  }
  Work post_all_gather_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts,
                         std::span<const int64_t> recv_displs, std::string_view label) override {
    copy_elems(recv.data, recv_displs[0], send.data, 0, recv_counts[0], comm_type_size(send.type));
    return done("all_gather", label);
  }
  Work post_reduce_scatter_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts, ReduceOp,
                             std::string_view label) override {
    copy_elems(recv.data, 0, send.data, 0, recv_counts[0], comm_type_size(send.type));
    return done("reduce_scatter", label);
  }
  Work post_all_reduce(InBuffer send, OutBuffer recv, ReduceOp, std::string_view label) override {
    copy_elems(recv.data, 0, send.data, 0, static_cast<int64_t>(send.count), comm_type_size(send.type));
    return done("all_reduce", label);
  }
  Work post_broadcast(OutBuffer, int, std::string_view label) override { return done("broadcast", label); }
  Work post_barrier(std::string_view label) override { return done("barrier", label); }
  std::unique_ptr<Communicator> do_split(int color, int, std::string name) override {
    if (color < 0) return nullptr;
    return std::make_unique<SingleCommunicator>(std::move(name));
  }

 private:
  Work done(std::string_view op, std::string_view label) const {
    return detail::make_completed_work(
        {"single", op, std::string(label), name(), 0, 0, 1, default_timeout()});
  }
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() { return std::make_unique<SingleCommunicator>("world"); }

}  // namespace dmuon
