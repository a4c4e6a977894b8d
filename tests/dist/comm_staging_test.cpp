// The mpi backend's staged path (src/comm/mpi/mpi_staging.h) without a GPU: a communicator over a
// CountingFakeDeviceSpace (staging_spaces.h: "device" memory MPI cannot touch) runs every operation on
// device buffers, in place and mixed with host buffers, with a tiny chunk (many rounds) and a large
// one (one round), and must give bitwise what the plain mpi communicator (test::comm()) gives on
// host buffers, with the same byte counters, and never hold more pinned memory than its pool bound.
//   mpirun -n 3 --oversubscribe build/bin/comm_staging_test
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "dist_env.h"
#include "meshmuon/bf16.h"
#include "meshmuon/comm.h"
#include "staging_spaces.h"

#if MESHMUON_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

namespace meshmuon {
namespace {

using test::comm;

// A buffer in fake device memory.
template <class T> struct DevBuf {
  T* data;
  size_t n;
  test::CountingFakeDeviceSpace* space;
  DevBuf(test::CountingFakeDeviceSpace& s, const std::vector<T>& init) : n(init.size()), space(&s) {
    data = static_cast<T*>(s.allocate(n * sizeof(T)));
    s.copy_to_device(data, init.data(), n * sizeof(T));
  }
  std::vector<T> get() const {
    std::vector<T> out(n);
    space->copy_to_host(out.data(), data, n * sizeof(T));
    return out;
  }
  InBuffer in() const { return InBuffer(data, CommTypeOf<T>::value, n); }
  OutBuffer out() const { return OutBuffer(data, CommTypeOf<T>::value, n); }
};

template <class T> T val(int64_t x) {
  if constexpr (std::is_same_v<T, BFloat16>) return float_to_bf16(static_cast<float>(x % 200));
  else return static_cast<T>(x);
}
template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

int64_t a2a_count(int i, int j) { return (i == 1 || j == 2) ? 0 : (i + 3 * j) % 5 + (i == j ? 7 : 1); }
int64_t gather_count(int r) { return r == 1 ? 0 : 3 * r + 5; }
int64_t scatter_count(int j) { return j == 1 ? 0 : 2 * j + 9; }

// Staged communicators over one fake device per chunk size.
struct Staged {
  std::shared_ptr<test::CountingFakeDeviceSpace> space = std::make_shared<test::CountingFakeDeviceSpace>();
  detail::StagingOptions options;
  std::unique_ptr<Communicator> c;
  explicit Staged(size_t chunk) {
    options.chunk_bytes = chunk;
    options.pool_bytes = 4 * chunk + 256;  // a round's buffers are 64-byte granules
    c = make_mpi_communicator(space, options);
    c->set_default_timeout(std::chrono::seconds(30));
  }
};

class Staging : public ::testing::TestWithParam<size_t> {};

TEST_P(Staging, AllToAllVariableCounts) {
  Staged st(GetParam());
  Communicator& c = *st.c;
  Communicator& ref = comm();
  const int n = c.size(), r = c.rank();
  std::vector<int64_t> sc(n), rc(n), sd(n), rd(n);
  int64_t stot = 0, rtot = 1;
  for (int j = 0; j < n; ++j) sc[j] = a2a_count(r, j), rc[j] = a2a_count(j, r), sd[j] = stot, stot += sc[j];
  for (int j = n - 1; j >= 0; --j) rd[j] = rtot, rtot += rc[j] + 1;  // reversed, with gaps
  std::vector<float> send(stot);
  for (int64_t i = 0; i < stot; ++i) send[i] = val<float>(1000 * r + i);
  std::vector<float> want(rtot, -1.0f);
  ref.reset_counters();
  c.reset_counters();
  ref.all_to_all_v(send, sc, sd, want, rc, rd, "ref").wait();
  // device -> device, host -> device, device -> host
  DevBuf<float> dsend(*st.space, send), drecv(*st.space, std::vector<float>(rtot, -1.0f));
  c.all_to_all_v(dsend.in(), sc, sd, drecv.out(), rc, rd, "dd").wait();
  EXPECT_TRUE(same_bits(drecv.get(), want));
  DevBuf<float> drecv2(*st.space, std::vector<float>(rtot, -1.0f));
  c.all_to_all_v(send, sc, sd, drecv2.out(), rc, rd, "hd").wait();
  EXPECT_TRUE(same_bits(drecv2.get(), want));
  std::vector<float> hrecv(rtot, -1.0f);
  c.all_to_all_v(dsend.in(), sc, sd, hrecv, rc, rd, "dh").wait();
  EXPECT_TRUE(same_bits(hrecv, want));
  EXPECT_EQ(c.counters().bytes_sent, 3 * ref.counters().bytes_sent);
  EXPECT_EQ(c.counters().bytes_recv, 3 * ref.counters().bytes_recv);
  EXPECT_GT(st.space->to_host + st.space->to_device, 0u);
  EXPECT_LE(st.space->pinned_peak, st.options.pool_bytes);
}

TEST_P(Staging, AllGatherAndReduceScatter) {
  Staged st(GetParam());
  Communicator& c = *st.c;
  Communicator& ref = comm();
  const int n = c.size(), r = c.rank();
  // all_gather_v, gapped reversed displacements, int64 and bf16
  std::vector<int64_t> counts(n), displs(n);
  int64_t total = 2;
  for (int j = n - 1; j >= 0; --j) counts[j] = gather_count(j), displs[j] = total, total += counts[j] + 2;
  std::vector<int64_t> mine(counts[r]);
  std::iota(mine.begin(), mine.end(), 100 * r);
  std::vector<int64_t> want(total, -7);
  ref.all_gather_v(mine, want, counts, displs, "ref").wait();
  DevBuf<int64_t> dmine(*st.space, mine), dall(*st.space, std::vector<int64_t>(total, -7));
  c.all_gather_v(dmine.in(), dall.out(), counts, displs, "gather").wait();
  EXPECT_TRUE(same_bits(dall.get(), want));
  std::vector<BFloat16> bmine(counts[r]);
  for (size_t i = 0; i < bmine.size(); ++i) bmine[i] = val<BFloat16>(7 * r + static_cast<int64_t>(i));
  std::vector<BFloat16> bwant(total, BFloat16{0xBF80}), bhost(total, BFloat16{0xBF80});
  ref.all_gather_v(bmine, bwant, counts, displs, "ref bf16").wait();
  DevBuf<BFloat16> dbmine(*st.space, bmine);
  c.all_gather_v(dbmine.in(), bhost, counts, displs, "gather bf16 to host").wait();
  EXPECT_TRUE(same_bits(bhost, bwant));

  // reduce_scatter_v: sum of fp32 / int64 / bf16 small integers, max of int64
  std::vector<int64_t> rs(n);
  int64_t stot = 0;
  for (int j = 0; j < n; ++j) rs[j] = scatter_count(j), stot += rs[j];
  std::vector<float> fs(stot);
  std::vector<int64_t> is(stot);
  std::vector<BFloat16> bs(stot);
  for (int64_t i = 0; i < stot; ++i) {
    fs[i] = val<float>((i * 7 + r * 3) % 50 - 20);
    is[i] = (i * 13 + r * 5) % 97 - 40;
    bs[i] = val<BFloat16>((i + r) % 9 - 4);
  }
  std::vector<float> fwant(rs[r] + 1, -1.0f);
  std::vector<int64_t> iwant(rs[r], -1), mwant(rs[r], -1);
  std::vector<BFloat16> bswant(rs[r], BFloat16{0});
  ref.reduce_scatter_v(fs, fwant, rs, ReduceOp::Sum, "ref f").wait();
  ref.reduce_scatter_v(is, iwant, rs, ReduceOp::Sum, "ref i").wait();
  ref.reduce_scatter_v(is, mwant, rs, ReduceOp::Max, "ref max").wait();
  ref.reduce_scatter_v(bs, bswant, rs, ReduceOp::Sum, "ref b").wait();
  DevBuf<float> dfs(*st.space, fs), dfr(*st.space, std::vector<float>(rs[r] + 1, -1.0f));
  DevBuf<int64_t> dis(*st.space, is), dir(*st.space, std::vector<int64_t>(rs[r], -1));
  DevBuf<BFloat16> dbs(*st.space, bs), dbr(*st.space, std::vector<BFloat16>(rs[r], BFloat16{0}));
  std::vector<int64_t> hmax(rs[r], -1);
  Work w1 = c.reduce_scatter_v(dfs.in(), dfr.out(), rs, ReduceOp::Sum, "f");
  Work w2 = c.reduce_scatter_v(dis.in(), dir.out(), rs, ReduceOp::Sum, "i");
  Work w3 = c.reduce_scatter_v(dis.in(), hmax, rs, ReduceOp::Max, "max to host");
  Work w4 = c.reduce_scatter_v(dbs.in(), dbr.out(), rs, ReduceOp::Sum, "b");
  w4.wait(), w2.wait(), w3.wait(), w1.wait();  // in flight together, waited out of order
  EXPECT_TRUE(same_bits(dfr.get(), fwant));
  EXPECT_TRUE(same_bits(dir.get(), iwant));
  EXPECT_TRUE(same_bits(hmax, mwant));
  EXPECT_TRUE(same_bits(dbr.get(), bswant));
  EXPECT_LE(st.space->pinned_peak, st.options.pool_bytes);
}

TEST_P(Staging, AllReduceBroadcastBarrier) {
  Staged st(GetParam());
  Communicator& c = *st.c;
  Communicator& ref = comm();
  const int n = c.size(), r = c.rank();
  const size_t len = 37;
  std::vector<float> f(len);
  std::vector<int32_t> k(len);
  for (size_t i = 0; i < len; ++i) f[i] = val<float>((static_cast<int64_t>(i) * 5 + r) % 31 - 15), k[i] = static_cast<int32_t>(i * r);
  std::vector<float> fwant = f, fmin(len);
  std::vector<int32_t> kwant = k;
  ref.all_reduce(OutBuffer(fwant), ReduceOp::Sum, "ref sum").wait();
  ref.all_reduce(f, fmin, ReduceOp::Min, "ref min").wait();
  ref.all_reduce(OutBuffer(kwant), ReduceOp::Max, "ref max").wait();
  DevBuf<float> dinout(*st.space, f), df(*st.space, f), dmin(*st.space, std::vector<float>(len, 0.0f));
  DevBuf<int32_t> dk(*st.space, k);
  Work a = c.all_reduce(dinout.out(), ReduceOp::Sum, "in place");
  Work b = c.all_reduce(df.in(), dmin.out(), ReduceOp::Min, "out of place");
  std::vector<int32_t> khost = k;
  Work d = c.all_reduce(OutBuffer(khost), ReduceOp::Max, "host in place");
  std::vector<int32_t> kmax(len, -1);
  Work e = c.all_reduce(dk.in(), kmax, ReduceOp::Max, "device to host");
  e.wait();
  EXPECT_TRUE(same_bits(kmax, kwant));
  d.wait(), b.wait(), a.wait();
  EXPECT_TRUE(same_bits(dinout.get(), fwant));
  EXPECT_TRUE(same_bits(dmin.get(), fmin));
  EXPECT_TRUE(same_bits(khost, kwant));
  // broadcast from the last rank, device buffer; then a barrier
  std::vector<uint64_t> bc(len, 0);
  if (r == n - 1)
    for (size_t i = 0; i < len; ++i) bc[i] = 0x9e3779b97f4a7c15ull * (i + 1);
  std::vector<uint64_t> bwant = bc;
  ref.broadcast(OutBuffer(bwant), n - 1, "ref").wait();
  DevBuf<uint64_t> dbc(*st.space, bc);
  c.broadcast(dbc.out(), n - 1, "broadcast").wait();
  EXPECT_TRUE(same_bits(dbc.get(), bwant));
  c.barrier("barrier").wait();
  EXPECT_LE(st.space->pinned_peak, st.options.pool_bytes);
}

TEST_P(Staging, GroupedSendRecvAndSplit) {
  Staged st(GetParam());
  Communicator& c = *st.c;
  const int n = c.size(), r = c.rank();
  // every pair, self included, variable sizes, device buffers
  std::vector<DevBuf<int32_t>> sends, recvs;
  for (int j = 0; j < n; ++j) {
    std::vector<int32_t> s(static_cast<size_t>(a2a_count(r, j) * 3));
    for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<int32_t>(10000 * r + 100 * j + i);
    sends.emplace_back(*st.space, s);
    recvs.emplace_back(*st.space, std::vector<int32_t>(static_cast<size_t>(a2a_count(j, r) * 3), -1));
  }
  c.group_begin();
  for (int j = 0; j < n; ++j) {
    (void)c.recv(recvs[j].out(), j, "recv");
    (void)c.send(sends[j].in(), j, "send");
  }
  c.group_end("all pairs").wait();
  for (int j = 0; j < n; ++j) {
    const std::vector<int32_t> got = recvs[j].get();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], static_cast<int32_t>(10000 * j + 100 * r + i));
  }
  // a split inherits staging: parity groups all-reduce device buffers
  EXPECT_TRUE(c.device_buffers());
  // the default mpi communicator stages exactly where a device is visible
  EXPECT_EQ(comm().device_buffers(), detail::default_memory_space()->has_devices());
  auto sub = c.split(r % 2, r, "parity");
  ASSERT_NE(sub, nullptr);
  EXPECT_TRUE(sub->device_buffers());
  DevBuf<int64_t> x(*st.space, std::vector<int64_t>{r, 1});
  sub->all_reduce(x.out(), ReduceOp::Sum, "parity sum").wait();
  int64_t want = 0, members = 0;
  for (int q = r % 2; q < n; q += 2) want += q, members += 1;
  EXPECT_EQ(x.get(), (std::vector<int64_t>{want, members}));
}

