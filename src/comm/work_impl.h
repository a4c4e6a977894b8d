// Backend side of a Work: one posted collective, polled by Work::test / Work::wait (src/comm/work.cpp).
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "dmuon/comm.h"

namespace dmuon::detail {

// What a Work needs to name itself in a timeout error.
struct WorkInfo {
  std::string_view backend;  // "single" | "mpi"
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
  explicit WorkImpl(WorkInfo info) : info_(std::move(info)) {}
  virtual ~WorkImpl() = default;

  // Drives progress once; true when the collective has completed. Throws dmuon::Error on failure.
  virtual bool poll() = 0;
  // Called once when a wait passes its deadline, before the error is thrown.
  virtual void on_timeout() {}
  // False when a destructor must not wait for this Work (process already broken).
  virtual bool destructor_may_wait() const { return true; }
  // Called when an unfinished Work is destroyed without completing: true when the backend has let
  // go of the buffers (the state is then freed), false to leak it (MPI may still use them).
  virtual bool abandon() { return false; }

  const WorkInfo& info() const { return info_; }
  bool done = false;

 private:
  WorkInfo info_;
};

// DMUON_TIMEOUT_S (seconds) or 300 s; std::invalid_argument when the variable is not a positive number.
std::chrono::milliseconds default_timeout_from_env();

// A Work that completed when it was posted (single backend, local shortcuts).
Work make_completed_work(WorkInfo info);

}  // namespace dmuon::detail
