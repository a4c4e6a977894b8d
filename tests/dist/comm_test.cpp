// Communicator suite, written against the interface and run on every backend and rank count:
//   ctest --test-dir build-comm -L dist        (mpirun -n 1..4 --oversubscribe, and the single backend)
//   mpirun -n 3 --oversubscribe build/bin/comm_test     MESHMUON_TEST_BACKEND=single build/bin/comm_test
// Payloads are integer-valued (or raw bf16 bit patterns for data movement), so results are exact;
// expected buffers and byte counts are computed here independently of the library's own rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <type_traits>
#include <vector>

#include "dist_env.h"
#include "meshmuon/bf16.h"
#include "meshmuon/comm.h"

namespace meshmuon {
namespace {

using test::comm;

// Element `code` of a movement payload: exact in every type (codes stay below 2^24).
template <class T> T code_value(uint32_t code) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{static_cast<uint16_t>((code * 40503u >> 7) & 0x7F7Fu)};  // finite, sign bit 0
  } else {
    return static_cast<T>(code);
  }
}
template <class T> T sentinel() {
  if constexpr (std::is_same_v<T, BFloat16>) return BFloat16{0xBF80};  // -1.0, never a code
  else if constexpr (std::is_unsigned_v<T>) return static_cast<T>(~T{0});
  else return static_cast<T>(-1);
}
// Small integers for reductions: every partial sum is exact, bf16 included (|sum| <= 256).
template <class T> T small_int(int64_t x) {
  if constexpr (std::is_same_v<T, BFloat16>) return float_to_bf16(static_cast<float>(x));
  else return static_cast<T>(x);
}
template <class T> double as_double(T v) {
  if constexpr (std::is_same_v<T, BFloat16>) return bf16_to_float(v);
  else return static_cast<double>(v);
}
template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Uneven counts with zeros: rank 1 sends nothing, rank 2 receives nothing, diagonal is larger.
int64_t a2a_count(int i, int j, int64_t scale) {
  if (i == 1 || j == 2) return 0;
  return ((i + 2 * j + 1) % 4 + (i == j ? 2 : 0)) * scale;
}
int64_t gather_count(int r, int64_t scale) { return r == 1 ? 0 : (2 * r + 1) * scale; }
int64_t scatter_count(int j, int64_t scale) { return j == 1 ? 0 : (j + 1) * scale; }

// Blocks in REVERSED rank order with a one-element gap before each: displacements need not be packed.
std::vector<int64_t> gapped_reversed_displs(const std::vector<int64_t>& counts, int64_t* total) {
  std::vector<int64_t> displs(counts.size());
  int64_t at = 0;
  for (size_t j = counts.size(); j-- > 0;) {
    at += 1;
    displs[j] = at;
    at += counts[j];
  }
  *total = at;
  return displs;
}

void expect_counters(const Communicator& c, uint64_t sent, uint64_t recv, uint64_t collectives) {
  const CommCounters k = c.counters();
  EXPECT_EQ(k.bytes_sent, c.size() == 1 ? 0 : sent) << "rank " << c.rank();
  EXPECT_EQ(k.bytes_recv, c.size() == 1 ? 0 : recv) << "rank " << c.rank();
  EXPECT_EQ(k.collectives, collectives);
}

TEST(CommBasics, RankSizeBackend) {
  Communicator& c = comm();
  EXPECT_EQ(c.backend(), test::expected_backend());
  EXPECT_GE(c.rank(), 0);
  EXPECT_LT(c.rank(), c.size());
  if (c.backend() == "single") EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.name(), "world");
  Work none;
  EXPECT_TRUE(none.completed());
  EXPECT_TRUE(none.test());
}

template <class T> class CommMove : public ::testing::Test {};
using MoveTypes = ::testing::Types<float, BFloat16, int64_t>;
TYPED_TEST_SUITE(CommMove, MoveTypes);

