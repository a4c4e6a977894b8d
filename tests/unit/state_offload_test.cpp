// State offload on the cpu backend: Backend::copy (on the calling thread and submitted to a
// stream); StateOffload directly (prefetch / acquire / release / flush move exactly the home bytes,
// the resident copy is a different memory, misuse is a clear error naming the parameter, the slot
// pool is reused and bounded by the groups resident at once); LocalOptimizer with offload_state
// BITWISE equal to without, over several steps (Muon EMA with and without Nesterov, heavy ball,
// NorMuon, an expert stack, AdamW, fp32 and bf16 communication, 1 and 2 threads), its counters
// (zero without offload) and checkpoint-style state writes between steps.
// Run: build/bin/state_offload_test
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "meshmuon/error.h"
#include "meshmuon/local_optimizer.h"
#include "meshmuon/optimizer.h"
#include "state/state_offload.h"

namespace meshmuon::detail {
namespace {

TEST(BackendCopy, CpuCopiesOnTheCallingThreadAndOnAStream) {
  auto be = make_cpu_backend();
  Buffer a = be->allocate(1000, MemoryKind::PinnedHost), b = be->allocate(1000, MemoryKind::Host);
  for (int i = 0; i < 1000; ++i) a.as<unsigned char>()[i] = static_cast<unsigned char>(i * 7);
  be->copy(b.data(), a.data(), 1000);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 1000), 0);
  be->copy(nullptr, nullptr, 0);  // nothing to copy: no access
  auto s = be->make_stream(true);
  std::memset(b.data(), 0, 1000);
  s->submit([&] { be->copy(b.data(), a.data(), 600); });
  Event e = s->record();
  s->synchronize();
  EXPECT_TRUE(e.done());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 600), 0);
  EXPECT_EQ(b.as<unsigned char>()[600], 0);
}

// Parameters of given float counts (one or two tensors each), home copies filled with k + 1000 p.
struct Homes {
  std::shared_ptr<Backend> be = make_cpu_backend();
  std::vector<std::vector<Buffer>> bufs;
  std::vector<std::vector<StateOffload::Region>> regions;
  std::vector<std::string> names;
  explicit Homes(const std::vector<std::vector<size_t>>& floats) {
    for (size_t p = 0; p < floats.size(); ++p) {
      auto& b = bufs.emplace_back();
      auto& r = regions.emplace_back();
      for (size_t n : floats[p]) {
        b.push_back(be->allocate(n * 4, MemoryKind::PinnedHost));
        for (size_t k = 0; k < n; ++k) b.back().as<float>()[k] = static_cast<float>(k + 1000 * p);
        r.push_back({b.back().data(), n * 4});
      }
      names.push_back("p" + std::to_string(p));
    }
  }
  float home(size_t p, size_t t, size_t k) const { return bufs[p][t].as<float>()[k]; }
};

TEST(StateOffloadUnit, MovesHomeBytesThroughASlotAndBack) {
  Homes h({{100, 7}, {50}, {0}, {300}});
  StateOffload off(*h.be, h.regions, h.names);
  off.begin_step();
  const std::vector<size_t> g0 = {0, 1, 2}, g1 = {3};
  off.acquire(g0);
  off.prefetch(g1);  // copy-in issued while g0 is in use
  float* r00 = static_cast<float*>(off.resident(0, 0));
  float* r01 = static_cast<float*>(off.resident(0, 1));
  ASSERT_NE(r00, h.bufs[0][0].as<float>()) << "the resident copy must be another memory than home";
  EXPECT_EQ(off.resident(2, 0), nullptr) << "an empty tensor has no resident copy";
  for (size_t k = 0; k < 100; ++k) ASSERT_EQ(r00[k], h.home(0, 0, k));
  for (size_t k = 0; k < 7; ++k) ASSERT_EQ(r01[k], h.home(0, 1, k));
  r00[5] = -1.0f, r01[6] = -2.0f;
  EXPECT_EQ(h.home(0, 0, 5), 5.0f) << "home changes only at release";
  off.release(g0);
  off.acquire(g1);
  static_cast<float*>(off.resident(3, 0))[299] = -3.0f;
  off.release(g1);
  off.flush();
  EXPECT_EQ(h.home(0, 0, 5), -1.0f);
  EXPECT_EQ(h.home(0, 1, 6), -2.0f);
  EXPECT_EQ(h.home(3, 0, 299), -3.0f);
  EXPECT_EQ(h.home(1, 0, 49), 1049.0f);
  const uint64_t bytes = (100 + 7 + 50 + 300) * 4;
  EXPECT_EQ(off.counters().bytes_in, bytes);
  EXPECT_EQ(off.counters().bytes_out, bytes);
  EXPECT_GT(off.counters().peak_resident_bytes, 0u);
}

