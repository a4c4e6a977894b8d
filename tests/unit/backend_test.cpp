// The backend seam (src/backend/backend.h) on the cpu backend: buffers, streams and events (order,
// errors, inline mode), capability query, backend selection (cuda refused without CUDA or a device), batched
// Muon units equal to unit-by-unit calls bitwise, and Gram Newton–Schulz with a reduce callback
// against the plain iteration. Run: build/bin/backend_test
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "backend/backend.h"
#include "backend/select.h"
#include "meshmuon/error.h"
#include "test_support.h"

namespace meshmuon::detail {
namespace {

using meshmuon::test::randn;

TEST(Backend, SelectionAndCapabilities) {
  auto cpu = select_device("cpu").backend;
  EXPECT_EQ(cpu->name(), "cpu");
  EXPECT_EQ(to_string(cpu->device()), "cpu");
  EXPECT_FALSE(cpu->capabilities().device_memory);
  try {
    auto cuda = select_device("cuda").backend;  // a build with the cuda backend on a machine with a device
    EXPECT_EQ(cuda->name(), "cuda");
    EXPECT_TRUE(cuda->capabilities().device_memory);
  } catch (const Error& e) {  // without CUDA in the build, or without a device (cuda_backend_test)
    const std::string what = e.what();
    EXPECT_TRUE(what.find("[cuda] meshmuon was built without CUDA") != std::string::npos ||
                what.find("[cuda] no CUDA device: ") != std::string::npos)
        << what;
  }
  EXPECT_THROW(select_device("tpu"), std::invalid_argument);
}

TEST(Backend, BuffersAreZeroedAndOwned) {
  auto cpu = make_cpu_backend();
  Buffer b = cpu->allocate(1000, MemoryKind::Host);
  ASSERT_NE(b.data(), nullptr);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(b.as<unsigned char>()[i], 0);
  Buffer moved = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(moved.bytes(), 1000u);
  EXPECT_THROW(cpu->allocate(8, MemoryKind::Device), std::invalid_argument);
}

TEST(Backend, StreamsRunInOrderAndEventsFollow) {
  auto cpu = make_cpu_backend();
  for (bool threaded : {true, false}) {
    auto s = cpu->make_stream(threaded);
    std::vector<int> order;
    for (int i = 0; i < 50; ++i) s->submit([&order, i] { order.push_back(i); });
    Event e = s->record();
    s->synchronize();
    EXPECT_TRUE(e.done());
    ASSERT_EQ(order.size(), 50u);
    for (int i = 0; i < 50; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
    EXPECT_FALSE(s->busy());
  }
}

TEST(Backend, StreamErrorsSurfaceAndStopLaterWork) {
  auto cpu = make_cpu_backend();
  for (bool threaded : {true, false}) {
    auto s = cpu->make_stream(threaded);
    std::atomic<int> after{0};
    s->submit([] { throw std::runtime_error("job failed"); });
    s->submit([&] { ++after; });
    Event e = s->record();
    EXPECT_THROW(s->synchronize(), std::runtime_error);
    EXPECT_EQ(after.load(), 0);
    EXPECT_FALSE(e.done()) << "an event after a failed job must not report completion";
  }
}

TEST(Backend, BatchOfMuonUnitsEqualsOneByOne) {
  auto cpu = make_cpu_backend();
  NsOptions ns;
  auto orth = cpu->make_orthogonalizer(ns);
  const int64_t b = 3, m = 7, n = 12, len = normuon_state_size(m, n);
  std::vector<float> x = randn(static_cast<size_t>(b * m * n), 1), y = x, v(static_cast<size_t>(b * len), 0.5f), w = v;
  std::vector<float> scratch(static_cast<size_t>(len));
  cpu->muon_units(*orth, x.data(), b, m, n, v.data(), scratch.data(), 0.95, DType::BF16);
  for (int64_t e = 0; e < b; ++e)
    cpu->muon_units(*orth, y.data() + e * m * n, 1, m, n, w.data() + e * len, scratch.data(), 0.95, DType::BF16);
  EXPECT_EQ(x, y);
  EXPECT_EQ(v, w);
  EXPECT_NE(v, std::vector<float>(v.size(), 0.5f)) << "NorMuon state was not updated (vacuous comparison)";
}

TEST(Backend, GramNewtonSchulzWithReduceCallback) {
  auto cpu = make_cpu_backend();
  NsOptions ns;
  ns.method = NsMethod::Plain;
  for (auto [m, n] : {std::pair<int64_t, int64_t>{6, 40}, {40, 6}}) {
    std::vector<float> g = randn(static_cast<size_t>(m * n), 7), x = g, want = g;
    int calls = 0;
    cpu->gram_newton_schulz(ns, x.data(), m, n, m <= n, std::min(m, n),
                            [&](float*, size_t count, int step, DeviceEvent ready) {
                              EXPECT_TRUE(ready.empty()) << "the cpu's Gram matrix is in memory";
                              EXPECT_EQ(count, static_cast<size_t>(std::min(m, n) * std::min(m, n)));
                              EXPECT_EQ(step, calls++);
                            },
                            DType::F32);
    EXPECT_EQ(calls, ns.steps) << "one reduce per step";
    Orthogonalizer(ns).run(want.data(), want.data(), m, n);
    double err = 0, norm = 0;
    for (size_t i = 0; i < x.size(); ++i) err = std::max(err, std::abs(double(x[i]) - want[i])), norm = std::max(norm, std::abs(double(want[i])));
    EXPECT_LT(err, 1e-3 * norm) << m << "x" << n;
  }
}

}  // namespace
}  // namespace meshmuon::detail