TYPED_TEST(CommMove, AllToAllVUnevenZeroGapped) {
  using T = TypeParam;
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  for (int64_t scale : {1, 37, 1000}) {
    std::vector<int64_t> sc(n), rc(n);
    for (int j = 0; j < n; ++j) sc[j] = a2a_count(r, j, scale), rc[j] = a2a_count(j, r, scale);
    int64_t send_total = 0, recv_total = 0;
    const auto sd = gapped_reversed_displs(sc, &send_total);
    const auto rd = gapped_reversed_displs(rc, &recv_total);
    std::vector<T> send(send_total, sentinel<T>()), recv(recv_total, sentinel<T>()), want(recv_total, sentinel<T>());
    for (int j = 0; j < n; ++j)
      for (int64_t k = 0; k < sc[j]; ++k) send[sd[j] + k] = code_value<T>(r * 1'000'000 + j * 10'000 + k);
    for (int i = 0; i < n; ++i)
      for (int64_t k = 0; k < rc[i]; ++k) want[rd[i] + k] = code_value<T>(i * 1'000'000 + r * 10'000 + k);
    c.reset_counters();
    c.all_to_all_v(send, sc, sd, recv, rc, rd, "a2a uneven").wait();
    EXPECT_TRUE(same_bits(recv, want)) << "rank " << r << " scale " << scale;
    uint64_t sent = 0, got = 0;
    for (int j = 0; j < n; ++j)
      if (j != r) sent += sc[j] * sizeof(T), got += rc[j] * sizeof(T);
    expect_counters(c, sent, got, 1);
  }
}

TYPED_TEST(CommMove, AllToAllEqual) {
  using T = TypeParam;
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  const int64_t block = 13;
  std::vector<T> send(block * n), recv(block * n, sentinel<T>()), want(block * n);
  for (int j = 0; j < n; ++j)
    for (int64_t k = 0; k < block; ++k) {
      send[j * block + k] = code_value<T>(r * 1'000'000 + j * 10'000 + k);
      want[j * block + k] = code_value<T>(j * 1'000'000 + r * 10'000 + k);
    }
  c.reset_counters();
  c.all_to_all(send, recv, "a2a equal").wait();
  EXPECT_TRUE(same_bits(recv, want));
  expect_counters(c, block * (n - 1) * sizeof(T), block * (n - 1) * sizeof(T), 1);
}

TYPED_TEST(CommMove, AllGatherVUnevenZeroGapped) {
  using T = TypeParam;
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  for (int64_t scale : {1, 101}) {
    std::vector<int64_t> counts(n);
    for (int j = 0; j < n; ++j) counts[j] = gather_count(j, scale);
    int64_t total = 0;
    const auto displs = gapped_reversed_displs(counts, &total);
    std::vector<T> send(counts[r]), recv(total, sentinel<T>()), want(total, sentinel<T>());
    for (int64_t k = 0; k < counts[r]; ++k) send[k] = code_value<T>(r * 1'000'000 + k);
    for (int j = 0; j < n; ++j)
      for (int64_t k = 0; k < counts[j]; ++k) want[displs[j] + k] = code_value<T>(j * 1'000'000 + k);
    c.reset_counters();
    c.all_gather_v(send, recv, counts, displs, "gather gapped").wait();
    EXPECT_TRUE(same_bits(recv, want)) << "scale " << scale;
    uint64_t got = 0;
    for (int j = 0; j < n; ++j)
      if (j != r) got += counts[j] * sizeof(T);
    expect_counters(c, counts[r] * (n - 1) * sizeof(T), got, 1);

    // Packed overload: blocks back to back in rank order.
    std::vector<T> packed(std::accumulate(counts.begin(), counts.end(), int64_t{0}), sentinel<T>());
    std::vector<T> want_packed;
    for (int j = 0; j < n; ++j)
      for (int64_t k = 0; k < counts[j]; ++k) want_packed.push_back(code_value<T>(j * 1'000'000 + k));
    c.all_gather_v(send, packed, counts, "gather packed").wait();
    EXPECT_TRUE(same_bits(packed, want_packed));
  }
}

TYPED_TEST(CommMove, AllGatherEqualAndBroadcast) {
  using T = TypeParam;
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  const int64_t block = 7;
  std::vector<T> send(block), recv(block * n, sentinel<T>()), want(block * n);
  for (int64_t k = 0; k < block; ++k) send[k] = code_value<T>(r * 100 + k);
  for (int j = 0; j < n; ++j)
    for (int64_t k = 0; k < block; ++k) want[j * block + k] = code_value<T>(j * 100 + k);
  c.all_gather(send, recv, "gather equal").wait();
  EXPECT_TRUE(same_bits(recv, want));

  for (int root = 0; root < n; ++root) {
    for (int64_t count : {0, 1, 4099}) {
      std::vector<T> buf(count, sentinel<T>()), expect(count);
      for (int64_t k = 0; k < count; ++k) expect[k] = code_value<T>(root * 1'000'000 + k);
      if (r == root) buf = expect;
      c.reset_counters();
      c.broadcast(buf, root, "bcast").wait();
      EXPECT_TRUE(same_bits(buf, expect)) << "root " << root << " count " << count;
      const uint64_t bytes = count * sizeof(T);
      expect_counters(c, r == root ? bytes * (n - 1) : 0, r == root ? 0 : bytes, 1);
    }
  }
}

template <class T> class CommReduce : public ::testing::Test {};
using ReduceTypes = ::testing::Types<float, BFloat16, int32_t, int64_t, uint64_t>;
TYPED_TEST_SUITE(CommReduce, ReduceTypes);

// Rank r's element i: small integers, negative ones for signed types.
template <class T> int64_t reduce_input(int r, int64_t i) {
  const int64_t v = (r * 7 + i * 3) % 11;
  return std::is_unsigned_v<T> ? v : v - 5;
}

double reference(ReduceOp op, int n, const std::function<int64_t(int)>& at) {
  int64_t acc = at(0);
  for (int q = 1; q < n; ++q) {
    const int64_t x = at(q);
    acc = op == ReduceOp::Sum ? acc + x : op == ReduceOp::Max ? std::max(acc, x) : std::min(acc, x);
  }
  return static_cast<double>(acc);
}

TYPED_TEST(CommReduce, AllReduceOpsInPlaceAndOut) {
  using T = TypeParam;
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    for (int64_t count : {0, 1, 5, 1031, 65537}) {
      std::vector<T> in(count), out(count, sentinel<T>());
      for (int64_t i = 0; i < count; ++i) in[i] = small_int<T>(reduce_input<T>(r, i));
      std::vector<T> inplace = in;
      c.reset_counters();
      Work a = c.all_reduce(in, out, op, "allreduce out");
      Work b = c.all_reduce(OutBuffer(inplace), op, "allreduce in place");
      b.wait();
      a.wait();
      int bad = 0;
      for (int64_t i = 0; i < count; ++i) {
        const double want = reference(op, n, [&](int q) { return reduce_input<T>(q, i); });
        bad += as_double(out[i]) != want || as_double(inplace[i]) != want;
      }
      EXPECT_EQ(bad, 0) << to_string(op) << " count " << count;
      // Balanced split: block b_r = count / n (+1 for r < count % n); sent = recv = (count - b) + (n - 1) b.
      const int64_t b_r = count / n + (r < count % n ? 1 : 0);
      const uint64_t bytes = 2 * ((count - b_r) + (n - 1) * b_r) * sizeof(T);
      expect_counters(c, bytes, bytes, 2);
    }
  }
}

TYPED_TEST(CommReduce, ReduceScatterVUnevenZero) {
  using T = TypeParam;
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    for (int64_t scale : {1, 29}) {
      std::vector<int64_t> counts(n), displs(n);
      int64_t total = 0;
      for (int j = 0; j < n; ++j) counts[j] = scatter_count(j, scale), displs[j] = total, total += counts[j];
      std::vector<T> send(total), recv(counts[r], sentinel<T>());
      auto input = [&](int q, int j, int64_t k) { return reduce_input<T>(q + j, k); };
      for (int j = 0; j < n; ++j)
        for (int64_t k = 0; k < counts[j]; ++k) send[displs[j] + k] = small_int<T>(input(r, j, k));
      c.reset_counters();
      c.reduce_scatter_v(send, recv, counts, op, "rs uneven").wait();
      int bad = 0;
      for (int64_t k = 0; k < counts[r]; ++k)
        bad += as_double(recv[k]) != reference(op, n, [&](int q) { return input(q, r, k); });
      EXPECT_EQ(bad, 0) << to_string(op) << " scale " << scale;
      uint64_t sent = 0;
      for (int j = 0; j < n; ++j)
        if (j != r) sent += counts[j] * sizeof(T);
      expect_counters(c, sent, counts[r] * (n - 1) * sizeof(T), 1);
    }
  }
  // Equal blocks.
  const int64_t block = 6;
  std::vector<T> send(block * n), recv(block);
  for (int64_t i = 0; i < block * n; ++i) send[i] = small_int<T>(reduce_input<T>(r, i));
  c.reduce_scatter(send, recv, ReduceOp::Sum, "rs equal").wait();
  int bad = 0;
  for (int64_t k = 0; k < block; ++k)
    bad += as_double(recv[k]) != reference(ReduceOp::Sum, n, [&](int q) { return reduce_input<T>(q, r * block + k); });
  EXPECT_EQ(bad, 0);
}

TEST(CommReduceFlags, AnyAndAllOfBooleanFlags) {
  Communicator& c = comm();
  int32_t any = c.rank() == c.size() - 1 ? 1 : 0, all = any;
  c.all_reduce(OutBuffer(&any, CommType::I32, 1), ReduceOp::Max, "any nonfinite").wait();
  c.all_reduce(OutBuffer(&all, CommType::I32, 1), ReduceOp::Min, "all nonfinite").wait();
  EXPECT_EQ(any, 1);
  EXPECT_EQ(all, c.size() == 1 ? 1 : 0);
}

TEST(CommWork, ManyInFlightCompleteInAnyOrder) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  std::vector<float> g_send(3, static_cast<float>(r)), g_recv(3 * n, -1.0f);
  std::vector<int64_t> s(n, r), a_recv(n, -1);
  std::vector<uint64_t> fp{0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(r == 0)}, fp_max(1);
  c.reset_counters();
  Work w1 = c.all_gather(g_send, g_recv, "chunk 0 gather");
  Work w2 = c.all_to_all(s, a_recv, "chunk 1 gather");
  Work w3 = c.all_reduce(fp, fp_max, ReduceOp::Max, "fingerprint");
  Work w4 = c.barrier("end of step");
  EXPECT_EQ(w2.op(), "all_to_all");
  EXPECT_EQ(w2.label(), "chunk 1 gather");
  while (!w3.test()) {
  }
  w4.wait(std::chrono::seconds(30));
  w2.wait(CommClock::now() + std::chrono::seconds(30));
  w1.wait();
  EXPECT_TRUE(w1.completed() && w2.completed() && w3.completed() && w4.completed());
  for (int j = 0; j < n; ++j) {
    EXPECT_EQ(g_recv[3 * j + 2], static_cast<float>(j));
    EXPECT_EQ(a_recv[j], j);
  }
  const uint64_t k = 0x9e3779b97f4a7c15ull;  // odd, so k ^ 1 < k
  EXPECT_EQ(fp_max[0], n == 1 ? k ^ 1u : k);
  EXPECT_EQ(c.counters().collectives, 4u);
}

// Sub-communicators: members are checked by all-gathering world ranks over them.
std::vector<int32_t> members(Communicator& sub) {
  int32_t me = comm().rank();
  std::vector<int32_t> all(sub.size(), -1);
  sub.all_gather(InBuffer(&me, CommType::I32, 1), all, "members").wait();
  return all;
}

TEST(CommSplit, ColorKeyAndNone) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  c.reset_counters();
  auto parity = c.split(r % 2, -r, "parity");  // key -r: reversed order
  ASSERT_NE(parity, nullptr);
  std::vector<int32_t> want;
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == r % 2) want.push_back(q);
  EXPECT_EQ(members(*parity), want);
  EXPECT_EQ(parity->name(), "parity");
  EXPECT_EQ(parity->backend(), c.backend());
  EXPECT_EQ(c.counters().collectives, 0u) << "split and sub-communicator traffic count on their own";
  EXPECT_EQ(parity->counters().collectives, 1u);

  auto without0 = c.split(r == 0 ? -1 : 0, r);
  EXPECT_EQ(without0 == nullptr, r == 0);
  if (without0) EXPECT_EQ(without0->size(), n - 1);
  if (without0) EXPECT_EQ(without0->name(), "world/0");

  std::vector<int> evens_reversed;
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == 0) evens_reversed.push_back(q);
  auto group = c.subgroup(evens_reversed, "evens");
  EXPECT_EQ(group != nullptr, r % 2 == 0);
  if (group) EXPECT_EQ(members(*group), std::vector<int32_t>(evens_reversed.begin(), evens_reversed.end()));
}

