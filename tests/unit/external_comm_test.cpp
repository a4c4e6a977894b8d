// The external communicator (include/meshmuon/comm_transport.h) over an in-process transport: N ranks
// are N threads, each with its own communicator over a shared hub that completes a collective once
// every rank has posted it. Checks what the Communicator base adds on top of any transport: results,
// byte counters equal to the comm_bytes_* predictors, splits, the deadline (a rank that never posts
// makes the others' waits throw meshmuon::Error naming rank, op and label, and then nothing more is
// posted), and a transport failure surfacing as meshmuon::Error. The Python c10d transport is tested in
// tests/python/multirank/test_torchrun.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "meshmuon/comm.h"
#include "meshmuon/comm_transport.h"
#include "meshmuon/error.h"

namespace meshmuon {
namespace {

using namespace std::chrono_literals;

// One rank's arguments of a posted collective.
struct Call {
  std::string op;
  InBuffer send;
  OutBuffer recv;
  std::vector<int64_t> send_counts, send_displs, recv_counts, recv_displs;
};

// Completes collective number k (per group of ranks) once all its ranks posted their k-th call.
class Hub {
 public:
  explicit Hub(int size) : size_(size) {}

  std::shared_ptr<std::atomic<bool>> post(int rank, int64_t seq, Call call) {
    std::lock_guard<std::mutex> lock(mu_);
    Pending& p = pending_[seq];
    if (p.calls.empty()) p.calls.resize(static_cast<size_t>(size_)), p.done = std::make_shared<std::atomic<bool>>(false);
    p.calls[static_cast<size_t>(rank)] = std::move(call);
    if (++p.arrived == size_) {
      run(p.calls);
      p.done->store(true);
      auto done = p.done;
      pending_.erase(seq);
      return done;
    }
    return p.done;
  }

 private:
  struct Pending {
    int arrived = 0;
    std::vector<Call> calls;
    std::shared_ptr<std::atomic<bool>> done;
  };

  static void run(std::vector<Call>& calls) {
    const std::string& op = calls[0].op;
    for (const Call& c : calls)
      if (c.op != op) throw std::runtime_error("ranks posted different ops");
    const size_t n = calls.size();
    if (op == "all_to_all") {
      for (size_t i = 0; i < n; ++i)
        for (size_t j = 0; j < n; ++j) {
          const size_t es = comm_type_size(calls[i].send.type);
          std::memcpy(static_cast<char*>(calls[j].recv.data) + calls[j].recv_displs[i] * es,
                      static_cast<const char*>(calls[i].send.data) + calls[i].send_displs[j] * es,
                      static_cast<size_t>(calls[i].send_counts[j]) * es);
        }
    } else if (op == "all_gather") {
      for (size_t i = 0; i < n; ++i)
        for (size_t j = 0; j < n; ++j) {
          const size_t es = comm_type_size(calls[i].send.type);
          std::memcpy(static_cast<char*>(calls[j].recv.data) + calls[j].recv_displs[i] * es, calls[i].send.data,
                      calls[i].send.count * es);
        }
    } else if (op == "all_reduce") {  // fp32 sum, rank order
      std::vector<float> sum(calls[0].send.count, 0.0f);
      for (const Call& c : calls)
        for (size_t k = 0; k < sum.size(); ++k) sum[k] += static_cast<const float*>(c.send.data)[k];
      for (const Call& c : calls) std::memcpy(c.recv.data, sum.data(), sum.size() * sizeof(float));
    } else if (op != "barrier") {
      throw std::runtime_error("op " + op + " is not in the test hub");
    }
  }

  int size_;
  std::mutex mu_;
  std::map<int64_t, Pending> pending_;
};

class HubOp final : public TransportOp {
 public:
  explicit HubOp(std::shared_ptr<std::atomic<bool>> done) : done_(std::move(done)) {}
  bool test() override { return done_->load(); }

 private:
  std::shared_ptr<std::atomic<bool>> done_;
};

class HubTransport final : public Transport {
 public:
  HubTransport(std::shared_ptr<Hub> hub, int rank, bool device = false)
      : hub_(std::move(hub)), rank_(rank), device_(device) {}
  std::string_view backend() const override { return "hub"; }
  bool device_buffers() const override { return device_; }

