// The nccl communicator (meshmuon/comm_nccl.h).
// - Everywhere: make_communicator("nccl") / make_nccl_communicator fail with a meshmuon::Error that
//   names the cause: "built without CUDA" in a CPU-only build, "no CUDA device" on a machine
//   without one (CUDA builds), and (builds with the nccl communicator) libnccl missing names
//   nvidia-nccl-cu13, while the real libnccl loads with every symbol resolved (no GPU needed).
// - On a GPU (skipped without one, with the reason): every operation at world size 1 on device and
//   host buffers, a split, and a wait that times out (a recv nobody sends) aborting NCCL with an
//   error naming rank, op and label. scripts/gpu_check.sh runs this binary and counts skips as failures.
// - On two devices (NcclTwoDevices; the CUDA emulation's NCCL gives two): two ranks as threads, the
//   collectives and meshmuon::Optimizer at dp_shard=2 bitwise vs LocalOptimizer on one device.
// - The emulated entry (nccl_comm_test_emu) runs the device cases on tests/cuda_emu's NCCL.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <tuple>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <numeric>
#include <string>
#include <vector>

#include "meshmuon/comm.h"
#include "meshmuon/comm_nccl.h"
#include "meshmuon/error.h"
#include "meshmuon/inventory.h"
#include "meshmuon/local_optimizer.h"
#include "meshmuon/optimizer.h"
#include "test_support.h"

#if MESHMUON_TEST_CUDA
#include <cuda_runtime_api.h>
#endif
#if MESHMUON_TEST_NCCL
#include "comm/nccl/nccl_probe.h"
#endif

namespace meshmuon {
namespace {

std::vector<std::byte> self_exchange(std::span<const std::byte> mine) { return {mine.begin(), mine.end()}; }

// The bootstrap exchange among `size` ranks played by threads of this process: an all-gather of
// equal blobs in rank order (a rank that never arrives makes the others throw after 30 s).
class ThreadExchange {
 public:
  explicit ThreadExchange(int size) : size_(size), blobs_(static_cast<size_t>(size)) {}
  CommExchange for_rank(int rank) {
    return [this, rank](std::span<const std::byte> mine) {
      std::unique_lock lock(mu_);
      ++calls_;
      blobs_[static_cast<size_t>(rank)].assign(mine.begin(), mine.end());
      cv_.notify_all();
      if (!cv_.wait_for(lock, std::chrono::seconds(30), [&] { return calls_ == size_; }))
        throw std::runtime_error("ThreadExchange: a rank never joined the exchange");
      std::vector<std::byte> all;
      for (const auto& b : blobs_) all.insert(all.end(), b.begin(), b.end());
      return all;
    };
  }
  int calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }

 private:
  int size_, calls_ = 0;
  std::vector<std::vector<std::byte>> blobs_;
  std::mutex mu_;
  std::condition_variable cv_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a meshmuon::Error: ") + e.what();
  }
  return "no error";
}

TEST(NcclComm, UnavailableGivesAClearError) {
#if !MESHMUON_TEST_CUDA
  EXPECT_FALSE(nccl_available());
  for (const std::string& msg : {error_of([] { (void)make_communicator("nccl"); }),
                                 error_of([] { (void)make_nccl_communicator(0, 1, self_exchange); })}) {
    EXPECT_NE(msg.find("[nccl] meshmuon was built without CUDA"), std::string::npos) << msg;
  }
#else
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) GTEST_SKIP() << "a CUDA device is present";
  (void)cudaGetLastError();
  for (const std::string& msg : {error_of([] { (void)make_communicator("nccl"); }),
                                 error_of([] { (void)make_nccl_communicator(0, 1, self_exchange); })}) {
    if (nccl_available()) {
      EXPECT_NE(msg.find("[nccl] rank 0: no CUDA device: "), std::string::npos) << msg;
    } else {
      EXPECT_NE(msg.find("[nccl] meshmuon was built without the NCCL headers"), std::string::npos) << msg;
    }
  }
