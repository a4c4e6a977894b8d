// The `single` transport: one rank, so every collective is a local copy and completes when posted.
// Lets one process run the whole engine without MPI (mlx's EmptyGroup). Sends and recvs (all to
// self) are matched in FIFO order as MPI would: an op waits in a queue until its partner is posted.
// With a memory space (engines on a device backend), a copy that touches the space's device memory
// goes through the space's copies (staged via host memory), never a host memmove on device memory.
#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <stdexcept>

#include "backend/registry.h"
#include "comm/staging.h"
#include "comm/transport_registry.h"
#include "meshmuon/comm.h"
#include "meshmuon/comm_transport.h"
#include "meshmuon/device.h"
#include "meshmuon/error.h"

namespace meshmuon {
namespace {

// One posted send or recv; `error` is set when its partner did not fit (count or type).
struct Match {
  bool done = false;
  std::string error;
};
struct Pending {
  P2pOp op;
  std::shared_ptr<Match> match;
};
// Unmatched sends and recvs, oldest first; shared with the ops so that an abandoned one can leave.
struct Queues {
  std::deque<Pending> sends, recvs;
};

class SingleP2pOp final : public TransportOp {
 public:
  explicit SingleP2pOp(std::weak_ptr<Queues> queues) : queues_(std::move(queues)) {}
  std::vector<std::shared_ptr<Match>> matches;

  bool test() override {
    for (const auto& m : matches)
      if (!m->error.empty()) throw std::runtime_error(m->error);
    return std::all_of(matches.begin(), matches.end(), [](const auto& m) { return m->done; });
  }
  // One rank, one thread: nothing can post the partner while a destructor waits, and a timeout
  // leaves nothing else in flight (the communicator stays usable).
  bool destructor_may_wait() const override { return false; }
  bool on_timeout() override { return false; }
  bool abandon() override {
    if (auto q = queues_.lock()) {
      const auto ours = [&](const Pending& p) { return std::find(matches.begin(), matches.end(), p.match) != matches.end(); };
      std::erase_if(q->sends, ours);
      std::erase_if(q->recvs, ours);
    }
    return true;
  }

 private:
  std::weak_ptr<Queues> queues_;
};

void copy_elems(detail::MemorySpace* space, void* dst, int64_t dst_off, const void* src, int64_t src_off, int64_t n,
                size_t elem) {
  if (n <= 0 || (dst == src && dst_off == src_off)) return;
  std::byte* d = static_cast<std::byte*>(dst) + dst_off * static_cast<int64_t>(elem);
  const std::byte* s = static_cast<const std::byte*>(src) + src_off * static_cast<int64_t>(elem);
  const size_t bytes = static_cast<size_t>(n) * elem;
  const bool dd = space && space->is_device(d), sd = space && space->is_device(s);
  if (!dd && !sd) {
    std::memmove(d, s, bytes);
    return;
  }
  std::vector<std::byte> host(bytes);  // through host memory (also makes overlapping ranges safe)
  if (sd) space->copy_to_host(host.data(), s, bytes);
  else std::memcpy(host.data(), s, bytes);
  if (dd) space->copy_to_device(d, host.data(), bytes);
  else std::memcpy(d, host.data(), bytes);
}

// Every collective completes during the call (nullptr op).
class SingleTransport final : public Transport {
 public:
  explicit SingleTransport(std::shared_ptr<detail::MemorySpace> space) : space_(std::move(space)) {}
  std::string_view backend() const override { return "single"; }
  bool device_buffers() const override { return space_ != nullptr && space_->has_devices(); }

