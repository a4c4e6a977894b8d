// GoogleTest main for tests/dist: makes the communicator under test once (DMUON_TEST_BACKEND=mpi,
// the default, or single), prints failures from every rank (full output from rank 0 only), and fails
// the process on EVERY rank when any rank failed (max-reduced over the communicator).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "dist_env.h"
#include "staging_spaces.h"

namespace {

std::unique_ptr<dmuon::Communicator> g_comm;

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

}  // namespace

namespace dmuon::test {
Communicator& comm() { return *g_comm; }
std::string_view expected_backend() {
  const char* b = std::getenv("DMUON_TEST_BACKEND");
  const std::string_view name = b != nullptr && *b != '\0' ? std::string_view(b) : std::string_view("mpi");
  return name == "mpi-staged" ? std::string_view("mpi") : name;
}
}  // namespace dmuon::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // mpi-staged: the mpi backend with every buffer treated as device memory and a 4 KiB chunk,
  // so the whole suite runs through the staged path (src/comm/mpi/mpi_staging.h).
  const char* requested = std::getenv("DMUON_TEST_BACKEND");
  if (requested != nullptr && std::string_view(requested) == "mpi-staged") {
    dmuon::detail::StagingOptions staging;
    staging.chunk_bytes = 4096;
    staging.pool_bytes = 16384;
    g_comm = dmuon::make_mpi_communicator(std::make_shared<dmuon::test::AllDeviceSpace>(), staging);
  } else {
    g_comm = dmuon::make_communicator(dmuon::test::expected_backend());
  }
  g_comm->set_default_timeout(std::chrono::seconds(30));  // a mismatch fails fast, well inside CTest's limit
  const int rank = g_comm->rank();
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int32_t failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  try {
    g_comm->all_reduce(dmuon::OutBuffer(&failed, dmuon::CommType::I32, 1), dmuon::ReduceOp::Max, "test verdict")
        .wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] could not agree on the verdict: %s\n", rank, e.what());
    dmuon::abort_all(1);  // a broken job cannot finalize cleanly
  }
  if (rank == 0 && failed) std::fprintf(stderr, "comm tests FAILED on at least one rank\n");
  g_comm.reset();
  return failed ? 1 : 0;
}
