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

PollBackoff::Step PollBackoff::step(CommClock::duration waited) {
  if (waited < kSpin) return {Phase::spin, {}};
  if (waited < kYield) return {Phase::yield, {}};
  const auto share = std::chrono::duration_cast<std::chrono::microseconds>(waited / kNapFraction);
  return {Phase::nap, std::clamp(share, kFirstNap, kMaxNap)};
}

void PollBackoff::idle(CommClock::time_point deadline) {
  const auto now = CommClock::now();
  if (idle_since_ == CommClock::time_point{}) idle_since_ = now;
  const Step s = step(now - idle_since_);
  if (s.phase == Phase::spin) return;
  if (s.phase == Phase::yield) {
    std::this_thread::yield();
    return;
  }
  if (now >= deadline) return;
  std::this_thread::sleep_for(std::min<CommClock::duration>(s.nap, deadline - now));
}

}  // namespace meshmuon::detail
