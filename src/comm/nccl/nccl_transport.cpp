// The nccl transport (nccl_transport.h). An operation is: host buffers uploaded to device scratch,
// ncclGroupStart / the NCCL calls / ncclGroupEnd on the communicator's stream, device results of
// host receive buffers downloaded to pinned bounce buffers, then a CUDA event. Its test() polls
// ncclCommGetAsyncError (an asynchronous NCCL error fails the wait) and the event, and on
// completion copies bounce buffers into the host receive buffers. A timeout (Work's deadline) calls
// on_timeout(), which aborts every NCCL communicator of the root and its splits.
#include "comm/nccl/nccl_transport.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backend/cuda/shared/device_guard.h"
#include "comm/nccl/nccl_op.h"
#include "meshmuon/error.h"

namespace meshmuon {
namespace {

using detail::concat;
using detail::DeviceGuard;
using detail::NcclApi;
using detail::NcclShared;
using detail::throw_error;

using detail::nccl::check_cuda;
using detail::nccl::is_device_pointer;
using detail::nccl::nccl_op;
using detail::nccl::nccl_type;
using detail::nccl::NcclOp;

class NcclTransport final : public Transport {
 public:
  NcclTransport(std::shared_ptr<NcclShared> shared, ncclComm_t comm, int rank, int size)
      : shared_(std::move(shared)), comm_(comm), rank_(rank), size_(size) {
    DeviceGuard g(shared_->device);
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMalloc(&barrier_, sizeof(int32_t)), "cudaMalloc (barrier)");
    check_cuda(cudaMemset(barrier_, 0, sizeof(int32_t)), "cudaMemset (barrier)");
  }

  ~NcclTransport() override {
    if (shared_->aborted) return;  // NCCL may still use the stream and memory: leak them with the job
    try {
      DeviceGuard g(shared_->device);
      (void)cudaStreamSynchronize(stream_);
      const ncclResult_t r = shared_->api->comm_finalize(comm_);
      const bool finalized = (r == ncclSuccess || r == ncclInProgress) &&
                             shared_->settle(comm_, "ncclCommFinalize", std::chrono::seconds(10));
      shared_->forget(comm_);
      if (finalized) {
        (void)shared_->api->comm_destroy(comm_);
      } else {
        (void)shared_->api->comm_abort(comm_);
      }
      (void)cudaFree(barrier_);
      (void)cudaStreamDestroy(stream_);
    } catch (...) {
      // destructors do not throw; the communicator is gone either way
    }
  }

  std::string_view backend() const override { return "nccl"; }
  bool device_buffers() const override { return true; }