#endif
}

#if MESHMUON_TEST_NCCL
// Ranks that cannot prepare (here: no CUDA device) still join the one bootstrap exchange, so a
// peer that could prepare is not left waiting in it; each throws its own error.
TEST(NcclComm, FailingRanksStillJoinTheExchange) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) GTEST_SKIP() << "a CUDA device is present";
  (void)cudaGetLastError();
  ThreadExchange ex(2);
  std::string msgs[2];
  std::thread peer([&] { msgs[1] = error_of([&] { (void)make_nccl_communicator(1, 2, ex.for_rank(1)); }); });
  msgs[0] = error_of([&] { (void)make_nccl_communicator(0, 2, ex.for_rank(0)); });
  peer.join();
  EXPECT_EQ(ex.calls(), 2);  // before: a failing rank threw before the exchange (0 calls)
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(msgs[r].find("[nccl] rank " + std::to_string(r) + ": no CUDA device: "), std::string::npos) << msgs[r];
}

TEST(NcclLoader, MissingLibraryNamesTheWheel) {
  const std::string msg = error_of([] { (void)detail::nccl_probe("/nonexistent/libnccl.so.2"); });
  EXPECT_NE(msg.find("[nccl] could not load libnccl; tried /nonexistent/libnccl.so.2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nvidia-nccl-cu13"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MESHMUON_NCCL_LIBRARY"), std::string::npos) << msg;
}

TEST(NcclLoader, RealLibraryResolvesEverySymbol) {
  std::string found;
  const std::string msg = error_of([&] { found = detail::nccl_probe(nullptr); });
  if (msg != "no error") GTEST_SKIP() << "no libnccl on this machine: " << msg;
  EXPECT_NE(found.find("libnccl.so"), std::string::npos) << found;
  EXPECT_NE(found.find("(NCCL 2."), std::string::npos) << found;
}

// ---- on a device ---------------------------------------------------------------------------------

bool have_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

template <class T> struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<T>& v) : n(v.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  InBuffer in() const { return InBuffer(p, CommTypeOf<T>::value, n); }
  OutBuffer out() const { return OutBuffer(p, CommTypeOf<T>::value, n); }
};

class NcclDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device (the nccl communicator runs on a GPU only)";
    c = make_nccl_communicator(0, 1, self_exchange);
    c->set_default_timeout(std::chrono::seconds(20));
  }
  std::unique_ptr<Communicator> c;
};

// Rank 1 names a device that does not exist; rank 0 could prepare. Both throw (no hang): rank 1
// its own error, rank 0 one naming rank 1 and its reason.
TEST_F(NcclDevice, APeerThatCannotPrepareFailsEveryRank) {
  ThreadExchange ex(2);
  std::string msgs[2];
  std::thread peer([&] { msgs[1] = error_of([&] { (void)make_nccl_communicator(1, 2, ex.for_rank(1), 999); }); });
  msgs[0] = error_of([&] { (void)make_nccl_communicator(0, 2, ex.for_rank(0)); });
  peer.join();
  EXPECT_EQ(ex.calls(), 2);
  EXPECT_NE(msgs[1].find("[nccl] rank 1: device 999 does not exist"), std::string::npos) << msgs[1];
  EXPECT_NE(msgs[0].find("[nccl] rank 0: rank 1 of 2 could not prepare its nccl communicator 'world'"),
            std::string::npos) << msgs[0];
  EXPECT_NE(msgs[0].find("device 999 does not exist"), std::string::npos) << msgs[0];
}