TEST(StateOffloadUnit, MisuseNamesTheParameter) {
  Homes h({{10}, {10}, {10}});
  StateOffload off(*h.be, h.regions, h.names);
  const std::vector<size_t> g = {0, 1}, other = {0}, g2 = {2};
  const auto throws_naming = [](auto f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "no error for " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'p"), std::string::npos) << e.what();
    }
  };
  throws_naming([&] { off.resident(0, 0); }, "resident() outside acquire");
  throws_naming([&] { off.release(g); }, "release without acquire");
  off.prefetch(g);
  throws_naming([&] { off.resident(1, 0); }, "resident() of a prefetched, not acquired parameter");
  off.acquire(g);
  throws_naming([&] { off.acquire(g); }, "acquire twice");
  throws_naming([&] { off.release(other); }, "release of another list");
  off.release(g);
  off.acquire(g2);  // a step that throws leaves g2 acquired: flush writes it back
  static_cast<float*>(off.resident(2, 0))[3] = 42.0f;
  off.flush();
  EXPECT_EQ(h.home(2, 0, 3), 42.0f);
  throws_naming([&] { off.resident(2, 0); }, "resident() after flush");
}

// Groups of sizes 1..4 (×256 B) made resident two at a time, many rounds: the pool stays within
// 2 × the largest group, and steady rounds reuse slots (no growth step to step).
TEST(StateOffloadUnit, SlotPoolReusedAndBounded) {
  std::vector<std::vector<size_t>> floats;
  for (int p = 0; p < 8; ++p) floats.push_back({static_cast<size_t>(64 * (1 + p % 4))});
  Homes h(floats);
  StateOffload off(*h.be, h.regions, h.names);
  uint64_t first_pool = 0;
  for (int round = 0; round < 4; ++round) {
    off.begin_step();
    std::vector<size_t> prev;
    for (size_t p = 0; p < 8; ++p) {
      const std::vector<size_t> cur = {p};
      off.acquire(cur);
      if (p + 1 < 8) off.prefetch(std::vector<size_t>{p + 1});
      static_cast<float*>(off.resident(p, 0))[0] += 1.0f;
      off.release(cur);
    }
    off.flush();
    EXPECT_LE(off.counters().peak_resident_bytes, 2u * 4 * 256) << "round " << round;
    if (round == 0) first_pool = off.counters().resident_bytes;
    else EXPECT_EQ(off.counters().resident_bytes, first_pool) << "the pool grew in round " << round;
  }
  for (size_t p = 0; p < 8; ++p) EXPECT_EQ(h.home(p, 0, 0), static_cast<float>(1000 * p + 4));
}

}  // namespace
}  // namespace meshmuon::detail