TEST(CommSplit, MeshRowsAndColumns) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  // 2x2 at four ranks; n x 1 otherwise. Row-major coordinates as torch DeviceMesh(arange(n).reshape).
  const std::vector<int64_t> shape = n == 4 ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{n, 1};
  const std::vector<int64_t> coords{r / shape[1], r % shape[1]};
  const int row_dim[] = {1}, col_dim[] = {0}, both[] = {1, 0};
  auto row = c.split_mesh_dims(shape, coords, row_dim, "row");
  auto col = c.split_mesh_dims(shape, coords, col_dim, "col");
  auto all_t = c.split_mesh_dims(shape, coords, both, "transposed");
  std::vector<int32_t> want_row, want_col, want_t;
  for (int64_t j = 0; j < shape[1]; ++j) want_row.push_back(static_cast<int32_t>(coords[0] * shape[1] + j));
  for (int64_t i = 0; i < shape[0]; ++i) want_col.push_back(static_cast<int32_t>(i * shape[1] + coords[1]));
  for (int64_t j = 0; j < shape[1]; ++j)
    for (int64_t i = 0; i < shape[0]; ++i) want_t.push_back(static_cast<int32_t>(i * shape[1] + j));
  EXPECT_EQ(members(*row), want_row);
  EXPECT_EQ(members(*col), want_col);
  EXPECT_EQ(members(*all_t), want_t);
  // A collective on the sub-communicator: column sums of world ranks, counted on `col` only.
  float x = static_cast<float>(r), sum = 0;
  col->reset_counters();
  col->all_reduce(InBuffer(&x, CommType::F32, 1), OutBuffer(&sum, CommType::F32, 1), ReduceOp::Sum, "col sum").wait();
  EXPECT_EQ(sum, static_cast<float>(std::accumulate(want_col.begin(), want_col.end(), 0)));
  EXPECT_EQ(col->counters().collectives, 1u);
}

