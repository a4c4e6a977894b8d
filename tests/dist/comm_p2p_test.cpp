// Point-to-point suite: send / recv, groups, matching order, counters, misuse, and the MPI count
// arithmetic; part of comm_test, so it runs under mpirun -n 1..4 and on the single backend:
//   ctest --test-dir build-comm -R comm --output-on-failure
// Payloads are integer codes (exact in every type); expected values are computed here directly.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <vector>

#include "comm/mpi/mpi_counts.h"
#include "dist_env.h"
#include "meshmuon/bf16.h"
#include "meshmuon/comm.h"
#include "meshmuon/error.h"

namespace meshmuon {
namespace {

using test::comm;

// Element k of the message from `src` to `dst` (tag distinguishes several messages): below 2^24.
int64_t code(int src, int dst, int64_t k, int tag = 0) { return src * 1'000'000 + dst * 100'000 + tag * 10'000 + k; }

template <class T> std::vector<T> message(int src, int dst, int64_t count, int tag = 0) {
  std::vector<T> out(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    if constexpr (std::is_same_v<T, BFloat16>) out[k] = BFloat16{static_cast<uint16_t>(code(src, dst, k, tag) & 0x7F7F)};
    else out[k] = static_cast<T>(code(src, dst, k, tag));
  }
  return out;
}
template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class T> class CommP2pRing : public ::testing::Test {};
using RingTypes = ::testing::Types<float, BFloat16, int64_t>;
TYPED_TEST_SUITE(CommP2pRing, RingTypes);

// Each rank sends to r+1 and receives from r-1 (itself at one rank).
TYPED_TEST(CommP2pRing, UngroupedAndGrouped) {
  using T = TypeParam;
  Communicator& c = comm();
  const int n = c.size(), r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int64_t count : {0, 1, 1031, 70'001}) {
    const std::vector<T> send = message<T>(r, next, count), want = message<T>(prev, r, count);
    const uint64_t bytes = n == 1 ? 0 : count * sizeof(T);
    // Ungrouped: recv first, then send; wait in either order.
    std::vector<T> got(count, T{});
    c.reset_counters();
    Work rw = c.recv(got, prev, "ring recv");
    Work sw = c.send(send, next, "ring send");
    EXPECT_EQ(rw.op(), "recv");
    EXPECT_EQ(sw.label(), "ring send");
    sw.wait();
    rw.wait();
    EXPECT_TRUE(same_bits(got, want)) << "ungrouped, count " << count;
    EXPECT_EQ(c.counters().bytes_sent, bytes);
    EXPECT_EQ(c.counters().bytes_recv, bytes);
    EXPECT_EQ(c.counters().collectives, 2u);
    // Grouped: the ops return complete placeholder Works; the group's Work is the one to wait on.
    std::vector<T> got2(count, T{});
    c.reset_counters();
    c.group_begin();
    EXPECT_TRUE(c.in_group());
    Work s2 = c.send(send, next, "ring");
    Work r2 = c.recv(got2, prev, "ring");
    EXPECT_TRUE(s2.completed() && r2.completed() && r2.op().empty());
    EXPECT_EQ(c.counters().collectives, 0u) << "grouped ops count at group_end";
    Work g = c.group_end("ring");
    EXPECT_FALSE(c.in_group());
    EXPECT_EQ(g.op(), "group");
    g.wait();
    EXPECT_TRUE(same_bits(got2, want)) << "grouped, count " << count;
    EXPECT_EQ(c.counters().bytes_sent, bytes);
    EXPECT_EQ(c.counters().bytes_recv, bytes);
    EXPECT_EQ(c.counters().collectives, 1u);
  }
}

// Count of the message i -> j: zero-length ones off the diagonal, self messages nonempty at rank 0.
int64_t pair_count(int i, int j) { return ((i + 2 * j) % 4) * 17 + (i == j ? 3 : 0); }

TEST(CommP2p, AllPairsGroupedVariableSizes) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  std::vector<std::vector<int32_t>> out(n), in(n);
  uint64_t sent = 0, recvd = 0;
  for (int j = 0; j < n; ++j) {
    out[j] = message<int32_t>(r, j, pair_count(r, j));
    in[j].assign(static_cast<size_t>(pair_count(j, r)), -1);
    if (j != r) sent += out[j].size() * 4, recvd += in[j].size() * 4;
  }
  c.reset_counters();
  c.group_begin();
  // Recvs in reverse order and before the sends: matching is per peer, not per position.
  for (int j = n - 1; j >= 0; --j) (void)c.recv(in[j], j, "all pairs");
  for (int j = 0; j < n; ++j) (void)c.send(out[j], j, "all pairs");
  c.group_end("all pairs").wait();
  for (int i = 0; i < n; ++i)
    EXPECT_TRUE(same_bits(in[i], message<int32_t>(i, r, pair_count(i, r)))) << "from rank " << i;
  EXPECT_EQ(c.counters().bytes_sent, sent);
  EXPECT_EQ(c.counters().bytes_recv, recvd);
  EXPECT_EQ(c.counters().collectives, 1u);
  const ByteCount p = comm_bytes_send(r, (r + 1) % n, pair_count(r, (r + 1) % n), 4);
  EXPECT_EQ(p.sent, n == 1 ? 0u : static_cast<uint64_t>(pair_count(r, (r + 1) % n)) * 4u);
}

// Five equal-sized messages to the same peer arrive in posting order (two ungrouped, three grouped);
// equal sizes make a reordering visible in the contents only.
TEST(CommP2p, SeveralMessagesToOnePeerKeepTheirOrder) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  constexpr int kMessages = 5;
  std::vector<std::vector<float>> out(kMessages), in(kMessages, std::vector<float>(9, -1.0f));
  for (int m = 0; m < kMessages; ++m) out[m] = message<float>(r, next, 9, m);
  std::vector<Work> works;
  for (int m = 0; m < 2; ++m) works.push_back(c.recv(in[m], prev, "ordered"));
  for (int m = 0; m < 2; ++m) works.push_back(c.send(out[m], next, "ordered"));
  c.group_begin();
  for (int m = 2; m < kMessages; ++m) (void)c.send(out[m], next, "ordered");
  for (int m = 2; m < kMessages; ++m) (void)c.recv(in[m], prev, "ordered");
  works.push_back(c.group_end("ordered"));
  for (Work& w : works) w.wait();
  for (int m = 0; m < kMessages; ++m) EXPECT_TRUE(same_bits(in[m], message<float>(prev, r, 9, m))) << "message " << m;
}

