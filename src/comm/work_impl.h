// Internal: one posted operation behind a Work (its transport op, and what a timeout error names),
// and what a root communicator and its splits share. Polled by Work::test / Work::wait (work.cpp).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "meshmuon/comm.h"
#include "meshmuon/comm_transport.h"

namespace meshmuon::detail {

// Shared by a root communicator and every communicator split from it.
struct CommRoot {
  std::string backend;  // WorkInfo::backend views this string: Works keep the root alive
  int world_rank = 0;
  bool broken = false;  // a wait timed out: nothing more is posted, destructors do not wait
};

// What a Work needs to name itself in a timeout error.
struct WorkInfo {
  std::string_view backend;  // the transport's: "single" | "mpi" | "nccl" | "c10d"
  std::string_view op;       // "all_to_all", "all_gather", ..., "send", "recv", "group"
  std::string label;         // the caller's label, e.g. "chunk 3 gather"
  std::string comm_name;
  int world_rank = 0;
  int comm_rank = 0;
  int comm_size = 1;
  std::chrono::milliseconds default_timeout{0};
};

class WorkImpl {
 public:
  // `op` null: complete when posted. `transport` may be null (an op before a communicator exists).
  WorkImpl(WorkInfo info, std::shared_ptr<CommRoot> root, std::shared_ptr<Transport> transport,
           std::unique_ptr<TransportOp> op);
  ~WorkImpl();

  // Drives progress once; true when the operation has completed. Throws meshmuon::Error on failure.
  bool poll();
  // Called once when a wait passes its deadline, before the error is thrown.
  void on_timeout();
  // False when a destructor must not wait for this Work (the root is broken, or the op says so).
  bool destructor_may_wait() const;
  // An unfinished Work destroyed without completing: true when the transport let go of the buffers
  // (the state is then freed), false to leak it (the transport may still use them).
  bool abandon();

  const WorkInfo& info() const { return info_; }
  bool done = false;

 private:
  WorkInfo info_;
  std::shared_ptr<CommRoot> root_;
  std::shared_ptr<Transport> transport_;
  std::unique_ptr<TransportOp> op_;
};

// MESHMUON_TIMEOUT_S (seconds) or 300 s; std::invalid_argument when the variable is not a positive number.
std::chrono::milliseconds default_timeout_from_env();

}  // namespace meshmuon::detail
