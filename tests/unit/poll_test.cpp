// The back-off of a waiting thread (src/comm/poll.h, PollBackoff::step): spin, then yield, then naps
// that grow with the time waited. The naps are what a peer that arrives late pays on top of its
// lateness (docs/decisions/054-waiting-for-a-peer.md), so they must stay a small share of the wait; a
// long wait must still nap the longest nap (a waiter does not burn a core). The schedule before
// (20 µs doubling each nap to 200 µs from 2 ms on) napped 200 µs at 3 ms: over the bound checked here.
#include <gtest/gtest.h>

#include <chrono>

#include "comm/poll.h"

namespace {

using meshmuon::detail::PollBackoff;
using Phase = PollBackoff::Phase;
using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(PollBackoff, SpinsThenYieldsThenNaps) {
  EXPECT_EQ(PollBackoff::step(microseconds(0)).phase, Phase::spin);
  EXPECT_EQ(PollBackoff::step(microseconds(49)).phase, Phase::spin);
  EXPECT_EQ(PollBackoff::step(microseconds(50)).phase, Phase::yield);
  EXPECT_EQ(PollBackoff::step(microseconds(1999)).phase, Phase::yield);
  EXPECT_EQ(PollBackoff::step(milliseconds(2)).phase, Phase::nap);
  EXPECT_EQ(PollBackoff::step(std::chrono::seconds(600)).phase, Phase::nap);
  EXPECT_EQ(PollBackoff::step(microseconds(49)).nap, microseconds(0));
  EXPECT_EQ(PollBackoff::step(microseconds(1999)).nap, microseconds(0));
}

TEST(PollBackoff, NapIsASmallShareOfTheWait) {
  // A peer 3 ms late: the waiter naps 20 µs (it napped 200 µs before, ~400 µs on the exchange).
  EXPECT_EQ(PollBackoff::step(milliseconds(3)).nap, microseconds(20));
  for (auto waited = microseconds(2000); waited <= milliseconds(100); waited += microseconds(250)) {
    const auto nap = PollBackoff::step(waited).nap;
    EXPECT_GE(nap, PollBackoff::kFirstNap) << waited.count() << " us";
    EXPECT_LE(nap, std::max(PollBackoff::kFirstNap, microseconds(waited.count() / 200))) << waited.count() << " us";
  }
}

TEST(PollBackoff, NapsGrowToTheLongestAndStayThere) {
  auto last = microseconds(0);
  for (auto waited = microseconds(2000); waited <= milliseconds(200); waited += microseconds(100)) {
    const auto nap = PollBackoff::step(waited).nap;
    EXPECT_GE(nap, last) << waited.count() << " us";
    last = nap;
  }
  EXPECT_EQ(PollBackoff::step(milliseconds(40)).nap, PollBackoff::kMaxNap);
  EXPECT_EQ(PollBackoff::step(std::chrono::hours(1)).nap, PollBackoff::kMaxNap);
  EXPECT_EQ(PollBackoff::kMaxNap, microseconds(200));
}

}  // namespace