namespace meshmuon {
namespace {

std::vector<ParamInfo> model() {
  return {{"w_tall", {24, 8}}, {"w_wide", {6, 20}}, {"w_small", {3, 5}}, {"experts", {3, 6, 9}, true},
          {"bias", {11}}, {"norm", {4, 5}}};
}

std::vector<ParamGroup> groups() {
  ParamGroup ema, plain, nor, adam;
  ema.options.lr = 0.02;  // EMA with Nesterov (default)
  plain.options.lr = 0.03, plain.options.nesterov = false;
  nor.options.lr = 0.01, nor.options.normuon = true, nor.options.momentum_kind = MomentumKind::HeavyBall;
  adam.options.algorithm = Algorithm::AdamW, adam.options.lr = 0.005;
  ema.params = {0};
  plain.params = {2};
  nor.params = {1, 3};
  adam.params = {4, 5};
  return {ema, plain, nor, adam};
}

float value(size_t p, size_t j, int t) {
  uint32_t x = static_cast<uint32_t>(p * 7919 + j * 104729 + static_cast<size_t>(t) * 1299709) * 2654435761u;
  x ^= x >> 15;
  return static_cast<float>(static_cast<int32_t>(x % 20001) - 10000) / 5000.0f;
}

struct LocalRun {
  std::vector<std::vector<uint32_t>> bits;  // parameters, then every state tensor
  std::vector<StepStats> stats;
  uint64_t state_bytes = 0;
};

LocalRun run_local(bool offload, int threads, DType comm, int steps) {
  const std::vector<ParamInfo> infos = model();
  LocalOptimizerOptions o;
  o.threads = threads, o.comm_dtype = comm, o.offload_state = offload;
  LocalOptimizer opt(infos, groups(), o);
  std::vector<std::vector<float>> w(infos.size()), g(infos.size());
  std::vector<TensorView> lw, lg;
  for (size_t i = 0; i < infos.size(); ++i) {
    const size_t n = static_cast<size_t>(infos[i].shape.numel());
    w[i].resize(n), g[i].resize(n);
    for (size_t j = 0; j < n; ++j) w[i][j] = value(i, j, 99);
    lw.emplace_back(w[i].data(), infos[i].shape), lg.emplace_back(g[i].data(), infos[i].shape);
  }
  LocalRun out;
  for (int t = 0; t < steps; ++t) {
    for (size_t i = 0; i < infos.size(); ++i)
      for (size_t j = 0; j < g[i].size(); ++j) g[i][j] = value(i, j, t);
    if (t == 2) {  // between steps, as a checkpoint load does: the state views are written
      TensorView m = opt.state(0, "momentum_buffer");
      for (int64_t j = 0; j < m.numel(); ++j) m.f32()[j] *= 0.5f;
    }
    EXPECT_TRUE(opt.step(lw, lg));
    out.stats.push_back(opt.last_stats());
  }
  for (size_t i = 0; i < infos.size(); ++i) {
    out.bits.emplace_back(w[i].size());
    std::memcpy(out.bits.back().data(), w[i].data(), w[i].size() * 4);
    for (const std::string& k : opt.state_keys(i)) {
      const TensorView v = opt.state(i, k);
      out.bits.emplace_back(static_cast<size_t>(v.numel()));
      std::memcpy(out.bits.back().data(), v.f32(), static_cast<size_t>(v.numel()) * 4);
      out.state_bytes += static_cast<uint64_t>(v.numel()) * 4;
    }
  }
  return out;
}

TEST(LocalOptimizerOffload, BitwiseEqualToNoOffload) {
  for (DType comm : {DType::F32, DType::BF16})
    for (int threads : {1, 2}) {
      const LocalRun off = run_local(false, threads, comm, 4), on = run_local(true, threads, comm, 4);
      EXPECT_TRUE(off.bits == on.bits) << "comm " << to_string(comm) << " threads " << threads;
      for (size_t t = 0; t < on.stats.size(); ++t) {
        EXPECT_EQ(off.stats[t].offload_bytes_in + off.stats[t].offload_bytes_out + off.stats[t].peak_state_resident_bytes, 0u);
        EXPECT_EQ(on.stats[t].offload_bytes_in, on.state_bytes) << "step " << t;
        EXPECT_EQ(on.stats[t].offload_bytes_out, on.state_bytes) << "step " << t;
        EXPECT_GT(on.stats[t].peak_state_resident_bytes, 0u);
        // window 1: two groups at once (one chunk + the AdamW batch prefetch never overlap it),
        // each at most all the state, tensors rounded to 256 bytes (12 tensors here)
        EXPECT_LE(on.stats[t].peak_state_resident_bytes, 2 * (on.state_bytes + 12 * 256)) << "step " << t;
      }
    }
}

// A release hook that throws on its first call fails the step midway, after the Muon chunk updated
// its state (state partly updated, as the hooks document): with offload the acquired state is
// written back when the step throws, so offload and no offload stay bitwise equal, and the next
// steps run (nothing is left resident).
TEST(LocalOptimizerOffload, AStepThatThrowsLeavesNothingResident) {
  std::vector<std::vector<uint32_t>> result[2];
  for (bool offload : {false, true}) {
    const std::vector<ParamInfo> infos = model();
    int calls = 0;
    bool armed = true;
    LocalOptimizerOptions o;
    o.offload_state = offload;
    o.state_hooks.release = [&](std::span<const size_t>) {
      if (armed && ++calls == 1) throw std::runtime_error("hook failed");
    };
    LocalOptimizer opt(infos, groups(), o);
    std::vector<std::vector<float>> w(infos.size()), g(infos.size());
    std::vector<TensorView> lw, lg;
    for (size_t i = 0; i < infos.size(); ++i) {
      const size_t n = static_cast<size_t>(infos[i].shape.numel());
      w[i].resize(n), g[i].resize(n);
      for (size_t j = 0; j < n; ++j) w[i][j] = value(i, j, 98), g[i][j] = value(i, j, 5);
      lw.emplace_back(w[i].data(), infos[i].shape), lg.emplace_back(g[i].data(), infos[i].shape);
    }
    EXPECT_THROW(opt.step(lw, lg), std::runtime_error);  // the Muon chunk ran, its release failed
    armed = false;
    ASSERT_TRUE(opt.step(lw, lg)) << "offload " << offload;
    ASSERT_TRUE(opt.step(lw, lg)) << "offload " << offload;
    auto& r = result[offload ? 1 : 0];
    for (size_t i = 0; i < infos.size(); ++i) {
      r.emplace_back(w[i].size());
      std::memcpy(r.back().data(), w[i].data(), w[i].size() * 4);
      for (const std::string& k : opt.state_keys(i)) {
        const TensorView v = opt.state(i, k);
        r.emplace_back(static_cast<size_t>(v.numel()));
        std::memcpy(r.back().data(), v.f32(), static_cast<size_t>(v.numel()) * 4);
      }
    }
  }
  EXPECT_TRUE(result[0] == result[1]);
}

}  // namespace
}  // namespace meshmuon