TEST(CommP2p, EmptyGroupIsComplete) {
  Communicator& c = comm();
  c.reset_counters();
  c.group_begin();
  Work w = c.group_end("empty");
  EXPECT_TRUE(w.completed());
  EXPECT_EQ(c.counters().collectives, 1u);
  EXPECT_EQ(c.counters().bytes_sent + c.counters().bytes_recv, 0u);
}

TEST(CommP2p, MisuseThrowsBeforeAnythingIsPosted) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  std::vector<float> buf(8, 1.0f), out(8 * n);
  c.reset_counters();
  EXPECT_THROW((void)c.send(buf, n, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.recv(buf, -1, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.send(InBuffer(nullptr, CommType::F32, 3), r, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.group_end("x"), std::invalid_argument);
  try {
    (void)c.send(buf, n + 2, "halo 3");
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[comm] send 'halo 3': peer " + std::to_string(n + 2)), std::string::npos)
        << e.what();
  }
  c.group_begin();
  EXPECT_THROW(c.group_begin(), std::invalid_argument);
  EXPECT_THROW((void)c.barrier("x"), std::invalid_argument);
  EXPECT_THROW((void)c.all_reduce(OutBuffer(buf), ReduceOp::Sum, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.all_gather(buf, out, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.split(0, r), std::invalid_argument);
  EXPECT_THROW((void)c.send(buf, -3, "x"), std::invalid_argument);  // rejected, not added; the group stays open
  try {
    (void)c.broadcast(buf, 0, "weights");
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("broadcast 'weights' called on communicator 'world' inside an open group"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(c.in_group());
  EXPECT_TRUE(c.group_end("still empty").completed());
  // A recv buffer overlapping another op's buffer: group_end throws, closes the group, posts nothing.
  c.group_begin();
  (void)c.send(InBuffer(buf.data(), CommType::F32, 4), r, "overlap");
  (void)c.send(InBuffer(buf.data() + 2, CommType::F32, 4), r, "overlap");  // sends may share memory
  (void)c.recv(OutBuffer(buf.data() + 3, CommType::F32, 4), r, "overlap");
  EXPECT_THROW((void)c.group_end("overlap"), std::invalid_argument);
  EXPECT_FALSE(c.in_group());
  EXPECT_EQ(c.counters().collectives, 1u) << "only the empty group counted";
  // Nothing was left posted: an exchange and a collective still work.
  std::vector<float> got(8, 0.0f);
  c.group_begin();
  (void)c.send(buf, r, "self");
  (void)c.recv(got, r, "self");
  c.group_end("self").wait();
  EXPECT_EQ(got, buf);
  c.barrier("after misuse").wait();
}

// The single backend can show a timeout without breaking the process: an unmatched self recv.
TEST(CommP2p, UnmatchedRecvTimesOutOnSingle) {
  Communicator& c = comm();
  if (c.backend() != "single") GTEST_SKIP() << "an MPI timeout makes the process unusable (comm_timeout_test --p2p)";
  std::vector<int64_t> got(4, -1), sent{1, 2, 3, 4};
  {
    Work w = c.recv(got, 0, "lonely");
    try {
      w.wait(std::chrono::milliseconds(20));
      ADD_FAILURE() << "no timeout";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[single] rank 0: recv 'lonely' timed out after 0.02 s on communicator 'world'"),
                std::string::npos)
          << e.what();
    }
  }  // destroyed unmatched: withdrawn, so the next send does not land in `got`
  Work s = c.send(sent, 0, "later");
  std::vector<int64_t> got2(4, -1);
  Work r = c.recv(got2, 0, "later");
  r.wait();
  s.wait();
  EXPECT_EQ(got2, sent);
  EXPECT_EQ(got, std::vector<int64_t>(4, -1));
  // A send larger than its recv is an error on both ends.
  std::vector<int64_t> small(2);
  Work big = c.send(sent, 0, "too big");
  Work tiny = c.recv(small, 0, "too big");
  EXPECT_THROW(tiny.wait(), Error);
  EXPECT_THROW(big.wait(), Error);
}

// Negative control: the ring comparison catches a one-element error, and a count that is off.
TEST(CommP2pNegativeControl, ComparisonsCanFail) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const std::vector<int64_t> send = message<int64_t>(r, next, 16);
  std::vector<int64_t> got(16, -1), want = message<int64_t>(prev, r, 16);
  c.group_begin();
  (void)c.recv(got, prev, "control");
  (void)c.send(send, next, "control");
  c.group_end("control").wait();
  ASSERT_TRUE(same_bits(got, want));
  want[15] += 1;
  EXPECT_FALSE(same_bits(got, want));
  EXPECT_FALSE(same_bits(got, message<int64_t>(prev, r, 15)));
}

TEST(MpiCounts, PiecesCoverTheCountInOrder) {
  using detail::mpi_pieces;
  ASSERT_EQ(mpi_pieces(0).size(), 1u);
  EXPECT_EQ(mpi_pieces(0)[0].count, 0);
  const auto p = mpi_pieces(10, 4);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].offset, 0);
  EXPECT_EQ(p[1].offset, 4);
  EXPECT_EQ(p[2].offset, 8);
  EXPECT_EQ(p[2].count, 2);
  EXPECT_EQ(mpi_pieces(8, 4).size(), 2u);
  const int64_t big = (int64_t{1} << 32) + 5;  // 2 full pieces of 2^31-1 and a tail of 7
  const auto q = mpi_pieces(big);
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q[0].count, INT_MAX);
  EXPECT_EQ(q[2].offset, 2 * int64_t{INT_MAX});
  EXPECT_EQ(q[2].count, 7);
}

TEST(MpiCounts, UnitTypeWhenCountsShareAFactor) {
  using detail::mpi_unit;
  const std::vector<int64_t> small{3, 0, INT_MAX}, shared{12, 18, 0}, coprime{12, 7};
  EXPECT_EQ(mpi_unit({small}), 1);
  EXPECT_EQ(mpi_unit({shared}, 10), 6);              // 18 / 6 = 3 fits
  EXPECT_EQ(mpi_unit({coprime}, 10), 0);             // no common unit: the backend reports the limit
  EXPECT_EQ(mpi_unit({shared, coprime}, 10), 0);     // all arrays share one unit
  const std::vector<int64_t> huge{int64_t{1024} * 2'000'000'000, 1024 * 7, 0};
  EXPECT_EQ(mpi_unit({huge}), 1024);
  const std::vector<int64_t> wide_gcd{int64_t{1} << 32};  // unit itself past the limit
  EXPECT_EQ(mpi_unit({wide_gcd}), 0);
}

}  // namespace
}  // namespace meshmuon