  // Later operations are enqueued on stream_ after this wait: the device orders them, the host does
  // not wait (Communicator::order_after).
  void order_after(void* event) override {
    if (shared_->aborted) throw std::runtime_error("the NCCL communicator was aborted after a timeout");
    DeviceGuard g(shared_->device);
    check_cuda(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
  }

  std::unique_ptr<TransportOp> all_to_all_v(InBuffer send, Counts sc, Counts sd, OutBuffer recv, Counts rc,
                                           Counts rd) override {
    return run([&](Ops& o) {
      const std::byte* s = o.in(send);
      std::byte* r = o.out(recv);
      const size_t es = comm_type_size(send.type);
      const ncclDataType_t t = nccl_type(send.type);
      return [=, this] {
        for (int j = 0; j < size_; ++j) {
          const auto u = static_cast<size_t>(j);
          if (rc[u] > 0) chk(api().recv(r + rd[u] * es, static_cast<size_t>(rc[u]), t, j, comm_, stream_), "ncclRecv");
          if (sc[u] > 0) chk(api().send(s + sd[u] * es, static_cast<size_t>(sc[u]), t, j, comm_, stream_), "ncclSend");
        }
      };
    });
  }

  std::unique_ptr<TransportOp> all_gather_v(InBuffer send, OutBuffer recv, Counts rc, Counts rd) override {
    return run([&](Ops& o) {
      const std::byte* s = o.in(send);
      std::byte* r = o.out(recv);
      const size_t es = comm_type_size(send.type);
      const ncclDataType_t t = nccl_type(send.type);
      bool equal_packed = true;
      for (size_t j = 0; j < rc.size(); ++j) equal_packed = equal_packed && rc[j] == rc[0] && rd[j] == rc[0] * static_cast<int64_t>(j);
      return [=, this] {
        if (equal_packed) {
          chk(api().all_gather(s, r, static_cast<size_t>(rc[0]), t, comm_, stream_), "ncclAllGather");
          return;
        }
        for (int j = 0; j < size_; ++j) {  // block j is broadcast from rank j (counts agree on every rank)
          const auto u = static_cast<size_t>(j);
          if (rc[u] > 0) chk(api().broadcast(s, r + rd[u] * es, static_cast<size_t>(rc[u]), t, j, comm_, stream_), "ncclBroadcast");
        }
      };
    });
  }

  std::unique_ptr<TransportOp> reduce_scatter_v(InBuffer send, OutBuffer recv, Counts rc, ReduceOp op) override {
    return run([&](Ops& o) {
      const std::byte* s = o.in(send);
      std::byte* r = o.out(recv);
      const size_t es = comm_type_size(send.type);
      const ncclDataType_t t = nccl_type(send.type);
      const ncclRedOp_t nop = nccl_op(op);
      bool equal = true;
      for (int64_t c : rc) equal = equal && c == rc[0];
      return [=, this] {
        if (equal) {
          chk(api().reduce_scatter(s, r, static_cast<size_t>(rc[0]), t, nop, comm_, stream_), "ncclReduceScatter");
          return;
        }
        int64_t off = 0;
        for (int j = 0; j < size_; ++j) {  // block j reduced onto rank j
          const auto u = static_cast<size_t>(j);
          if (rc[u] > 0) chk(api().reduce(s + off * es, r, static_cast<size_t>(rc[u]), t, nop, j, comm_, stream_), "ncclReduce");
          off += rc[u];
        }
      };
    });
  }

  std::unique_ptr<TransportOp> all_reduce(InBuffer send, OutBuffer recv, ReduceOp op) override {
    return run([&](Ops& o) {
      const std::byte* s = o.in(send);
      std::byte* r = o.out(recv);  // in place: the same scratch as s for a host buffer
      const ncclDataType_t t = nccl_type(send.type);
      const ncclRedOp_t nop = nccl_op(op);
      const size_t n = send.count;
      return [=, this] { chk(api().all_reduce(s, r, n, t, nop, comm_, stream_), "ncclAllReduce"); };
    });
  }

  std::unique_ptr<TransportOp> broadcast(OutBuffer buf, int root) override {
    return run([&](Ops& o) {
      std::byte* b = o.out(buf);
      const ncclDataType_t t = nccl_type(buf.type);
      const size_t n = buf.count;
      return [=, this] { chk(api().broadcast(b, b, n, t, root, comm_, stream_), "ncclBroadcast"); };
    });
  }

  std::unique_ptr<TransportOp> barrier() override {
    return run([&](Ops&) {
      return [this] { chk(api().all_reduce(barrier_, barrier_, 1, ncclInt32, ncclSum, comm_, stream_), "ncclAllReduce"); };
    });
  }

  std::unique_ptr<TransportOp> p2p(std::span<const P2pOp> ops) override {
    return run([&](Ops& o) {
      struct One {
        bool is_send;
        int peer;
        std::byte* data;
        size_t count;
        ncclDataType_t type;
      };
      std::vector<One> list;
      for (const P2pOp& p : ops) {
        std::byte* d = p.is_send ? const_cast<std::byte*>(o.in(p.buf))
                                 : o.out(OutBuffer(const_cast<void*>(p.buf.data), p.buf.type, p.buf.count));
        list.push_back({p.is_send, p.peer, d, p.buf.count, nccl_type(p.buf.type)});
      }
      return [list, this] {
        for (const One& x : list) {
          if (x.is_send) chk(api().send(x.data, x.count, x.type, x.peer, comm_, stream_), "ncclSend");
          else chk(api().recv(x.data, x.count, x.type, x.peer, comm_, stream_), "ncclRecv");
        }
      };
    });
  }

  std::shared_ptr<Transport> split(std::span<const int> colors, std::span<const int> keys,
                                           const std::string& name) override {
    DeviceGuard g(shared_->device);
    const int color = colors[static_cast<size_t>(rank_)], key = keys[static_cast<size_t>(rank_)];
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t sub = nullptr;
    shared_->check(comm_, api().comm_split(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, &config),
                   "ncclCommSplit");
    const bool parent_ok = shared_->settle(comm_, "ncclCommSplit", shared_->timeout);
    if (parent_ok && (color < 0 || sub == nullptr)) return nullptr;
    if (!parent_ok || !shared_->settle(sub, "ncclCommSplit", shared_->timeout)) {
      if (sub != nullptr) (void)api().comm_abort(sub);
      shared_->abort_all();
      throw std::runtime_error(concat("ncclCommSplit '", name, "' did not finish within the default timeout; NCCL aborted"));
    }
    int new_rank = 0, new_size = 0;
    for (size_t j = 0; j < colors.size(); ++j) {
      if (colors[j] != color) continue;
      new_size += 1;
      if (keys[j] < key || (keys[j] == key && static_cast<int>(j) < rank_)) new_rank += 1;
    }
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->comms.push_back(sub);
    }
    return detail::make_nccl_transport(shared_, sub, new_rank, new_size, name);
  }

