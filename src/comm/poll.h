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

// What a polling thread does when a pass made no progress (docs/decisions/054-waiting-for-a-peer.md):
// - spin for 50 µs: small operations finish in microseconds, without a system call;
// - then yield until 2 ms: ranks are often oversubscribed on few cores, and a waiter that gives up
//   its core lets the peer it waits for run (Open MPI progresses non-blocking operations only inside
//   MPI calls, so the waiter keeps calling test());
// - then nap 1/200 of the time waited so far, 20 µs to 200 µs: the wake-up a nap adds to the wait
//   stays a small fraction of it (a peer 3 ms late cost the next exchange ~400 µs with 200 µs naps
//   from 2.3 ms on), and a long wait still naps 200 µs (each nap costs ~13 µs of CPU and ~65 µs
//   more than asked on this box: timer slack and the wake-up).
// Never past `deadline`: every wait still ends with its timeout error. progressed() starts over.
class PollBackoff {
 public:
  void progressed() { idle_since_ = {}; }
  // Waits a little (never past `deadline`).
  void idle(CommClock::time_point deadline = CommClock::time_point::max());

  // The schedule idle() follows, after `waited` without progress: a nap of zero spins or yields.
  enum class Phase { spin, yield, nap };
  struct Step {
    Phase phase;
    std::chrono::microseconds nap;
  };
  static Step step(CommClock::duration waited);

  static constexpr std::chrono::microseconds kSpin{50};
  static constexpr std::chrono::milliseconds kYield{2};
  static constexpr std::chrono::microseconds kFirstNap{20};
  static constexpr std::chrono::microseconds kMaxNap{200};
  static constexpr int kNapFraction = 200;  // a nap is 1/kNapFraction of the time waited

 private:
  CommClock::time_point idle_since_{};
};

}  // namespace meshmuon::detail
