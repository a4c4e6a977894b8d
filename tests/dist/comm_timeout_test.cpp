// Timeout: the last rank posts its part of an all_reduce only after the others' deadline (1 s).
// The others must get meshmuon::Error naming their rank, the collective and the label, no earlier
// than the deadline and without hanging; new collectives must then be refused. The late rank then
// posts, the timed-out Works complete, and every rank finalizes cleanly: exit 0 only if every rank
// saw what it should. With --abort the late rank never posts; after the same checks rank 0 ends the
// job with meshmuon::abort_all(42) (the CLI's path), which CTest expects to see in mpirun's output.
// With --p2p the same story for point-to-point: the late rank's group of sends comes late; rank 0
// waits on a group holding its recv, the others on a plain recv.
// Run: mpirun -n 3 --oversubscribe build/bin/comm_timeout_test [--abort | --p2p]
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "meshmuon/comm.h"
#include "meshmuon/error.h"

namespace {

int g_failures = 0;

void check(bool ok, int rank, const std::string& what) {
  if (ok) return;
  ++g_failures;
  std::fprintf(stderr, "[rank %d] FAILED: %s\n", rank, what.c_str());
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

int main(int argc, char** argv) {
  using namespace std::chrono;
  const bool abort_mode = argc > 1 && std::string(argv[1]) == "--abort";
  const bool p2p = argc > 1 && std::string(argv[1]) == "--p2p";
  auto comm = meshmuon::make_mpi_communicator();
  const int rank = comm->rank(), size = comm->size(), late = size - 1;
  // The ranks that wait, made before anything breaks: they agree on the verdict in --abort mode.
  MPI_Comm waiters = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank == late && size > 1 ? MPI_UNDEFINED : 0, rank, &waiters);
  const auto deadline = milliseconds(1000), late_by = milliseconds(3000);
  std::vector<float> in(1000, static_cast<float>(rank + 1)), out(1000, 0.0f);
  const float want = static_cast<float>(p2p ? size : size * (size + 1) / 2);  // p2p: the late rank's rank + 1
  const std::string op = !p2p ? "all_reduce" : rank == 0 ? "group" : "recv";
  const std::string label = p2p ? "halo" : "chunk 3 gather";
  auto post = [&]() -> meshmuon::Work {
    if (!p2p) return comm->all_reduce(in, out, meshmuon::ReduceOp::Sum, label);
    if (size == 1 || rank == late || rank == 0) {
      comm->group_begin();
      if (rank == late)  // size 1: a self-exchange that completes at once
        for (int q = 0; q < size; ++q)
          if (q != late || size == 1) (void)comm->send(in, q, label);
      if (rank != late || size == 1) (void)comm->recv(out, late, label);
      return comm->group_end(label);
    }
    return comm->recv(out, late, label);
  };

  if (rank == late && size > 1) {
    if (abort_mode) std::this_thread::sleep_for(seconds(100));  // never answers; ended by the abort
    std::this_thread::sleep_for(late_by);  // stops answering past everyone's deadline
    meshmuon::Work w = post();
    w.wait(seconds(60));
  } else {
    const auto start = steady_clock::now();
    meshmuon::Work w = post();
    std::string message;
    try {
      w.wait(deadline);
    } catch (const meshmuon::Error& e) {
      message = e.what();
    }
    const auto waited = steady_clock::now() - start;
    if (size == 1) {
      check(message.empty() && out[0] == want, rank, "a size-1 " + op + " completes at once");
    } else {
      check(!message.empty(), rank, "the wait should have timed out");
      check(waited >= deadline, rank, "the timeout fired before the deadline");
      const std::string head = "[mpi] rank " + std::to_string(rank) + ": " + op + " '" + label + "' timed out after 1 s";
      check(contains(message, head), rank, "message '" + message + "' should start with '" + head + "'");
      check(contains(message, "communicator 'world'"), rank, "message names the communicator: " + message);
      // The process is now marked broken: new collectives are refused with a clear error.
      std::string refused;
      try {
        comm->barrier("after timeout").wait();
      } catch (const meshmuon::Error& e) {
        refused = e.what();
      }
      check(contains(refused, "cannot post barrier 'after timeout'"), rank, "new collective refused: " + refused);
      if (abort_mode) {
        int local = g_failures, total = 0;
        MPI_Allreduce(&local, &total, 1, MPI_INT, MPI_SUM, waiters);
        if (rank == 0) {
          std::printf("comm_timeout_test --abort: %d failure(s); ending the job\n", total);
          meshmuon::abort_all(total == 0 ? 42 : 1);
        }
        std::this_thread::sleep_for(seconds(100));  // ended by rank 0's abort
      }
      // The late rank posts eventually: the same Work may be waited again and completes.
      try {
        w.wait(seconds(60));
      } catch (const std::exception& e) {
        check(false, rank, std::string("second wait: ") + e.what());
      }
    }
  }
  if (!p2p || rank != late || size == 1) check(out[0] == want && out[999] == want, rank, op + " result");  // the late p2p rank only sends

  // Verdict over MPI_COMM_WORLD directly: the library refuses new collectives by design now.
  int local = g_failures, total = 0;
  MPI_Allreduce(&local, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("comm_timeout_test: %s (%d failure(s) over %d ranks)\n", total ? "FAILED" : "passed", total, size);
  if (waiters != MPI_COMM_NULL) MPI_Comm_free(&waiters);
  comm.reset();
  return total == 0 ? 0 : 1;  // MPI finalizes at exit: nothing is left posted
}
