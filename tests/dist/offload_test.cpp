// State offload (OptimizerOptions::offload_state) on the distributed engine: parameters and every
// state tensor BITWISE equal to the same run without offload over several steps (Muon with EMA
// Nesterov and without Nesterov, NorMuon heavy ball, an expert stack, QK-clip, AdamW; a parameter
// without gradient for one step), for several meshes and windows; the bytes moved equal the state
// of the parameters stepped; the device memory holding state stays under (window + 1) × the largest
// chunk's state and under the total once there are enough chunks (0 without offload); the state
// hooks still see each parameter once; and a checkpoint saved from an offloading optimizer and
// loaded into a fresh one continues bitwise like the uninterrupted run.
//   mpirun -n 3 --oversubscribe build/bin/optimizer_test --gtest_filter='StateOffload*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

#include "meshmuon/checkpoint.h"
#include "meshmuon/update.h"
#include "optimizer_fixture.h"

namespace meshmuon {
namespace {

constexpr uint64_t kAlign = 256;  // state_offload.cpp lays each tensor on a 256-byte boundary
uint64_t aligned(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Groups of the fixture, with the QK group's Muon momentum without Nesterov (the plain group keeps
// EMA with Nesterov; NorMuon's is heavy ball).
std::vector<ParamGroup> offload_groups(size_t n) {
  std::vector<ParamGroup> g = test_groups(n);
  g[2].options.nesterov = false;
  return g;
}

// Parameters and every state tensor of this rank, in order, as raw bytes.
std::vector<std::vector<uint32_t>> snapshot(Optimizer& opt, const LocalShards& x) {
  std::vector<std::vector<uint32_t>> out;
  const auto add = [&](const float* p, int64_t n) {
    out.emplace_back(static_cast<size_t>(n));
    if (n) std::memcpy(out.back().data(), p, static_cast<size_t>(n) * 4);
  };
  for (size_t i = 0; i < x.w.size(); ++i) {
    add(x.w[i].data(), static_cast<int64_t>(x.w[i].size()));
    for (const std::string& k : opt.state_keys(i)) {
      const TensorView v = opt.state(i, k);
      add(v.numel() ? v.f32() : nullptr, v.numel());
    }
  }
  return out;
}

void fill(LocalShards& x, int t) {
  for (size_t i = 0; i < x.g.size(); ++i)
    for (size_t j = 0; j < x.g[i].size(); ++j)
      x.g[i][j] = value(static_cast<int>(i), static_cast<int64_t>(j) + 1000 * comm().rank(), t, false);
}

// State bytes of parameter i on this rank: exact, and as laid out in a slot.
uint64_t state_bytes(Optimizer& opt, size_t i, bool slot) {
  uint64_t b = 0;
  for (const std::string& k : opt.state_keys(i)) {
    const uint64_t t = static_cast<uint64_t>(opt.state(i, k).numel()) * 4;
    b += slot ? aligned(t) : t;
  }
  return b;
}

// (window + 1) × the largest group of state made resident at once: a chunk of the plan (its
// parameters' state on this rank) or the AdamW pass (all its parameters: an upper bound of a batch).
uint64_t window_bound(Optimizer& opt, int window) {
  std::map<int, uint64_t> chunk;
  for (const PlanEntry& e : opt.plan().entries()) chunk[e.chunk] += state_bytes(opt, static_cast<size_t>(e.param), true);
  uint64_t largest = 0, adamw = 0;
  for (const auto& [c, b] : chunk) largest = std::max(largest, b);
  for (size_t i = 0; i < opt.inventory().params.size(); ++i)
    if (opt.inventory().params[i].role == Role::AdamW) adamw += state_bytes(opt, i, true);
  return static_cast<uint64_t>(window + 1) * std::max(largest, adamw);
}

struct OffloadRun {
  std::vector<std::vector<std::vector<uint32_t>>> after;  // per step
  std::vector<StepStats> stats;
  std::map<size_t, int> acquired, released;
  bool misuse = false;
  uint64_t bound = 0, total_state = 0, total_slot_state = 0;
  std::vector<uint64_t> stepped_bytes;  // per step: state bytes of the parameters whose state it touched
};

constexpr size_t kNoGradParam = 0;  // "w57" (plain group: no NorMuon state), no gradient at step 1

OffloadRun run_steps(const std::string& parallel, int window, bool offload, int steps, int64_t chunk_bytes = 2048) {
  Inventory inv = make_inventory(parallel);
  const size_t n = inv.params.size();
  OptimizerOptions o = options_for({"", "auto", DType::F32});
  o.window = window;
  o.chunk_bytes = chunk_bytes;
  o.offload_state = offload;
  OffloadRun out;
  o.state_hooks = {[&out](std::span<const size_t> ps) {
                     for (size_t p : ps) out.misuse |= out.acquired[p]++ != out.released[p];
                   },
                   [&out](std::span<const size_t> ps) {
                     for (size_t p : ps) out.misuse |= ++out.released[p] != out.acquired[p];
                   }};
  Optimizer opt(shared_comm(), inv, offload_groups(n), o);
  LocalShards x(opt, n);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < x.w[i].size(); ++j) x.w[i][j] = value(static_cast<int>(i), static_cast<int64_t>(j) + 1000 * comm().rank(), 9, false);
  for (int t = 0; t < steps; ++t) {
    fill(x, t);
    std::vector<TensorView> lg = x.lg;
    if (t == 1) lg[kNoGradParam] = TensorView();
    EXPECT_TRUE(opt.step(x.lw, lg, {{0, {50.0f, 3.0f}}}));
    out.after.push_back(snapshot(opt, x));
    out.stats.push_back(opt.last_stats());
    uint64_t stepped = 0;
    for (size_t i = 0; i < n; ++i)
      if (!(t == 1 && i == kNoGradParam)) stepped += state_bytes(opt, i, false);
    out.stepped_bytes.push_back(stepped);
  }
  out.bound = window_bound(opt, window);
  for (size_t i = 0; i < n; ++i) out.total_state += state_bytes(opt, i, false), out.total_slot_state += state_bytes(opt, i, true);
  return out;
}

TEST(StateOffload, BitwiseEqualToNoOffloadOverSteps) {
  for (const std::string& parallel : shard_parallels())
    for (int window : {1, 2, 3}) {
      const OffloadRun off = run_steps(parallel, window, false, 4), on = run_steps(parallel, window, true, 4);
      ASSERT_EQ(off.after.size(), on.after.size());
      for (size_t t = 0; t < off.after.size(); ++t)
        EXPECT_TRUE(off.after[t] == on.after[t]) << parallel << " window " << window << ": step " << t
                                                 << " parameters or state differ with offload";
      EXPECT_FALSE(on.misuse) << parallel << ": a hook saw a parameter acquired twice or released without acquire";
      EXPECT_EQ(on.acquired, off.acquired) << parallel << ": offload changed what the state hooks see";
      EXPECT_EQ(on.released, off.released) << parallel;
    }
}

TEST(StateOffload, BytesAndResidentBoundInStats) {
  for (const std::string& parallel : shard_parallels())
    for (int window : {1, 2}) {
      const OffloadRun off = run_steps(parallel, window, false, 3), on = run_steps(parallel, window, true, 3);
      for (size_t t = 0; t < on.stats.size(); ++t) {
        const StepStats& a = off.stats[t];
        const StepStats& b = on.stats[t];
        EXPECT_EQ(a.offload_bytes_in + a.offload_bytes_out + a.peak_state_resident_bytes, 0u) << "no offload, no counters";
        EXPECT_EQ(b.offload_bytes_in, on.stepped_bytes[t]) << parallel << " step " << t;
        EXPECT_EQ(b.offload_bytes_out, on.stepped_bytes[t]) << parallel << " step " << t;
        EXPECT_LE(b.peak_state_resident_bytes, on.bound) << parallel << " window " << window << " step " << t;
        if (on.total_state > 0) EXPECT_GT(b.peak_state_resident_bytes, 0u) << parallel << " step " << t;
      }
    }
}

// Many small matrices, one per chunk: the device never holds all of the state.
TEST(StateOffload, ResidentStateStaysBelowTheTotal) {
  ModelDesc m{"offload-many", {}};
  for (int k = 0; k < 12; ++k) {
    ParamSpec p;
    p.name = "m" + std::to_string(k), p.shape = {16, 24}, p.role = Role::Muon, p.tp = TpStyle::None;
    m.params.push_back(p);
  }
  const Inventory inv = apply_parallel(m, parse_parallel("dp_shard=" + std::to_string(comm().size())));
  ParamGroup g;
  g.options.normuon = true;
  for (size_t i = 0; i < inv.params.size(); ++i) g.params.push_back(i);
  for (int window : {1, 2}) {
    OptimizerOptions o = options_for({"", "auto", DType::F32});
    o.window = window, o.chunk_bytes = 1, o.offload_state = true;  // one matrix per chunk
    Optimizer opt(shared_comm(), inv, {g}, o);
    ASSERT_GE(opt.plan().chunks().size(), static_cast<size_t>(window + 3));
    LocalShards x(opt, inv.params.size());
    uint64_t total = 0, slot_total = 0;
    for (size_t i = 0; i < inv.params.size(); ++i) total += state_bytes(opt, i, false), slot_total += state_bytes(opt, i, true);
    for (int t = 0; t < 3; ++t) {
      fill(x, t);
      ASSERT_TRUE(opt.step(x.lw, x.lg));
      const StepStats& st = opt.last_stats();
      EXPECT_EQ(st.offload_bytes_in, total);
      EXPECT_LE(st.peak_state_resident_bytes, window_bound(opt, window)) << "window " << window;
      if (total > 0) {
        EXPECT_GT(st.peak_state_resident_bytes, 0u);
        EXPECT_LT(st.peak_state_resident_bytes, slot_total) << "window " << window << ": all the state was resident";
      }
    }
  }
}

// A checkpoint of an offloading optimizer after 2 steps, loaded into a fresh offloading optimizer
// (parameters too), continues bitwise like 4 uninterrupted steps without offload.
TEST(StateOffload, CheckpointSaveLoadContinuesBitwise) {
  const std::string parallel = "dp_shard=" + std::to_string(comm().size());
  const Inventory inv = make_inventory(parallel);
  const size_t n = inv.params.size();
  uint64_t pid = static_cast<uint64_t>(::getpid()), pid0 = 0;
  std::vector<uint64_t> pids(static_cast<size_t>(comm().size()));
  comm().all_gather(InBuffer(&pid, CommType::U64, 1), OutBuffer(pids.data(), CommType::U64, pids.size()), "pid").wait();
  pid0 = pids[0];
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("meshmuon-offload-ckpt-" + std::to_string(pid0) + "-" + std::to_string(comm().size()));
  const auto make = [&](bool offload) {
    OptimizerOptions o = options_for({"", "auto", DType::F32});
    o.offload_state = offload;
    return std::make_unique<Optimizer>(shared_comm(), inv, offload_groups(n), o);
  };
  const auto tensors = [&](Optimizer& opt, LocalShards& x) {
    std::vector<CheckpointTensor> out;
    for (size_t i = 0; i < n; ++i) {
      const ParamSpec& p = inv.params[i];
      const Mesh& mesh = inv.meshes[static_cast<size_t>(p.mesh)];
      out.push_back({"param/" + p.name, p.shape, DType::F32, mesh, p.placements, x.lw[i]});
      for (const std::string& key : opt.state_keys(i)) {
        const Shape shape = key == "normuon_v" ? normuon_state_shape(p.shape, p.expert) : p.shape;
        out.push_back({"optim/" + p.name + "/" + key, shape, DType::F32, mesh, p.placements, opt.state(i, key)});
      }
    }
    return out;
  };
  const auto init = [&](LocalShards& x) {
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < x.w[i].size(); ++j) x.w[i][j] = value(static_cast<int>(i), static_cast<int64_t>(j) + 1000 * comm().rank(), 9, false);
  };
  // reference: 4 steps without offload
  auto ref = make(false);
  LocalShards xr(*ref, n);
  init(xr);
  for (int t = 0; t < 4; ++t) {
    fill(xr, t);
    ASSERT_TRUE(ref->step(xr.lw, xr.lg, {{0, {50.0f, 3.0f}}}));
  }
  // 2 steps with offload, saved
  {
    auto a = make(true);
    LocalShards xa(*a, n);
    init(xa);
    for (int t = 0; t < 2; ++t) {
    fill(xa, t);
    ASSERT_TRUE(a->step(xa.lw, xa.lg, {{0, {50.0f, 3.0f}}}));
  }
    std::map<std::string, int64_t> counts;
    for (size_t i = 0; i < n; ++i) counts[inv.params[i].name] = a->step_count(i);
    save_checkpoint(comm(), dir.string(), tensors(*a, xa), 2, counts);
  }
  // a fresh offloading optimizer, loaded, 2 more steps
  auto b = make(true);
  LocalShards xb(*b, n, 0.0f, 0.0f);
  const CheckpointInfo info = load_checkpoint(comm(), dir.string(), tensors(*b, xb));
  for (size_t i = 0; i < n; ++i) b->set_step_count(i, info.step_counts.at(inv.params[i].name));
  for (int t = 2; t < 4; ++t) {
    fill(xb, t);
    ASSERT_TRUE(b->step(xb.lw, xb.lg, {{0, {50.0f, 3.0f}}}));
  }
  EXPECT_TRUE(snapshot(*b, xb) == snapshot(*ref, xr)) << "resumed offloading run differs from the uninterrupted one";
  comm().barrier("offload checkpoint cleanup").wait();
  if (comm().rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace meshmuon