// Negative control: the fake device really is out of MPI's reach through a plain pointer.
TEST(StagingNegativeControl, DeviceMemoryIsNotHostReadable) {
  test::CountingFakeDeviceSpace space(1 << 20);
  void* p = space.allocate(64);
  EXPECT_TRUE(space.is_device(p));
  EXPECT_FALSE(space.is_device(&space));
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  errno = 0;
  EXPECT_EQ(write(fds[1], p, 1), -1);  // the kernel cannot read it either: EFAULT
  EXPECT_EQ(errno, EFAULT);
  char ok = 1;
  EXPECT_EQ(write(fds[1], &ok, 1), 1);
  close(fds[0]);
  close(fds[1]);
}

#if MESHMUON_TEST_CUDA
// On a GPU (every rank on the same one, as in the one-GPU bitwise runs): make_mpi_communicator's
// default memory space is cudart's, and cudaMalloc'd buffers go through pinned staging.
TEST(CudaStaging, DeviceBuffersThroughPinnedMemory) {
  if (detail::default_memory_space()->name() != "cuda") GTEST_SKIP() << "no CUDA device: nothing is staged";
  auto c = make_mpi_communicator();
  c->set_default_timeout(std::chrono::seconds(60));
  Communicator& ref = comm();
  const int n = c->size(), r = c->rank();
  std::vector<int64_t> sc(n), rc(n), sd(n), rd(n);
  int64_t stot = 0, rtot = 0;
  for (int j = 0; j < n; ++j) sc[j] = a2a_count(r, j) * 1000, rc[j] = a2a_count(j, r) * 1000, sd[j] = stot, stot += sc[j];
  for (int j = 0; j < n; ++j) rd[j] = rtot, rtot += rc[j];
  std::vector<float> send(stot), want(rtot, -1.0f), got(rtot, -1.0f);
  for (int64_t i = 0; i < stot; ++i) send[i] = val<float>(i % 1000 + 1000 * r);
  ref.all_to_all_v(send, sc, sd, want, rc, rd, "ref").wait();
  float *ds = nullptr, *dr = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&ds), std::max<int64_t>(1, stot) * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dr), std::max<int64_t>(1, rtot) * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ds, send.data(), stot * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  c->all_to_all_v(InBuffer(ds, CommType::F32, stot), sc, sd, OutBuffer(dr, CommType::F32, rtot), rc, rd, "a2a").wait();
  ASSERT_EQ(cudaMemcpy(got.data(), dr, rtot * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(same_bits(got, want));
  // all_reduce in place on the device, same count everywhere
  const size_t len = 3001;
  std::vector<int32_t> x(len), xwant, xgot(len);
  for (size_t i = 0; i < len; ++i) x[i] = static_cast<int32_t>((i * 7 + static_cast<size_t>(r)) % 101);
  xwant = x;
  ref.all_reduce(OutBuffer(xwant), ReduceOp::Sum, "ref sum").wait();
  int32_t* dx = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dx), len * sizeof(int32_t)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), len * sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
  c->all_reduce(OutBuffer(dx, CommType::I32, len), ReduceOp::Sum, "in place").wait();
  ASSERT_EQ(cudaMemcpy(xgot.data(), dx, len * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(same_bits(xgot, xwant));
  cudaFree(dx);
  cudaFree(ds);
  cudaFree(dr);
}
#endif

INSTANTIATE_TEST_SUITE_P(Chunks, Staging, ::testing::Values(size_t{8}, size_t{24}, size_t{1} << 20),
                         [](const auto& info) { return "chunk" + std::to_string(info.param); });

}  // namespace
}  // namespace meshmuon