TEST_F(NcclDevice, EveryOperationAtWorldSizeOne) {
  ASSERT_EQ(c->backend(), "nccl");
  ASSERT_EQ(c->size(), 1);
  std::vector<float> v(37);
  std::iota(v.begin(), v.end(), 1.0f);
  // all_to_all_v: one self block at displacement 2 -> 5
  Dev<float> s(v), r(std::vector<float>(45, -1.0f));
  const int64_t sc[] = {30}, sd[] = {2}, rd[] = {5};
  c->all_to_all_v(s.in(), sc, sd, r.out(), sc, rd, "a2a").wait();
  std::vector<float> got = r.get();
  for (int i = 0; i < 30; ++i) EXPECT_EQ(got[5 + i], v[2 + i]);
  EXPECT_EQ(got[4], -1.0f);
  // all_gather_v packed and with a gap
  Dev<float> g(std::vector<float>(40, -1.0f));
  const int64_t gc[] = {37}, gd[] = {3};
  c->all_gather_v(s.in(), g.out(), gc, "gather packed").wait();
  EXPECT_EQ(g.get()[36], v[36]);
  c->all_gather_v(s.in(), g.out(), gc, gd, "gather gapped").wait();
  EXPECT_EQ(g.get()[3], v[0]);
  // reduce_scatter_v, all_reduce in place and out of place, host buffers too
  Dev<float> rs(std::vector<float>(37, 0.0f));
  const int64_t rc[] = {37};
  c->reduce_scatter_v(s.in(), rs.out(), rc, ReduceOp::Sum, "rs").wait();
  EXPECT_EQ(rs.get(), v);
  Dev<float> ar(v);
  c->all_reduce(ar.out(), ReduceOp::Max, "ar in place").wait();
  EXPECT_EQ(ar.get(), v);
  std::vector<int64_t> flags{3, -4, 5};
  c->all_reduce(OutBuffer(flags), ReduceOp::Min, "host flags").wait();
  EXPECT_EQ(flags, (std::vector<int64_t>{3, -4, 5}));
  std::vector<float> host_out(37, 0.0f);
  c->all_reduce(s.in(), OutBuffer(host_out), ReduceOp::Sum, "device to host").wait();
  EXPECT_EQ(host_out, v);
  // broadcast, barrier, grouped self send / recv
  Dev<float> b(v);
  c->broadcast(b.out(), 0, "bcast").wait();
  EXPECT_EQ(b.get(), v);
  c->barrier("barrier").wait();
  Dev<float> p(std::vector<float>(37, 0.0f));
  c->group_begin();
  (void)c->recv(p.out(), 0, "self recv");
  (void)c->send(s.in(), 0, "self send");
  c->group_end("self pair").wait();
  EXPECT_EQ(p.get(), v);
  // split: color 0 keeps the rank, color -1 gets none
  auto sub = c->split(0, 0, "sub");
  ASSERT_NE(sub, nullptr);
  std::vector<int32_t> one{7};
  sub->all_reduce(OutBuffer(one), ReduceOp::Sum, "sub sum").wait();
  EXPECT_EQ(one[0], 7);
  EXPECT_EQ(c->split(-1, 0, "none"), nullptr);
  EXPECT_EQ(c->counters().collectives, 10u);
}

#if MESHMUON_TEST_CUDA_EMU
extern "C" bool ncclEmuConnections(int* peers, int* collectives);

// Eager connection (nccl_transport.cpp, connect_eagerly): construction runs an all-reduce and a
// send / receive with every peer before any operation, on the world communicator and on a split,
// so a first step finds them connected; MESHMUON_NCCL_CONNECT=lazy (the negative control) leaves both
// to first use. The emulated NCCL counts what was posted on the communicator a thread made last.
TEST(NcclTwoDevices, ConstructionConnectsEveryPeer) {
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  ASSERT_GE(devices, 2);
  for (bool lazy : {false, true}) {
    if (lazy) ASSERT_EQ(setenv("MESHMUON_NCCL_CONNECT", "lazy", 1), 0);
    ThreadExchange ex(2);
    int peers[2][2] = {}, collectives[2][2] = {};
    auto rank_body = [&](int r) {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      auto c = make_nccl_communicator(r, 2, ex.for_rank(r), r);
      ASSERT_TRUE(ncclEmuConnections(&peers[r][0], &collectives[r][0]));
      auto sub = c->split(0, 1 - r, "pair");  // the same pair, ranks swapped
      ASSERT_TRUE(sub != nullptr);
      ASSERT_TRUE(ncclEmuConnections(&peers[r][1], &collectives[r][1]));
    };
    std::thread other(rank_body, 1);
    rank_body(0);
    other.join();
    unsetenv("MESHMUON_NCCL_CONNECT");
    for (int r = 0; r < 2; ++r)
      for (int k = 0; k < 2; ++k) {
        EXPECT_EQ(peers[r][k], lazy ? 0 : 1) << "rank " << r << (k ? ", split" : ", world") << (lazy ? ", lazy" : "");
        EXPECT_EQ(collectives[r][k], lazy ? 0 : 1) << "rank " << r << (k ? ", split" : ", world");
      }
  }
}
#endif

