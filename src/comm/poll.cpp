// Internal: the deadline poll and the idle backoff (poll.h).
#include "comm/poll.h"

#include <algorithm>
#include <thread>

namespace meshmuon::detail {

bool poll_work(Work& w, CommClock::time_point posted, std::chrono::milliseconds timeout) {
  if (w.completed() || w.test()) return true;
  if (CommClock::now() - posted <= timeout) return false;
  w.wait_until(posted + timeout, timeout);  // past: throws the communicator's timeout error, or completes
  return true;
}

bool poll_works(std::span<Work> ws, CommClock::time_point posted, std::chrono::milliseconds timeout) {
  bool all = true;
  for (Work& w : ws) all = poll_work(w, posted, timeout) && all;
  return all;
}

void PollBackoff::idle(CommClock::time_point deadline) {
  const auto now = CommClock::now();
  if (idle_since_ == CommClock::time_point{}) idle_since_ = now;
  const auto spent = now - idle_since_;
  if (spent < std::chrono::microseconds(50)) return;  // spin
  if (spent < std::chrono::milliseconds(2)) {
    std::this_thread::yield();
    return;
  }
  if (now >= deadline) return;
  std::this_thread::sleep_for(std::min<CommClock::duration>(nap_, deadline - now));
  nap_ = std::min(nap_ * 2, std::chrono::microseconds(200));
}

}  // namespace meshmuon::detail