TEST(CommValidation, BadArgumentsThrowBeforeAnythingIsPosted) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  std::vector<float> buf(16 * n), out(16 * n);
  std::vector<BFloat16> bf(16 * n);
  std::vector<int64_t> ones(n, 1), displs = packed_displs(ones), short_counts(n + 1, 1), neg = ones;
  neg[0] = -1;
  std::vector<int64_t> self_mismatch = ones;
  self_mismatch[r] = 2;
  std::vector<int64_t> past_end(n, 0);
  past_end[n - 1] = 16 * n;
  c.reset_counters();
  EXPECT_THROW((void)c.all_to_all_v(buf, short_counts, displs, out, ones, displs, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.all_to_all_v(buf, neg, displs, out, ones, displs, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.all_to_all_v(buf, ones, displs, out, self_mismatch, displs, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.all_to_all_v(buf, ones, past_end, out, ones, displs, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.all_to_all_v(buf, ones, displs, OutBuffer(bf), ones, displs, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.all_to_all_v(buf, ones, displs, OutBuffer(buf), ones, displs, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.all_to_all(InBuffer(buf.data(), CommType::F32, 3 * n + 1), out, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.all_gather_v(InBuffer(buf.data(), CommType::F32, 2), out, ones, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.reduce_scatter_v(buf, out, ones, ReduceOp::Sum, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.all_reduce(InBuffer(buf.data() + 1, CommType::F32, 4), OutBuffer(buf.data(), CommType::F32, 4),
                                  ReduceOp::Sum, "x"),
               std::invalid_argument);
  EXPECT_THROW((void)c.all_reduce(InBuffer(nullptr, CommType::F32, 4), out, ReduceOp::Sum, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.broadcast(out, n, "x"), std::invalid_argument);
  EXPECT_THROW((void)c.broadcast(out, -1, "x"), std::invalid_argument);
  const int64_t bad_coords[] = {0, 5}, shape[] = {n, 1};
  const int dim[] = {1};
  EXPECT_THROW((void)c.split_mesh_dims(shape, bad_coords, dim), std::invalid_argument);
  const int twice[] = {0, 0};
  EXPECT_THROW((void)c.subgroup(twice), std::invalid_argument);
  EXPECT_THROW(c.set_default_timeout(std::chrono::milliseconds(0)), std::invalid_argument);
  EXPECT_THROW((void)make_communicator("gloo"), std::invalid_argument);
  // The message names the collective, the label and the field.
  try {
    (void)c.all_to_all_v(buf, neg, displs, out, ones, displs, "chunk 3 gather");
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[comm] all_to_all 'chunk 3 gather': send_counts[0] = -1"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(c.counters().collectives, 0u) << "a rejected call must not count";
  // Everything still works after the rejections (nothing was left posted).
  c.barrier("after validation").wait();
}

TEST(CommTimeout, DefaultFromEnvironment) {
  ::setenv("MESHMUON_TIMEOUT_S", "1.5", 1);
  EXPECT_EQ(make_single_communicator()->default_timeout(), std::chrono::milliseconds(1500));
  ::setenv("MESHMUON_TIMEOUT_S", "soon", 1);
  EXPECT_THROW((void)make_single_communicator(), std::invalid_argument);
  ::unsetenv("MESHMUON_TIMEOUT_S");
  EXPECT_EQ(make_single_communicator()->default_timeout(), std::chrono::seconds(300));
  auto sub = comm().split(0, comm().rank());  // inherits the parent's (the test main sets 30 s)
  EXPECT_EQ(sub->default_timeout(), comm().default_timeout());
}

TEST(CommCounters, PredictorsMatchTheCounters) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  std::vector<int64_t> counts(n);
  for (int j = 0; j < n; ++j) counts[j] = gather_count(j, 3);
  std::vector<BFloat16> send(counts[r]), recv(std::accumulate(counts.begin(), counts.end(), int64_t{0}));
  c.reset_counters();
  c.all_gather_v(send, recv, counts, "predicted").wait();
  const ByteCount p = comm_bytes_all_gather_v(r, counts, sizeof(BFloat16));
  EXPECT_EQ(c.counters().bytes_sent, p.sent);
  EXPECT_EQ(c.counters().bytes_recv, p.recv);
  c.reset_counters();
  EXPECT_EQ(c.counters().bytes_sent + c.counters().bytes_recv + c.counters().collectives, 0u);
  EXPECT_EQ(balanced_counts(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(balanced_counts(0, 3), (std::vector<int64_t>{0, 0, 0}));
}

// Negative control: the bitwise comparison used above does catch a one-bit difference, and a
// reduction checked against the wrong op fails.
TEST(CommNegativeControl, ComparisonsCanFail) {
  Communicator& c = comm();
  const int n = c.size();
  std::vector<float> send(n, 1.0f), recv(n), want(n, 1.0f);
  c.all_to_all(send, recv, "control").wait();
  ASSERT_TRUE(same_bits(recv, want));
  recv[n - 1] = std::nextafter(recv[n - 1], 2.0f);
  EXPECT_FALSE(same_bits(recv, want));
  int64_t x = c.rank() + 1, y = 0;
  c.all_reduce(InBuffer(&x, CommType::I64, 1), OutBuffer(&y, CommType::I64, 1), ReduceOp::Max, "control max").wait();
  EXPECT_EQ(static_cast<double>(y), reference(ReduceOp::Max, n, [](int q) { return q + 1; }));
  if (n > 1) EXPECT_NE(static_cast<double>(y), reference(ReduceOp::Sum, n, [](int q) { return q + 1; }));
}

}  // namespace
}  // namespace meshmuon