// Two ranks (threads of this process) on two devices: variable all-to-all, uneven all-gather and
// reduce-scatter, a host all-reduce and a split, with integer data (exact sums). Needs two
// devices (the emulation gives them: MESHMUON_CUDA_EMU_DEVICES=2).
TEST(NcclTwoDevices, CollectivesBetweenTwoRanks) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    (void)cudaGetLastError();
    GTEST_SKIP() << "needs two CUDA devices";
  }
  ThreadExchange ex(2);
  auto rank_body = [&](int r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    auto c = make_nccl_communicator(r, 2, ex.for_rank(r), r);
    c->set_default_timeout(std::chrono::seconds(20));
    // all_to_all_v: r sends (r + 1) * (j + 2) values 1000 r + 100 j + k to j
    std::vector<int64_t> sc(2), rc(2), sd(2), rd(2);
    std::vector<float> send;
    for (int j = 0; j < 2; ++j) {
      sc[j] = (r + 1) * (j + 2), rc[j] = (j + 1) * (r + 2);
      sd[j] = static_cast<int64_t>(send.size());
      for (int64_t k = 0; k < sc[j]; ++k) send.push_back(static_cast<float>(1000 * r + 100 * j + k));
    }
    rd[0] = 0, rd[1] = rc[0];
    Dev<float> ds(send), dr(std::vector<float>(static_cast<size_t>(rc[0] + rc[1]), -1.0f));
    c->all_to_all_v(ds.in(), sc, sd, dr.out(), rc, rd, "a2a").wait();
    const std::vector<float> got = dr.get();
    for (int i = 0; i < 2; ++i)
      for (int64_t k = 0; k < rc[i]; ++k)
        EXPECT_EQ(got[static_cast<size_t>(rd[i] + k)], static_cast<float>(1000 * i + 100 * r + k)) << "rank " << r;
    // all_gather_v, uneven
    const int64_t gc[] = {3, 5};
    Dev<float> mine(std::vector<float>(static_cast<size_t>(gc[r]), static_cast<float>(r + 1)));
    Dev<float> all(std::vector<float>(8, 0.0f));
    c->all_gather_v(mine.in(), all.out(), gc, "gather").wait();
    EXPECT_EQ(all.get(), (std::vector<float>{1, 1, 1, 2, 2, 2, 2, 2})) << "rank " << r;
    // reduce_scatter_v: block j (counts[j]) of rank r holds 10 r + i
    const int64_t rsc[] = {4, 2};
    std::vector<float> blocks;
    for (int j = 0; j < 2; ++j)
      for (int64_t i = 0; i < rsc[j]; ++i) blocks.push_back(static_cast<float>(10 * r + i));
    Dev<float> rs_send(blocks), rs_recv(std::vector<float>(static_cast<size_t>(rsc[r]), 0.0f));
    c->reduce_scatter_v(rs_send.in(), rs_recv.out(), rsc, ReduceOp::Sum, "rs").wait();
    std::vector<float> want_rs;
    for (int64_t i = 0; i < rsc[r]; ++i) want_rs.push_back(static_cast<float>(10 + 2 * i));
    EXPECT_EQ(rs_recv.get(), want_rs) << "rank " << r;
    // host all_reduce and a split into one-rank groups
    std::vector<int64_t> flags{r + 1, -r};
    c->all_reduce(OutBuffer(flags), ReduceOp::Sum, "flags").wait();
    EXPECT_EQ(flags, (std::vector<int64_t>{3, -1})) << "rank " << r;
    auto alone = c->split(r, 0, "alone");
    ASSERT_NE(alone, nullptr);
    EXPECT_EQ(alone->size(), 1);
    c->barrier("end").wait();
  };
  std::thread peer(rank_body, 1);
  rank_body(0);
  peer.join();
}