  void on_timeout() override { shared_->abort_all(); }

  // Eager connection: NCCL connects its rings and trees at a communicator's first collective and
  // each point-to-point pair at its first send / receive. A warm-up at construction, under the
  // deadline, makes those connections: one 1-element all-reduce and, up to kEagerP2pRanks ranks, a
  // 1-element send and receive with every peer (grouped). A first step then starts connected, and
  // a peer that cannot connect fails the construction on every rank instead of hanging a step.
  // Above kEagerP2pRanks (every pair's buffers cost device memory) pairs connect at first use; the
  // engine's point-to-point runs on shard-group communicators, which are smaller.
  // MESHMUON_NCCL_CONNECT=lazy skips the warm-up.
  static constexpr int kEagerP2pRanks = 64;
  void connect_eagerly(const std::string& name) {
    const char* mode = std::getenv("MESHMUON_NCCL_CONNECT");
    if (mode != nullptr && std::string_view(mode) == "lazy") return;
    const bool p2p = size_ <= kEagerP2pRanks;
    auto op = run([&](Ops& o) {
      int32_t* recv = nullptr;
      if (p2p && size_ > 1) {
        check_cuda(cudaMalloc(reinterpret_cast<void**>(&recv), sizeof(int32_t) * static_cast<size_t>(size_)),
                   "cudaMalloc (warm-up)");
        o.keep(recv);
      }
      return [=, this] {
        chk(api().all_reduce(barrier_, barrier_, 1, ncclInt32, ncclSum, comm_, stream_), "ncclAllReduce");
        for (int j = 0; p2p && j < size_; ++j) {
          if (j == rank_) continue;
          chk(api().recv(recv + j, 1, ncclInt32, j, comm_, stream_), "ncclRecv");
          chk(api().send(barrier_, 1, ncclInt32, j, comm_, stream_), "ncclSend");
        }
      };
    });
    const auto deadline = std::chrono::steady_clock::now() + shared_->timeout;
    while (!op->test()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        shared_->abort_all();
        throw_error(concat("[nccl] rank ", shared_->world_rank, ": connecting communicator '", name, "' (rank ", rank_,
                           " of ", size_, ": an all-reduce", p2p ? " and a send / receive with every peer" : "",
                           ") did not finish within ", static_cast<double>(shared_->timeout.count()) / 1000.0,
                           " s; a peer died or cannot connect; NCCL aborted (MESHMUON_NCCL_CONNECT=lazy connects at "
                           "first use instead)"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  const NcclApi& api() const { return *shared_->api; }
  void chk(ncclResult_t r, const char* what) const { shared_->check(comm_, r, what); }

  // Resolves buffers to device pointers for one operation: device memory as is, host memory through
  // device scratch (uploaded from a pinned copy) and, for outputs, a pinned bounce downloaded after.
  class Ops {
   public:
    Ops(NcclOp& op, cudaStream_t stream) : op_(op), stream_(stream) {}
    const std::byte* in(const InBuffer& b) { return resolve(b.data, b.nbytes(), true); }
    void keep(void* device_scratch) { op_.scratch.device.push_back(device_scratch); }  // freed with the op
    // Host outputs are uploaded too: NCCL writes only the blocks, and the download must not
    // overwrite what lies between them (gaps, tails the contract leaves unwritten) with garbage.
    std::byte* out(const OutBuffer& b) {
      std::byte* d = resolve(b.data, b.nbytes(), true);
      if (b.nbytes() > 0 && !is_device_pointer(b.data)) downloads_.push_back({b.data, d, b.nbytes()});
      return d;
    }
    // After the NCCL calls: host outputs downloaded into pinned bounce buffers.
    void enqueue_downloads() {
      for (const Download& d : downloads_) {
        void* pinned = nullptr;
        check_cuda(cudaMallocHost(&pinned, d.bytes), "cudaMallocHost");
        op_.scratch.pinned.push_back(pinned);
        check_cuda(cudaMemcpyAsync(pinned, d.device, d.bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
        op_.copy_out_.push_back({d.host, pinned, d.bytes});
      }
    }

   private:
    struct Download {
      void* host;
      const void* device;
      size_t bytes;
    };
    std::byte* resolve(const void* p, size_t bytes, bool upload) {
      if (bytes == 0 || is_device_pointer(p)) return static_cast<std::byte*>(const_cast<void*>(p));
      for (const auto& [host, dev] : mapped_)
        if (host == p) return dev;  // in place: one scratch for both sides
      void* dev = nullptr;
      check_cuda(cudaMalloc(&dev, bytes), "cudaMalloc (host buffer scratch)");
      op_.scratch.device.push_back(dev);
      if (upload) {
        void* pinned = nullptr;
        check_cuda(cudaMallocHost(&pinned, bytes), "cudaMallocHost");
        op_.scratch.pinned.push_back(pinned);
        std::memcpy(pinned, p, bytes);
        check_cuda(cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
      }
      mapped_.push_back({p, static_cast<std::byte*>(dev)});
      return static_cast<std::byte*>(dev);
    }
    NcclOp& op_;
    cudaStream_t stream_;
    std::vector<std::pair<const void*, std::byte*>> mapped_;
    std::vector<Download> downloads_;
  };

  // prepare(Ops&) resolves buffers and returns the calls to make between ncclGroupStart / End.
  template <class Prepare>
  std::unique_ptr<TransportOp> run(Prepare&& prepare) {
    if (shared_->aborted) throw std::runtime_error("the NCCL communicator was aborted after a timeout");
    DeviceGuard g(shared_->device);
    auto op = std::make_unique<NcclOp>(shared_, comm_);
    check_cuda(cudaEventCreateWithFlags(&op->event_, cudaEventDisableTiming), "cudaEventCreate");
    Ops ops(*op, stream_);
    auto calls = prepare(ops);
    chk(api().group_start(), "ncclGroupStart");
    try {
      calls();
    } catch (...) {
      (void)api().group_end();
      throw;
    }
    chk(api().group_end(), "ncclGroupEnd");
    // Non-blocking communicator: the group may still be launching; wait (bounded) until it is enqueued.
    if (!shared_->settle(comm_, "ncclGroupEnd", shared_->timeout)) {
      shared_->abort_all();
      throw std::runtime_error("ncclGroupEnd did not finish enqueuing within the default timeout; NCCL aborted");
    }
    ops.enqueue_downloads();
    check_cuda(cudaEventRecord(op->event_, stream_), "cudaEventRecord");
    return op;
  }

  std::shared_ptr<NcclShared> shared_;
  ncclComm_t comm_;
  int rank_, size_;
  cudaStream_t stream_ = nullptr;
  int32_t* barrier_ = nullptr;
};

}  // namespace

namespace detail {

std::shared_ptr<Transport> make_nccl_transport(std::shared_ptr<NcclShared> shared, ncclComm_t comm, int rank, int size,
                                               const std::string& name) {
  auto t = std::make_shared<NcclTransport>(std::move(shared), comm, rank, size);
  t->connect_eagerly(name);
  return t;
}

}  // namespace detail
}  // namespace meshmuon