  std::unique_ptr<TransportOp> all_to_all_v(InBuffer send, Counts sc, Counts sd, OutBuffer recv, Counts rc,
                                           Counts rd) override {
    return post({"all_to_all", send, recv, vec(sc), vec(sd), vec(rc), vec(rd)});
  }
  std::unique_ptr<TransportOp> all_gather_v(InBuffer send, OutBuffer recv, Counts rc, Counts rd) override {
    return post({"all_gather", send, recv, {}, {}, vec(rc), vec(rd)});
  }
  std::unique_ptr<TransportOp> reduce_scatter_v(InBuffer, OutBuffer, Counts, ReduceOp) override {
    throw std::runtime_error("the test transport has no reduce_scatter");
  }
  std::unique_ptr<TransportOp> all_reduce(InBuffer send, OutBuffer recv, ReduceOp op) override {
    if (op != ReduceOp::Sum || send.type != CommType::F32) throw std::runtime_error("only fp32 sums");
    return post({"all_reduce", send, recv, {}, {}, {}, {}});
  }
  std::unique_ptr<TransportOp> broadcast(OutBuffer, int) override { throw std::runtime_error("no broadcast"); }
  std::unique_ptr<TransportOp> barrier() override { return post({"barrier", {}, {}, {}, {}, {}, {}}); }
  std::unique_ptr<TransportOp> p2p(std::span<const P2pOp>) override { throw std::runtime_error("no p2p"); }
  std::shared_ptr<Transport> split(std::span<const int> colors, std::span<const int> keys,
                                           const std::string&) override {
    // Every rank computes the same groups; a group's hub is shared through the parent hub's registry.
    const int color = colors[static_cast<size_t>(rank_)];
    if (color < 0) return nullptr;
    std::vector<std::pair<int, int>> members;  // (key, rank)
    for (size_t j = 0; j < colors.size(); ++j)
      if (colors[j] == color) members.emplace_back(keys[j], static_cast<int>(j));
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i].second == rank_) new_rank = static_cast<int>(i);
    return std::make_shared<HubTransport>(child(color, static_cast<int>(members.size()), splits_++), new_rank, device_);
  }

 private:
  static std::vector<int64_t> vec(Counts c) { return {c.begin(), c.end()}; }
  std::unique_ptr<TransportOp> post(Call call) { return std::make_unique<HubOp>(hub_->post(rank_, seq_++, std::move(call))); }

  std::shared_ptr<Hub> child(int color, int size, int nth) {
    static std::mutex mu;
    static std::map<std::tuple<const Hub*, int, int>, std::shared_ptr<Hub>> registry;
    std::lock_guard<std::mutex> lock(mu);
    auto& h = registry[{hub_.get(), nth, color}];
    if (!h) h = std::make_shared<Hub>(size);
    return h;
  }

  std::shared_ptr<Hub> hub_;
  int rank_;
  bool device_;
  int64_t seq_ = 0;
  int splits_ = 0;
};

// Runs body(rank, comm) on `size` threads, each with its own communicator; rethrows nothing: bodies
// report through gtest (EXPECT_* is thread-safe).
template <class Body>
void run_ranks(int size, Body body, std::chrono::milliseconds timeout = 10s, bool device = false) {
  auto hub = std::make_shared<Hub>(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      auto comm = make_communicator(std::make_shared<HubTransport>(hub, r, device), r, size);
      comm->set_default_timeout(timeout);
      body(r, *comm);
    });
  for (std::thread& t : threads) t.join();
}

TEST(ExternalComm, CollectivesMoveTheRightDataAndCountBytes) {
  constexpr int kSize = 3;
  run_ranks(kSize, [](int r, Communicator& comm) {
    EXPECT_EQ(comm.backend(), "hub");
    // all_to_all_v: rank r sends (j + 1) values r*100 + j*10 + k to rank j
    std::vector<int64_t> sc(kSize), rc(kSize);
    for (int j = 0; j < kSize; ++j) sc[j] = j + 1, rc[j] = r + 1;
    std::vector<float> send, recv(static_cast<size_t>(kSize * (r + 1)), -1.0f);
    for (int j = 0; j < kSize; ++j)
      for (int k = 0; k <= j; ++k) send.push_back(static_cast<float>(r * 100 + j * 10 + k));
    comm.all_to_all_v(send, sc, packed_displs(sc), recv, rc, packed_displs(rc), "a2a").wait();
    for (int i = 0; i < kSize; ++i)
      for (int k = 0; k <= r; ++k)
        EXPECT_EQ(recv[static_cast<size_t>(i * (r + 1) + k)], static_cast<float>(i * 100 + r * 10 + k));
    const ByteCount a2a = comm_bytes_all_to_all_v(r, sc, rc, sizeof(float));

    // all_gather_v with uneven (and one empty) blocks
    const std::vector<int64_t> counts = {2, 0, 3};
    std::vector<float> mine(static_cast<size_t>(counts[r]), static_cast<float>(r + 1));
    std::vector<float> all(5, 0.0f);
    comm.all_gather_v(std::span<float>(mine), all, counts, "ag").wait();
    EXPECT_EQ(all, (std::vector<float>{1, 1, 3, 3, 3}));
    const ByteCount ag = comm_bytes_all_gather_v(r, counts, sizeof(float));

    // all_reduce in place
    std::vector<float> x = {static_cast<float>(r), 1.0f};
    comm.all_reduce(std::span<float>(x), ReduceOp::Sum, "ar").wait();
    EXPECT_EQ(x, (std::vector<float>{3.0f, 3.0f}));
    const ByteCount ar = comm_bytes_all_reduce(r, kSize, 2, sizeof(float));

    const CommCounters c = comm.counters();
    EXPECT_EQ(c.bytes_sent, a2a.sent + ag.sent + ar.sent);
    EXPECT_EQ(c.bytes_recv, a2a.recv + ag.recv + ar.recv);
    EXPECT_EQ(c.collectives, 3u);
  });
}