  std::unique_ptr<TransportOp> all_to_all_v(InBuffer send, Counts send_counts, Counts send_displs, OutBuffer recv,
                                            Counts, Counts recv_displs) override {
    copy_elems(space_.get(), recv.data, recv_displs[0], send.data, send_displs[0], send_counts[0], comm_type_size(send.type));
    return nullptr;
  }
  std::unique_ptr<TransportOp> all_gather_v(InBuffer send, OutBuffer recv, Counts recv_counts,
                                            Counts recv_displs) override {
    copy_elems(space_.get(), recv.data, recv_displs[0], send.data, 0, recv_counts[0], comm_type_size(send.type));
    return nullptr;
  }
  std::unique_ptr<TransportOp> reduce_scatter_v(InBuffer send, OutBuffer recv, Counts recv_counts, ReduceOp) override {
    copy_elems(space_.get(), recv.data, 0, send.data, 0, recv_counts[0], comm_type_size(send.type));
    return nullptr;
  }
  std::unique_ptr<TransportOp> all_reduce(InBuffer send, OutBuffer recv, ReduceOp) override {
    copy_elems(space_.get(), recv.data, 0, send.data, 0, static_cast<int64_t>(send.count), comm_type_size(send.type));
    return nullptr;
  }
  std::unique_ptr<TransportOp> broadcast(OutBuffer, int) override { return nullptr; }
  std::unique_ptr<TransportOp> barrier() override { return nullptr; }
  std::shared_ptr<Transport> split(std::span<const int> colors, std::span<const int>, const std::string&) override {
    if (colors[0] < 0) return nullptr;
    return std::make_shared<SingleTransport>(space_);
  }
  std::unique_ptr<TransportOp> p2p(std::span<const P2pOp> ops) override {
    auto op = std::make_unique<SingleP2pOp>(queues_);
    for (const P2pOp& p : ops) op->matches.push_back(post_one(p));
    return op;
  }

 private:
  // Pairs `p` with the oldest unmatched op of the other kind, or queues it.
  std::shared_ptr<Match> post_one(const P2pOp& p) {
    auto mine = std::make_shared<Match>();
    std::deque<Pending>& partners = p.is_send ? queues_->recvs : queues_->sends;
    if (partners.empty()) {
      (p.is_send ? queues_->sends : queues_->recvs).push_back({p, mine});
      return mine;
    }
    Pending other = std::move(partners.front());
    partners.pop_front();
    const P2pOp& s = p.is_send ? p : other.op;
    const P2pOp& r = p.is_send ? other.op : p;
    if (s.buf.type != r.buf.type || s.buf.count > r.buf.count) {
      mine->error = detail::concat("a send of ", s.buf.count, " ", to_string(s.buf.type), " elements met a recv of ",
                                   r.buf.count, " ", to_string(r.buf.type),
                                   "; both ends must pass the same count and type");
      other.match->error = mine->error;
    } else {
      copy_elems(space_.get(), const_cast<void*>(r.buf.data), 0, s.buf.data, 0, static_cast<int64_t>(s.buf.count),
                 comm_type_size(s.buf.type));
    }
    mine->done = other.match->done = true;
    return mine;
  }

  std::shared_ptr<Queues> queues_ = std::make_shared<Queues>();
  std::shared_ptr<detail::MemorySpace> space_;  // null: host memory only
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() {
  return make_single_communicator(std::shared_ptr<detail::MemorySpace>());
}
std::unique_ptr<Communicator> make_single_communicator(std::shared_ptr<detail::MemorySpace> space) {
  return make_communicator(std::make_shared<SingleTransport>(std::move(space)), 0, 1, "world");
}

std::unique_ptr<Communicator> make_single_communicator(std::string_view device) {
  // The device names of the backend registry (backend/registry.h): a host backend ("cpu") needs no
  // memory space; a device backend's name ("cuda", "cuda:N") the process's device memory space.
  const detail::BackendRegistry& registry = detail::backend_registry();
  const std::optional<detail::BackendRegistry::DeviceName> d = registry.parse(device);
  MESHMUON_CHECK(d.has_value(), "[comm] make_single_communicator: device must be ", registry.device_names(), " (got '",
                 device, "')");
  const std::string& name = d->name;
  if (!registry.indexed(name)) return make_single_communicator();  // a host backend (cpu)
  std::shared_ptr<detail::MemorySpace> space = detail::default_memory_space();
  const std::string why = registry.why_missing(name);
  MESHMUON_CHECK_RUNTIME(space->has_devices(), "[comm] make_single_communicator('", device, "'): no usable ", registry.label(name),
                         " device in this process (", why.empty() ? std::string("no driver or no device visible") : why,
                         "); use device 'cpu'");
  space->check_device_index(d->index, detail::concat("[comm] make_single_communicator('", device, "')"));
  return make_single_communicator(std::move(space));
}

namespace detail {
void register_single_transport(TransportRegistry& r) {
  r.add("single", [] { return make_single_communicator(); });
}
}  // namespace detail

}  // namespace meshmuon