// meshmuon::Optimizer over the nccl communicator, two ranks (threads) on two devices, dp_shard=2:
// after 3 steps every rank's parameter rows and momentum rows are BITWISE those of LocalOptimizer
// on device 0 over the whole matrices (layout invariance), for fp32 and bf16 communication, and
// the bytes each rank sent equal the plan's prediction.
TEST(NcclTwoDevices, OptimizerBitwiseEqualsOneRank) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    (void)cudaGetLastError();
    GTEST_SKIP() << "needs two CUDA devices";
  }
  const Inventory inv =
      apply_parallel(test::matrix_model("nccl2", {{"w0", 12, 8}, {"w1", 7, 10}, {"w2", 9, 9}}), parse_parallel("dp_shard=2"));
  const size_t n = inv.params.size();
  const auto value = [](size_t i, size_t j, int t) { return std::sin(0.37f * static_cast<float>(j + 11 * i + 5 * t)); };
  const auto upload = [](const std::vector<float>& h) {
    float* d = nullptr;
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), std::max<size_t>(1, h.size()) * 4), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  };
  const auto download = [](const float* d, size_t count) {
    std::vector<float> h(count);
    EXPECT_EQ(cudaMemcpy(h.data(), d, count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  };
  for (DType comm_dtype : {DType::F32, DType::BF16}) {
    // the reference: one rank on device 0, whole matrices
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    std::vector<ParamInfo> infos;
    for (const ParamSpec& p : inv.params) infos.push_back({p.name, p.shape});
    LocalOptimizerOptions lo{NonFinitePolicy::Raise, comm_dtype};
    lo.device = "cuda:0";
    LocalOptimizer ref(infos, {ParamGroup{GroupOptions{}, {0, 1, 2}}}, lo);
    std::vector<float*> rw(n), rg(n);
    for (size_t i = 0; i < n; ++i) {
      std::vector<float> h(static_cast<size_t>(inv.params[i].shape.numel()));
      for (size_t j = 0; j < h.size(); ++j) h[j] = value(i, j, 99);
      rw[i] = upload(h), rg[i] = upload(h);
    }
    for (int t = 0; t < 3; ++t) {
      std::vector<TensorView> wv, gv;
      for (size_t i = 0; i < n; ++i) {
        std::vector<float> h(static_cast<size_t>(inv.params[i].shape.numel()));
        for (size_t j = 0; j < h.size(); ++j) h[j] = value(i, j, t);
        ASSERT_EQ(cudaMemcpy(rg[i], h.data(), h.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
        wv.emplace_back(rw[i], inv.params[i].shape), gv.emplace_back(rg[i], inv.params[i].shape);
        wv.back().device = gv.back().device = {DeviceKind::Cuda, 0};
      }
      ASSERT_TRUE(ref.step(wv, gv));
    }
    std::vector<std::vector<float>> want_w(n), want_m(n);
    for (size_t i = 0; i < n; ++i) {
      const size_t numel = static_cast<size_t>(inv.params[i].shape.numel());
      want_w[i] = download(rw[i], numel);
      want_m[i] = download(static_cast<const float*>(ref.state(i, "momentum_buffer").data), numel);
      cudaFree(rw[i]), cudaFree(rg[i]);
    }
    // two ranks, each its rows of every matrix on its own device
    ThreadExchange ex(2);
    auto rank_body = [&](int r) {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      std::shared_ptr<Communicator> c = make_nccl_communicator(r, 2, ex.for_rank(r), r);
      c->set_default_timeout(std::chrono::seconds(30));
      OptimizerOptions oo;
      oo.device = "cuda:" + std::to_string(r);
      oo.comm_dtype = comm_dtype;
      oo.env_override = false;
      Optimizer opt(c, inv, {ParamGroup{GroupOptions{}, {0, 1, 2}}}, oo);
      std::vector<float*> w(n), g(n);
      std::vector<Range> rows(n);
      for (size_t i = 0; i < n; ++i) {
        const Box b = opt.local_box(i);
        ASSERT_EQ(b.dims[0].ranges().size(), 1u);
        rows[i] = b.dims[0].ranges()[0];
        const int64_t cols = inv.params[i].shape[1];
        std::vector<float> h(static_cast<size_t>(rows[i].size() * cols));
        for (size_t j = 0; j < h.size(); ++j) h[j] = value(i, static_cast<size_t>(rows[i].begin * cols) + j, 99);
        w[i] = upload(h), g[i] = upload(h);
      }
      for (int t = 0; t < 3; ++t) {
        std::vector<TensorView> wv, gv;
        for (size_t i = 0; i < n; ++i) {
          const int64_t cols = inv.params[i].shape[1];
          std::vector<float> h(static_cast<size_t>(rows[i].size() * cols));
          for (size_t j = 0; j < h.size(); ++j) h[j] = value(i, static_cast<size_t>(rows[i].begin * cols) + j, t);
          ASSERT_EQ(cudaMemcpy(g[i], h.data(), h.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
          wv.emplace_back(w[i], opt.local_shape(i)), gv.emplace_back(g[i], opt.local_shape(i));
          wv.back().device = gv.back().device = {DeviceKind::Cuda, r};
        }
        ASSERT_TRUE(opt.step(wv, gv));
        EXPECT_EQ(opt.last_stats().bytes_sent, opt.last_stats().bytes_sent_predicted) << "rank " << r << " step " << t;
      }
      for (size_t i = 0; i < n; ++i) {
        const int64_t cols = inv.params[i].shape[1];
        const size_t at = static_cast<size_t>(rows[i].begin * cols), count = static_cast<size_t>(rows[i].size() * cols);
        const std::vector<float> gw = download(w[i], count);
        const std::vector<float> gm = download(static_cast<const float*>(opt.state(i, "momentum_buffer").data), count);
        EXPECT_EQ(std::memcmp(gw.data(), want_w[i].data() + at, count * 4), 0)
            << inv.params[i].name << " rank " << r << " comm " << to_string(comm_dtype);
        EXPECT_EQ(std::memcmp(gm.data(), want_m[i].data() + at, count * 4), 0)
            << inv.params[i].name << " momentum rank " << r << " comm " << to_string(comm_dtype);
        cudaFree(w[i]), cudaFree(g[i]);
      }
    };
    std::thread peer(rank_body, 1);
    rank_body(0);
    peer.join();
  }
}

TEST_F(NcclDevice, TimeoutAbortsAndNamesTheOp) {
  Dev<float> r(std::vector<float>(8, 0.0f));
  c->set_default_timeout(std::chrono::seconds(2));
  std::string msg;
  try {
    Work w = c->recv(r.out(), 0, "lonely recv");  // no matching send: never completes
    w.wait();
    msg = "no error";
  } catch (const Error& e) {
    msg = e.what();
  }
  // A timeout ("[nccl] rank 0: recv 'lonely recv' timed out after 2 s ...") or NCCL refusing the
  // unmatched recv itself; either way the error names the backend, rank, op and label.
  EXPECT_EQ(msg.rfind("[nccl] rank 0: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("recv 'lonely recv'"), std::string::npos) << msg;
  if (msg.find("timed out") != std::string::npos) {  // then NCCL was aborted and nothing more is posted
    const std::string after = error_of([&] { (void)c->barrier("after"); });
    EXPECT_NE(after.find("unusable"), std::string::npos) << after;
  }
}
#endif

}  // namespace
}  // namespace meshmuon