TEST(ExternalComm, SplitGivesGroupsOrderedByKey) {
  run_ranks(4, [](int r, Communicator& comm) {
    // colors: {0, 1, 0, -1}; keys reverse the order inside color 0
    const int colors[4] = {0, 1, 0, -1};
    auto sub = comm.split(colors[r], -r, "sub");
    if (r == 3) {
      EXPECT_EQ(sub, nullptr);
      return;
    }
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->name(), "sub");
    EXPECT_EQ(sub->size(), r == 1 ? 1 : 2);
    const int want_rank[3] = {1, 0, 0};  // color 0 ordered by key: rank 2 (key -2), then rank 0
    EXPECT_EQ(sub->rank(), want_rank[r]);
    std::vector<float> x = {static_cast<float>(r + 1)};
    sub->all_reduce(std::span<float>(x), ReduceOp::Sum, "in sub").wait();
    EXPECT_EQ(x[0], r == 1 ? 2.0f : 4.0f);
  });
}

// Whether the communicator carries device memory is the transport's answer (host only unless it
// says otherwise), kept by its splits.
TEST(ExternalComm, DeviceBuffersAreTheTransportsAnswer) {
  for (const bool device : {false, true})
    run_ranks(
        2,
        [device](int r, Communicator& comm) {
          EXPECT_EQ(comm.device_buffers(), device);
          auto sub = comm.split(0, r, "sub");
          ASSERT_NE(sub, nullptr);
          EXPECT_EQ(sub->device_buffers(), device);
        },
        10s, device);
}

TEST(ExternalComm, MissingRankTimesOutNamingTheOpAndThenRefusesToPost) {
  run_ranks(2, [](int r, Communicator& comm) {
    if (r == 1) return;  // never posts: rank 0's wait must end at its deadline, not hang
    std::vector<float> x = {1.0f};
    Work w = comm.all_reduce(std::span<float>(x), ReduceOp::Sum, "step agreement");
    try {
      w.wait(100ms);
      ADD_FAILURE() << "the wait did not time out";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("[hub] rank 0"), std::string::npos) << what;
      EXPECT_NE(what.find("all_reduce 'step agreement' timed out"), std::string::npos) << what;
    }
    try {
      (void)comm.barrier("after");
      ADD_FAILURE() << "posting after a timeout did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("unusable"), std::string::npos) << e.what();
    }
  }, 5s);
}

TEST(ExternalComm, TransportFailureIsAMeshmuonErrorNamingTheOp) {
  run_ranks(1, [](int, Communicator& comm) {
    std::vector<float> send = {1.0f}, recv = {0.0f};
    const std::vector<int64_t> counts = {1};
    try {
      (void)comm.reduce_scatter_v(send, recv, counts, ReduceOp::Sum, "grads");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("reduce_scatter 'grads'"), std::string::npos) << what;
      EXPECT_NE(what.find("the test transport has no reduce_scatter"), std::string::npos) << what;
    }
    EXPECT_THROW(make_communicator(nullptr, 0, 1), std::invalid_argument);
    EXPECT_THROW(make_communicator(std::make_shared<HubTransport>(std::make_shared<Hub>(1), 0), 1, 1),
                 std::invalid_argument);
  });
}

}  // namespace
}  // namespace meshmuon
