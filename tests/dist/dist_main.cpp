// GoogleTest main for tests/dist: makes the communicator under test once (MESHMUON_TEST_BACKEND=mpi,
// the default, or single), prints failures from every rank (full output from rank 0 only), and
// after EVERY test agrees across ranks on whether it failed anywhere. A test that failed on one rank
// fails on all, rank 0 names the ranks and their first messages (the cause first, the timeouts it
// caused after), and the remaining tests are skipped on every rank: a rank that threw leaves the
// others' collectives to time out, after which the communicators are unusable and every later test
// would fail for that reason only, burying the cause. The agreement runs on an MPI communicator of
// its own (raw MPI: meshmuon refuses every collective after a timeout, by design), duplicated before
// any test, so a test that broke meshmuon's communicators cannot break it.
#include <gtest/gtest.h>
#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "dist_env.h"
#include "staging_spaces.h"

namespace {

std::unique_ptr<meshmuon::Communicator> g_comm;

// The agreements after each test and the final one: a duplicate of MPI_COMM_WORLD (or this process
// alone on the single backend), every wait bounded.
class VerdictChannel {
 public:
  VerdictChannel() {
    int up = 0;
    MPI_Initialized(&up);
    if (!up) return;  // the single backend without mpirun: one process
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_size(comm_, &size_);
  }
  int size() const { return size_; }
  // every rank's `bytes` bytes, in rank order; false when a rank did not answer within `seconds`
  bool all_gather(const char* mine, char* all, int bytes, int seconds) {
    if (comm_ == MPI_COMM_NULL) return std::memcpy(all, mine, size_t(bytes)), true;
    MPI_Request req;
    MPI_Iallgather(mine, bytes, MPI_CHAR, all, bytes, MPI_CHAR, comm_, &req);
    return wait(req, seconds);
  }
  bool any(int32_t& flag, int seconds) {
    if (comm_ == MPI_COMM_NULL) return true;
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, &flag, 1, MPI_INT32_T, MPI_MAX, comm_, &req);
    return wait(req, seconds);
  }

 private:
  static bool wait(MPI_Request& req, int seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    int done = 0;
    while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return done != 0;
  }
  MPI_Comm comm_ = MPI_COMM_NULL;  // never freed: a job that timed out cannot finalize anyway
  int size_ = 1;
};
std::unique_ptr<VerdictChannel> g_verdict;

constexpr size_t kMessageBytes = 480;  // each rank's first failure, as sent to the others

// Ranks other than 0 print only their failures, each line prefixed with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] failure at %s:%d\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

// After each test: one all-gather of every rank's verdict and first failure message. Appended
// after the result printer, so it runs before it at OnTestEnd (gtest calls end events in reverse):
// a failure it adds shows in the printed verdict. With --gtest_fail_fast set, gtest then skips the
// rest on every rank alike.
class VerdictAgreement : public ::testing::EmptyTestEventListener {
 public:
  explicit VerdictAgreement(int rank) : rank_(rank) {}

  void OnTestStart(const ::testing::TestInfo&) override { first_.clear(); }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed() && first_.empty())
      first_ = std::string(r.file_name() ? r.file_name() : "?") + ":" + std::to_string(r.line_number()) + ": " +
               r.summary();
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    const int n = g_verdict->size();
    std::array<char, kMessageBytes> mine{};
    const bool failed = info.result()->Failed();
    if (failed) std::snprintf(mine.data(), mine.size(), "F%s", first_.c_str());
    std::vector<char> all(kMessageBytes * size_t(n));
    if (!g_verdict->all_gather(mine.data(), all.data(), static_cast<int>(kMessageBytes), 120)) {
      std::fprintf(stderr, "[rank %d] no verdict on %s.%s: a rank did not answer within 120 s\n", rank_,
                   info.test_suite_name(), info.name());
      meshmuon::abort_all(1);  // a rank is gone or stuck: nothing more to learn from this job
    }
    std::vector<int> bad, timeouts;
    for (int r = 0; r < n; ++r) {
      const char* m = all.data() + kMessageBytes * size_t(r);
      if (m[0] != 'F') continue;
      (std::strstr(m, "timed out") != nullptr ? timeouts : bad).push_back(r);
    }
    if (bad.empty() && timeouts.empty()) return;
    const std::string name = std::string(info.test_suite_name()) + "." + info.name();
    if (rank_ == 0) {
      std::fprintf(stderr, "\n[dist] FIRST FAILURE: %s\n", name.c_str());
      for (const auto* group : {&bad, &timeouts})
        for (int r : *group)
          std::fprintf(stderr, "[dist]   rank %d%s: %.*s\n", r, group == &timeouts ? " (timed out)" : "",
                       static_cast<int>(kMessageBytes - 1), all.data() + kMessageBytes * size_t(r) + 1);
      std::fprintf(stderr, "[dist] the remaining tests are skipped on every rank (a failed collective leaves the "
                           "communicators unusable)\n\n");
    }
    if (!failed) {
      std::string ranks;
      for (const auto* group : {&bad, &timeouts})
        for (int r : *group) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      ADD_FAILURE() << "failed on rank(s) " << ranks << " (this rank passed); see rank 0's [dist] lines";
    }
  }

 private:
  int rank_;
  std::string first_;
};

}  // namespace

namespace meshmuon::test {
Communicator& comm() { return *g_comm; }
std::string_view expected_backend() {
  const char* b = std::getenv("MESHMUON_TEST_BACKEND");
  const std::string_view name = b != nullptr && *b != '\0' ? std::string_view(b) : std::string_view("mpi");
  return name == "mpi-staged" ? std::string_view("mpi") : name;
}
}  // namespace meshmuon::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(fail_fast, true);  // with VerdictAgreement: a failure anywhere stops every rank
  // mpi-staged: the mpi backend with every buffer treated as device memory and a 4 KiB chunk,
  // so the whole suite runs through the staged path (src/comm/mpi/mpi_staging.h).
  const char* requested = std::getenv("MESHMUON_TEST_BACKEND");
  if (requested != nullptr && std::string_view(requested) == "mpi-staged") {
    meshmuon::detail::StagingOptions staging;
    staging.chunk_bytes = 4096;
    staging.pool_bytes = 16384;
    g_comm = meshmuon::make_mpi_communicator(std::make_shared<meshmuon::test::AllDeviceSpace>(), staging);
  } else {
    g_comm = meshmuon::make_communicator(meshmuon::test::expected_backend());
  }
  g_verdict = std::make_unique<VerdictChannel>();
  g_comm->set_default_timeout(std::chrono::seconds(30));  // a mismatch fails fast, well inside CTest's limit
  const int rank = g_comm->rank();
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  listeners.Append(new VerdictAgreement(rank));
  int32_t failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  if (!g_verdict->any(failed, 120)) {
    std::fprintf(stderr, "[rank %d] no final verdict: a rank did not answer within 120 s\n", rank);
    meshmuon::abort_all(1);  // a broken job cannot finalize cleanly
  }
  if (rank == 0 && failed) std::fprintf(stderr, "dist tests FAILED on at least one rank\n");
  g_comm.reset();
  return failed ? 1 : 0;
}
