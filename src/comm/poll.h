// Internal: the one way a loop drives posted Works against their deadlines while it does other
// work between polls (the executor's chunk pipeline, FSDP's gradient reduction), and the backoff a
// waiting thread uses when nothing progressed (Work::wait uses the same one).
#pragma once

#include <chrono>
#include <span>

#include "meshmuon/comm.h"

namespace meshmuon::detail {

// True when `w` has completed (drives progress once). Once `timeout` has passed since `posted`, it
// waits out the deadline instead: the communicator's timeout error is thrown (or the Work completes).
bool poll_work(Work& w, CommClock::time_point posted, std::chrono::milliseconds timeout);
// Every Work of `ws` complete (each polled once, as poll_work).
bool poll_works(std::span<Work> ws, CommClock::time_point posted, std::chrono::milliseconds timeout);

// What a polling thread does when a pass made no progress: spin first (small operations finish in
// microseconds), then yield, then sleep with backoff up to 200 µs (ranks are often oversubscribed on
// few cores: a waiter that gives up its core lets the peer it waits for run; Open MPI progresses
// non-blocking collectives only inside MPI calls, so the sleep stays short). progressed() starts over.
class PollBackoff {
 public:
  void progressed() { idle_since_ = {}; nap_ = kFirstNap; }
  // Waits a little (never past `deadline`).
  void idle(CommClock::time_point deadline = CommClock::time_point::max());

 private:
  static constexpr std::chrono::microseconds kFirstNap{20};
  CommClock::time_point idle_since_{};
  std::chrono::microseconds nap_ = kFirstNap;
};

}  // namespace meshmuon::detail
