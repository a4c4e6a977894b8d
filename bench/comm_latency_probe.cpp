// Latency probe of meshmuon's wait for a peer (src/comm/poll.h, PollBackoff): a 4-byte grouped
// send/recv with every peer (the owner_a2a round `bench calibrate` fits) through meshmuon's
// Communicator, against raw MPI Isend/Irecv + Waitall of the same op, interleaved round by round in
// ONE run. Two rounds with a late peer (rank 0 busy `late_us` before the barrier) show what a waiter
// that went to sleep costs the exchange that follows; one round with a long-late peer (rank 0 busy
// `idle_ms`) shows the CPU share a waiter burns while it waits. Prints medians and p90, max over
// ranks. docs/decisions/054-waiting-for-a-peer.md has the figures.
//   mpirun -np 2 --oversubscribe --bind-to none build/bin/comm_latency_probe [rounds] [late_us] [idle_ms]
//   (prefix `taskset -c 0`: every rank on one core)
#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "meshmuon/comm.h"

namespace {

namespace mm = meshmuon;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
void busy(double seconds) {
  const auto t = Clock::now();
  while (since(t) < seconds) {
  }
}
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Peers {
  int me = 0, n = 1;
  MPI_Comm raw = MPI_COMM_NULL;
  mm::Communicator* comm = nullptr;
  std::vector<char> send, recv;

  void raw_exchange() {
    std::vector<MPI_Request> q;
    for (int k = 1; k < n; ++k) {
      q.emplace_back();
      MPI_Isend(send.data() + 4 * (k - 1), 4, MPI_BYTE, (me + k) % n, 0, raw, &q.back());
      q.emplace_back();
      MPI_Irecv(recv.data() + 4 * (k - 1), 4, MPI_BYTE, (me - k + n) % n, 0, raw, &q.back());
    }
    MPI_Waitall(static_cast<int>(q.size()), q.data(), MPI_STATUSES_IGNORE);
  }
  void meshmuon_exchange() {
    comm->group_begin();
    for (int k = 1; k < n; ++k) {
      (void)comm->send(mm::InBuffer(send.data() + 4 * (k - 1), mm::CommType::U8, 4), (me + k) % n, "probe");
      (void)comm->recv(mm::OutBuffer(recv.data() + 4 * (k - 1), mm::CommType::U8, 4), (me - k + n) % n, "probe");
    }
    comm->group_end("probe").wait();
  }
  void meshmuon_barrier() { comm->barrier("probe").wait(); }
  void raw_barrier() { MPI_Barrier(raw); }
};

// One kind of round: `before` (untimed, e.g. a barrier), then `timed`, whose seconds are recorded.
struct Round {
  std::string name;
  std::function<void()> before, timed;
  std::vector<double> seconds;
};

double quantile(std::vector<double> x, double q) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0.0 : x[static_cast<size_t>(q * static_cast<double>(x.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  int level = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &level);
  Peers p;
  MPI_Comm_rank(MPI_COMM_WORLD, &p.me);
  MPI_Comm_size(MPI_COMM_WORLD, &p.n);
  MPI_Comm_dup(MPI_COMM_WORLD, &p.raw);
  auto comm = mm::make_communicator("mpi");
  p.comm = comm.get();
  p.send.assign(4 * static_cast<size_t>(std::max(p.n - 1, 1)), 1);
  p.recv.resize(p.send.size());
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 300;
  const double late = (argc > 2 ? std::atof(argv[2]) : 3000.0) * 1e-6;
  const double idle = (argc > 3 ? std::atof(argv[3]) : 20.0) * 1e-3;
  const std::string late_label = std::to_string(static_cast<int>(late * 1e6)) + "us";
  auto late_rank0 = [&] {
    if (p.me == 0) busy(late);
  };

  std::vector<Round> r;
  r.push_back({"raw exch (MPI_Barrier)", [&] { p.raw_barrier(); }, [&] { p.raw_exchange(); }, {}});
  r.push_back({"meshmuon exch (MPI_Barrier)", [&] { p.raw_barrier(); }, [&] { p.meshmuon_exchange(); }, {}});
  r.push_back({"meshmuon exch (meshmuon barrier)", [&] { p.meshmuon_barrier(); }, [&] { p.meshmuon_exchange(); }, {}});
  r.push_back({"meshmuon barrier alone", [&] { p.raw_barrier(); }, [&] { p.meshmuon_barrier(); }, {}});
  r.push_back({"late " + late_label + ": meshmuon barrier, exch", [&] { late_rank0(); p.meshmuon_barrier(); },
               [&] { p.meshmuon_exchange(); }, {}});
  r.push_back({"late " + late_label + ": MPI_Barrier, raw exch", [&] { late_rank0(); p.raw_barrier(); },
               [&] { p.raw_exchange(); }, {}});

  // The CPU share of a long wait: rank 0 busy `idle` seconds, the others wait in a meshmuon barrier.
  std::vector<double> idle_share;
  const int warmup = 20;
  for (int i = 0; i < rounds + warmup; ++i) {
    for (Round& x : r) {
      x.before();
      const auto t0 = Clock::now();
      x.timed();
      if (i >= warmup) x.seconds.push_back(since(t0));
    }
    if (i >= warmup && i % 10 == 0) {
      p.raw_barrier();
      if (p.me == 0) busy(idle);
      const double cpu0 = process_cpu_seconds();
      const auto t0 = Clock::now();
      p.meshmuon_barrier();
      if (p.me != 0) idle_share.push_back((process_cpu_seconds() - cpu0) / since(t0));
    }
  }
  for (const Round& x : r) {
    double mine[2] = {quantile(x.seconds, 0.5), quantile(x.seconds, 0.9)}, most[2] = {0, 0};
    MPI_Reduce(mine, most, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (p.me == 0)
      std::printf("np%d %-40s median %8.1f us  p90 %8.1f us\n", p.n, x.name.c_str(), most[0] * 1e6, most[1] * 1e6);
  }
  double share = idle_share.empty() ? 0.0 : quantile(idle_share, 0.5), most_share = 0;
  MPI_Reduce(&share, &most_share, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (p.me == 0)
    std::printf("np%d %-40s median %8.1f %% of a core\n", p.n,
                ("waiting " + std::to_string(static_cast<int>(idle * 1e3)) + "ms for a peer: CPU").c_str(),
                most_share * 100.0);
  comm.reset();
  MPI_Comm_free(&p.raw);
  MPI_Finalize();
  return 0;
}
