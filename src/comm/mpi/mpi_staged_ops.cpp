// The mpi backend's staged operations (mpi_staging.h): each collective and the p2p batch as rounds
// of MPI calls over pinned staging buffers, and the staged_* factories that make them.
#include <algorithm>
#include <cstring>

#include "comm/mpi/mpi_counts.h"
#include "comm/mpi/mpi_staging.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {

namespace {

constexpr int kP2pTag = 0;  // the caller's send / recv (MPI's order per peer is the matching rule)
constexpr int kA2aTag = 1;  // all_to_all_v pieces

// MPI implementations may reject null buffers even for zero counts.
void* nonnull(void* p) {
  static char dummy = 0;
  return p != nullptr ? p : &dummy;
}

std::byte* at(const void* p, int64_t elements, size_t elem) {
  return static_cast<std::byte*>(const_cast<void*>(p)) + elements * static_cast<int64_t>(elem);
}

// Elements per round and direction (at least 1).
int64_t chunk_elements(const Staging& s, CommType t) {
  return std::max<int64_t>(1, static_cast<int64_t>(s.options().chunk_bytes / comm_type_size(t)));
}
// Elements per block and round when `size` blocks share a round.
int64_t block_elements(const Staging& s, CommType t) { return std::max<int64_t>(1, chunk_elements(s, t) / s.size()); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Elements of a block of `count` moved in round k.
int64_t piece(int64_t count, int64_t k, int64_t per) { return std::clamp<int64_t>(count - k * per, 0, per); }

// ---- element-wise: all_reduce, broadcast --------------------------------------------------------

class AllReduceOp final : public StagedOp {
 public:
  AllReduceOp(Staging& s, InBuffer send, OutBuffer recv, ReduceOp op)
      : StagedOp(s), send_(send), recv_(recv), op_(op), es_(comm_type_size(send.type)),
        per_(chunk_elements(s, send.type)), in_place_(send.data == recv.data),
        dev_send_(s.space().is_device(send.data)), dev_recv_(s.space().is_device(recv.data)) {
    rounds = static_cast<int>(std::max<int64_t>(1, ceil_div(static_cast<int64_t>(send.count), per_)));
  }
  void post(int k) override {
    const int64_t off = k * per_, m = piece(static_cast<int64_t>(send_.count), k, per_);
    const size_t bytes = static_cast<size_t>(m) * es_;
    const MPI_Datatype t = mpi_datatype(send_.type);
    const MPI_Op op = mpi_op(op_, send_.type);
    rbuf_ = dev_recv_ ? take(bytes) : at(recv_.data, off, es_);
    if (in_place_) {
      if (dev_recv_) load(rbuf_, at(recv_.data, off, es_), bytes, true);
      MESHMUON_CHECK_MPI(api.Iallreduce(MPI_IN_PLACE, nonnull(rbuf_), static_cast<int>(m), t, op, s_.comm(), add_request()));
      return;
    }
    void* sbuf = at(send_.data, off, es_);
    if (dev_send_) {
      sbuf = take(bytes);
      load(sbuf, at(send_.data, off, es_), bytes, true);
    }
    MESHMUON_CHECK_MPI(api.Iallreduce(nonnull(sbuf), nonnull(rbuf_), static_cast<int>(m), t, op, s_.comm(), add_request()));
  }
  void finish(int k) override {
    const int64_t off = k * per_, m = piece(static_cast<int64_t>(send_.count), k, per_);
    if (dev_recv_) store(at(recv_.data, off, es_), rbuf_, static_cast<size_t>(m) * es_, true);
    release_all();
  }

 private:
  InBuffer send_;
  OutBuffer recv_;
  ReduceOp op_;
  size_t es_;
  int64_t per_;
  bool in_place_, dev_send_, dev_recv_;
  void* rbuf_ = nullptr;
};

class BroadcastOp final : public StagedOp {
 public:
  BroadcastOp(Staging& s, OutBuffer buf, int root)
      : StagedOp(s), buf_(buf), root_(root), es_(comm_type_size(buf.type)), per_(chunk_elements(s, buf.type)),
        dev_(s.space().is_device(buf.data)) {
    rounds = static_cast<int>(std::max<int64_t>(1, ceil_div(static_cast<int64_t>(buf.count), per_)));
  }
  void post(int k) override {
    const int64_t off = k * per_, m = piece(static_cast<int64_t>(buf_.count), k, per_);
    const size_t bytes = static_cast<size_t>(m) * es_;
    stage_ = at(buf_.data, off, es_);
    if (dev_) {
      stage_ = take(bytes);
      if (s_.rank() == root_) load(stage_, at(buf_.data, off, es_), bytes, true);
    }
    MESHMUON_CHECK_MPI(api.Ibcast(nonnull(stage_), static_cast<int>(m), mpi_datatype(buf_.type), root_, s_.comm(),
                               add_request()));
  }
  void finish(int k) override {
    const int64_t off = k * per_, m = piece(static_cast<int64_t>(buf_.count), k, per_);
    if (dev_ && s_.rank() != root_) store(at(buf_.data, off, es_), stage_, static_cast<size_t>(m) * es_, true);
    release_all();
  }

 private:
  OutBuffer buf_;
  int root_;
  size_t es_;
  int64_t per_;
  bool dev_;
  void* stage_ = nullptr;
};

// ---- blocked collectives: reduce_scatter_v, all_gather_v ---------------------------------------

// Rounds of `per` elements per block over counts every rank knows.
int blocked_rounds(std::span<const int64_t> counts, int64_t per) {
  int64_t most = 0;
  for (int64_t c : counts) most = std::max(most, c);
  return static_cast<int>(std::max<int64_t>(1, ceil_div(most, per)));
}

class ReduceScatterOp final : public StagedOp {
 public:
  ReduceScatterOp(Staging& s, InBuffer send, OutBuffer recv, std::span<const int64_t> counts, ReduceOp op)
      : StagedOp(s), send_(send), recv_(recv), counts_(counts.begin(), counts.end()), offsets_(packed_displs(counts)),
        op_(op), es_(comm_type_size(send.type)), per_(block_elements(s, send.type)),
        dev_send_(s.space().is_device(send.data)), dev_recv_(s.space().is_device(recv.data)) {
    rounds = blocked_rounds(counts_, per_);
  }
  void post(int k) override {
    std::vector<int> pieces(counts_.size());
    int64_t total = 0;
    for (size_t j = 0; j < counts_.size(); ++j) total += pieces[j] = static_cast<int>(piece(counts_[j], k, per_));
    std::byte* sbuf = static_cast<std::byte*>(take(static_cast<size_t>(total) * es_));
    size_t at_bytes = 0;
    for (size_t j = 0; j < counts_.size(); ++j) {
      const size_t bytes = static_cast<size_t>(pieces[j]) * es_;
      load(sbuf + at_bytes, at(send_.data, offsets_[j] + k * per_, es_), bytes, dev_send_);
      at_bytes += bytes;
    }
    mine_ = pieces[static_cast<size_t>(s_.rank())];
    rbuf_ = take(static_cast<size_t>(mine_) * es_);
    MESHMUON_CHECK_MPI(api.Ireduce_scatter(nonnull(sbuf), nonnull(rbuf_), pieces.data(), mpi_datatype(send_.type),
                                        mpi_op(op_, send_.type), s_.comm(), add_request()));
    counts_int_ = std::move(pieces);  // MPI reads the counts until completion
  }
  void finish(int k) override {
    store(at(recv_.data, k * per_, es_), rbuf_, static_cast<size_t>(mine_) * es_, dev_recv_);
    release_all();
  }

 private:
  InBuffer send_;
  OutBuffer recv_;
  std::vector<int64_t> counts_, offsets_;
  std::vector<int> counts_int_;
  ReduceOp op_;
  size_t es_;
  int64_t per_;
  bool dev_send_, dev_recv_;
  int64_t mine_ = 0;
  void* rbuf_ = nullptr;
};

class AllGatherOp final : public StagedOp {
 public:
  AllGatherOp(Staging& s, InBuffer send, OutBuffer recv, std::span<const int64_t> counts,
              std::span<const int64_t> displs)
      : StagedOp(s), send_(send), recv_(recv), counts_(counts.begin(), counts.end()),
        displs_(displs.begin(), displs.end()), es_(comm_type_size(send.type)), per_(block_elements(s, send.type)),
        dev_send_(s.space().is_device(send.data)), dev_recv_(s.space().is_device(recv.data)) {
    rounds = blocked_rounds(counts_, per_);
  }
  void post(int k) override {
    const size_t n = counts_.size();
    pieces_.assign(n, 0);
    packed_.assign(n, 0);
    int total = 0;
    for (size_t j = 0; j < n; ++j) {
      pieces_[j] = static_cast<int>(piece(counts_[j], k, per_));
      packed_[j] = total;
      total += pieces_[j];
    }
    const int mine = pieces_[static_cast<size_t>(s_.rank())];
    void* sbuf = take(static_cast<size_t>(mine) * es_);
    load(sbuf, at(send_.data, k * per_, es_), static_cast<size_t>(mine) * es_, dev_send_);
    rbuf_ = take(static_cast<size_t>(total) * es_);
    MESHMUON_CHECK_MPI(api.Iallgatherv(nonnull(sbuf), mine, mpi_datatype(send_.type), nonnull(rbuf_), pieces_.data(),
                                    packed_.data(), mpi_datatype(send_.type), s_.comm(), add_request()));
  }
  void finish(int k) override {
    for (size_t j = 0; j < counts_.size(); ++j)
      store(at(recv_.data, displs_[j] + k * per_, es_), at(rbuf_, packed_[j], es_),
            static_cast<size_t>(pieces_[j]) * es_, dev_recv_);
    release_all();
  }

 private:
  InBuffer send_;
  OutBuffer recv_;
  std::vector<int64_t> counts_, displs_;
  std::vector<int> pieces_, packed_;
  size_t es_;
  int64_t per_;
  bool dev_send_, dev_recv_;
  void* rbuf_ = nullptr;
};

// ---- all_to_all_v: send / recv pieces per pair ---------------------------------------------------

class AllToAllOp final : public StagedOp {
 public:
  AllToAllOp(Staging& s, InBuffer send, std::span<const int64_t> sc, std::span<const int64_t> sd, OutBuffer recv,
             std::span<const int64_t> rc, std::span<const int64_t> rd)
      : StagedOp(s), send_(send), recv_(recv), sc_(sc.begin(), sc.end()), sd_(sd.begin(), sd.end()),
        rc_(rc.begin(), rc.end()), rd_(rd.begin(), rd.end()), es_(comm_type_size(send.type)),
        per_(block_elements(s, send.type)), dev_send_(s.space().is_device(send.data)),
        dev_recv_(s.space().is_device(recv.data)) {
    int64_t most = 0;  // this rank's rounds: only the two ends of a pair must agree on its pieces
    for (size_t j = 0; j < sc_.size(); ++j) most = std::max({most, sc_[j], rc_[j]});
    rounds = static_cast<int>(ceil_div(most, per_));
  }
  void post(int k) override {
    const size_t n = sc_.size();
    int64_t rtotal = 0, stotal = 0;
    for (size_t j = 0; j < n; ++j) rtotal += piece(rc_[j], k, per_), stotal += piece(sc_[j], k, per_);
    rbuf_ = take(static_cast<size_t>(rtotal) * es_);
    std::byte* sbuf = static_cast<std::byte*>(take(static_cast<size_t>(stotal) * es_));
    const MPI_Datatype t = mpi_datatype(send_.type);
    int64_t at_r = 0, at_s = 0;
    for (size_t j = 0; j < n; ++j) {  // receives first
      const int64_t m = piece(rc_[j], k, per_);
      if (m == 0) continue;
      MESHMUON_CHECK_MPI(api.Irecv(at(rbuf_, at_r, es_), static_cast<int>(m), t, static_cast<int>(j), kA2aTag, s_.comm(),
                                add_request()));
      at_r += m;
    }
    for (size_t j = 0; j < n; ++j) {
      const int64_t m = piece(sc_[j], k, per_);
      if (m == 0) continue;
      std::byte* p = sbuf + at_s * static_cast<int64_t>(es_);
      load(p, at(send_.data, sd_[j] + k * per_, es_), static_cast<size_t>(m) * es_, dev_send_);
      MESHMUON_CHECK_MPI(api.Isend(p, static_cast<int>(m), t, static_cast<int>(j), kA2aTag, s_.comm(), add_request()));
      at_s += m;
    }
  }
  void finish(int k) override {
    int64_t at_r = 0;
    for (size_t j = 0; j < rc_.size(); ++j) {
      const int64_t m = piece(rc_[j], k, per_);
      store(at(recv_.data, rd_[j] + k * per_, es_), at(rbuf_, at_r, es_), static_cast<size_t>(m) * es_, dev_recv_);
      at_r += m;
    }
    release_all();
  }

 private:
  InBuffer send_;
  OutBuffer recv_;
  std::vector<int64_t> sc_, sd_, rc_, rd_;
  size_t es_;
  int64_t per_;
  bool dev_send_, dev_recv_;
  void* rbuf_ = nullptr;
};

// ---- barrier, send / recv batches -----------------------------------------------------------------

class BarrierOp final : public StagedOp {
 public:
  explicit BarrierOp(Staging& s) : StagedOp(s) {}
  void post(int) override { MESHMUON_CHECK_MPI(api.Ibarrier(s_.comm(), add_request())); }
  void finish(int) override {}
};

// Staged whole: device buffers through one staging buffer each, host buffers used directly.
class P2pBatchOp final : public StagedOp {
 public:
  P2pBatchOp(Staging& s, std::span<const P2pOp> ops) : StagedOp(s), ops_(ops.begin(), ops.end()) {
    for (const P2pOp& o : ops_) device_.push_back(s.space().is_device(o.buf.data));
  }
  void post(int) override {
    stage_.assign(ops_.size(), nullptr);
    for (size_t i = 0; i < ops_.size(); ++i) {
      const P2pOp& o = ops_[i];
      const size_t es = comm_type_size(o.buf.type);
      void* data = const_cast<void*>(o.buf.data);
      if (device_[i]) {
        data = stage_[i] = take(o.buf.nbytes());
        if (o.is_send) load(data, o.buf.data, o.buf.nbytes(), true);
      }
      const MPI_Datatype t = mpi_datatype(o.buf.type);
      for (const MpiPiece& p : mpi_pieces(static_cast<int64_t>(o.buf.count))) {
        void* d = nonnull(at(data, p.offset, es));
        if (o.is_send) {
          MESHMUON_CHECK_MPI(api.Isend(d, p.count, t, o.peer, kP2pTag, s_.comm(), add_request()));
        } else {
          MESHMUON_CHECK_MPI(api.Irecv(d, p.count, t, o.peer, kP2pTag, s_.comm(), add_request()));
        }
      }
    }
  }
  void finish(int) override {
    for (size_t i = 0; i < ops_.size(); ++i)
      if (device_[i] && !ops_[i].is_send)
        store(const_cast<void*>(ops_[i].buf.data), stage_[i], ops_[i].buf.nbytes(), true);
    release_all();
  }

 private:
  std::vector<P2pOp> ops_;
  std::vector<bool> device_;
  std::vector<void*> stage_;
};

}  // namespace

std::shared_ptr<StagedOp> staged_all_to_all_v(Staging& s, InBuffer send, std::span<const int64_t> send_counts,
                                              std::span<const int64_t> send_displs, OutBuffer recv,
                                              std::span<const int64_t> recv_counts,
                                              std::span<const int64_t> recv_displs) {
  return std::make_shared<AllToAllOp>(s, send, send_counts, send_displs, recv, recv_counts, recv_displs);
}
std::shared_ptr<StagedOp> staged_all_gather_v(Staging& s, InBuffer send, OutBuffer recv,
                                              std::span<const int64_t> recv_counts,
                                              std::span<const int64_t> recv_displs) {
  return std::make_shared<AllGatherOp>(s, send, recv, recv_counts, recv_displs);
}
std::shared_ptr<StagedOp> staged_reduce_scatter_v(Staging& s, InBuffer send, OutBuffer recv,
                                                  std::span<const int64_t> recv_counts, ReduceOp op) {
  return std::make_shared<ReduceScatterOp>(s, send, recv, recv_counts, op);
}
std::shared_ptr<StagedOp> staged_all_reduce(Staging& s, InBuffer send, OutBuffer recv, ReduceOp op) {
  return std::make_shared<AllReduceOp>(s, send, recv, op);
}
std::shared_ptr<StagedOp> staged_broadcast(Staging& s, OutBuffer buf, int root) {
  return std::make_shared<BroadcastOp>(s, buf, root);
}
std::shared_ptr<StagedOp> staged_barrier(Staging& s) { return std::make_shared<BarrierOp>(s); }
std::shared_ptr<StagedOp> staged_p2p(Staging& s, std::span<const P2pOp> ops) {
  return std::make_shared<P2pBatchOp>(s, ops);
}

}  // namespace meshmuon::detail
