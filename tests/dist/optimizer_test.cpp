// meshmuon::Optimizer against the single-process LocalOptimizer: for every strategy × mesh (FSDP, HSDP,
// FSDP×TP with StridedShard, EP with experts whole and split) × comm dtype, parameters and state after
// 3 steps must be BITWISE equal on each rank's local box; measured bytes must equal the plan's
// prediction; fingerprint mismatches and non-finite gradients must be decided alike on every rank.
//   ctest --test-dir build-exec -L dist -R optimizer      mpirun -n 3 --oversubscribe build-exec/bin/optimizer_test
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <limits>
#include <string>
#include <vector>

#include "optimizer_fixture.h"
#include "backend/cpu/kernels/bf16_matmul.h"
#include "meshmuon/bf16.h"
#include "meshmuon/error.h"
#include "meshmuon/local_optimizer.h"
#include "meshmuon/optimizer.h"

namespace meshmuon {
namespace {

// Number of elements whose bits differ.
int64_t bit_diffs(const float* a, const float* b, int64_t n) {
  int64_t d = 0;
  for (int64_t i = 0; i < n; ++i) d += std::memcmp(a + i, b + i, 4) != 0;
  return d;
}

// Runs 3 steps distributed and in one process; returns bit differences on this rank (params + state).
struct Outcome {
  int64_t diffs = 0;
  double max_rel = 0;
  bool bytes_ok = true;
  std::string detail;
  std::vector<Strategy> used;
};

Outcome run_and_compare(const RunConfig& c, bool negative_control = false) {
  Inventory inv = make_inventory(c.parallel);
  if (c.split) split_test_params(inv);
  const size_t n = inv.params.size();
  const bool bf16 = c.comm_dtype == DType::BF16;
  // gram_allreduce has no NorMuon, and forms its products in fp32 whatever matmul_dtype says.
  const bool normuon = c.strategy != "gram_allreduce", bf16_products = normuon;
  Optimizer opt(shared_comm(), inv, test_groups(n, normuon, bf16_products, c.nanochat), options_for(c));
  const std::vector<ParamInfo> infos = infos_of(inv);
  LocalOptimizer ref(infos, test_groups(n, normuon, bf16_products, c.nanochat),
                     LocalOptimizerOptions{NonFinitePolicy::Raise, c.comm_dtype});
  const int r = comm().rank();
  std::vector<std::vector<float>> full_w(n), full_g(n), loc_w(n), loc_g(n);
  std::vector<std::vector<BFloat16>> loc_gb(n), full_gb(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = inv.params[i].shape.numel();
    full_w[i].resize(static_cast<size_t>(numel));
    for (int64_t j = 0; j < numel; ++j) full_w[i][static_cast<size_t>(j)] = value(static_cast<int>(i), j, 99, false);
    loc_w[i] = extract(full_w[i], inv.params[i].shape, opt.local_box(i));
  }
  std::map<int, std::vector<float>> logits{{0, {50.0f, 3.0f}}};
  Outcome out;
  for (int t = 0; t < 3; ++t) {
    std::vector<TensorView> fw, fg, lw, lg;
    for (size_t i = 0; i < n; ++i) {
      const Shape& gs = inv.params[i].shape;
      const int64_t numel = gs.numel();
      full_g[i].resize(static_cast<size_t>(numel));
      for (int64_t j = 0; j < numel; ++j) full_g[i][static_cast<size_t>(j)] = value(static_cast<int>(i), j, t, bf16);
      loc_g[i] = extract(full_g[i], gs, opt.local_box(i));
      fw.emplace_back(full_w[i].data(), gs);
      lw.emplace_back(loc_w[i].data(), opt.local_shape(i));
      if (bf16) {  // bf16 gradients with bf16 communication
        full_gb[i].resize(full_g[i].size()), loc_gb[i].resize(loc_g[i].size());
        float_to_bf16(full_g[i].data(), full_gb[i].data(), full_g[i].size());
        float_to_bf16(loc_g[i].data(), loc_gb[i].data(), loc_g[i].size());
        fg.emplace_back(full_gb[i].data(), gs);
        lg.emplace_back(loc_gb[i].data(), opt.local_shape(i));
      } else {
        fg.emplace_back(full_g[i].data(), gs);
        lg.emplace_back(loc_g[i].data(), opt.local_shape(i));
      }
    }
    if (t == 1)
      for (size_t i : c.no_grad) fg[i] = TensorView(), lg[i] = TensorView();
    EXPECT_TRUE(ref.step(fw, fg, logits));
    EXPECT_TRUE(opt.step(lw, lg, logits));
    const StepStats& st = opt.last_stats();
    if (st.bytes_sent != st.bytes_sent_predicted || st.bytes_recv != st.bytes_recv_predicted) {
      out.bytes_ok = false;
      out.detail += "bytes sent " + std::to_string(st.bytes_sent) + " (state " + std::to_string(st.bytes_sent_state) +
                    ") predicted " + std::to_string(st.bytes_sent_predicted) + ", recv " + std::to_string(st.bytes_recv) +
                    " (state " + std::to_string(st.bytes_recv_state) + ") predicted " +
                    std::to_string(st.bytes_recv_predicted) + "; ";
    }
  }
  if (negative_control) {  // one ulp on one element of the reference must be caught
    for (size_t i = 0; i < n; ++i)
      if (opt.local_shape(i).numel() > 0) {
        const Box b = opt.local_box(i);
        const int64_t first = [&] {
          int64_t off = 0;
          for (int d = 0; d < inv.params[i].shape.ndim(); ++d) off = off * inv.params[i].shape[d] + b.dims[static_cast<size_t>(d)].at(0);
          return off;
        }();
        float& x = full_w[i][static_cast<size_t>(first)];
        x = std::nextafter(x, std::numeric_limits<float>::infinity());
        break;
      }
  }
  for (size_t i = 0; i < n; ++i) {
    const ParamSpec& p = inv.params[i];
    const std::vector<float> want = extract(full_w[i], p.shape, opt.local_box(i));
    int64_t d = bit_diffs(want.data(), loc_w[i].data(), static_cast<int64_t>(want.size()));
    for (size_t k = 0; k < want.size(); ++k) {
      const double den = std::max(1e-3, std::abs(static_cast<double>(want[k])));
      out.max_rel = std::max(out.max_rel, std::abs(static_cast<double>(want[k]) - loc_w[i][k]) / den);
    }
    for (const std::string& key : ref.state_keys(i)) {
      TensorView rv = ref.state(i, key), lv = opt.state(i, key);
      std::vector<float> full(rv.f32(), rv.f32() + rv.numel());
      Box box = key == "normuon_v" ? local_box(rv.shape, p.placements, inv.meshes[static_cast<size_t>(p.mesh)], r)
                                   : opt.local_box(i);
      const std::vector<float> sw = extract(full, rv.shape, box);
      EXPECT_EQ(static_cast<int64_t>(sw.size()), lv.numel()) << p.name << " " << key;
      if (static_cast<int64_t>(sw.size()) == lv.numel()) d += bit_diffs(sw.data(), lv.f32(), lv.numel());
    }
    EXPECT_EQ(opt.step_count(i), ref.step_count(i));
    if (d > 0) out.detail += p.name + ": " + std::to_string(d) + " differing elements; ";
    out.diffs += d;
  }
  for (const PlanEntry& e : opt.plan().entries()) out.used.push_back(e.strategy);
  if (std::getenv("MESHMUON_TEST_VERBOSE") && r == 0) {
    std::string u;
    for (const PlanEntry& e : opt.plan().entries()) u += " " + std::string(to_string(e.strategy));
    for (const PlanEntry& e : opt.plan().entries()) u += e.replica_split ? "+split" : "";
    std::printf("%s %s %s chunks %zu:%s\n", c.parallel.c_str(), c.strategy.c_str(), std::string(to_string(c.comm_dtype)).c_str(),
                opt.plan().chunks().size(), u.c_str());
  }
  return out;
}

// Meshes for this world size (skipped where the size does not allow them).
std::vector<std::string> parallels() {
  const int w = comm().size();
  std::vector<std::string> out = {"dp_shard=" + std::to_string(w)};                       // FSDP
  if (w % 2 == 0) out.push_back("dp_replicate=2,dp_shard=" + std::to_string(w / 2));     // HSDP
  if (w % 2 == 0) out.push_back("dp_shard=" + std::to_string(w / 2) + ",tp=2");          // FSDP × TP (StridedShard)
  if (w == 3) out.push_back("tp=3");
  if (w > 1) out.push_back("dp_shard=" + std::to_string(w) + ",ep=" + std::to_string(w));  // experts whole
  if (w > 1) out.push_back("dp_replicate=" + std::to_string(w));                          // replicated only (DDP)
  if (w == 4) out.push_back("dp_shard=4,ep=2");                                           // experts split (efsdp·ep > E)
  return out;
}

const char* kStrategies[] = {"auto", "local", "owner_a2a", "allgather", "agrs", "expert_local", "expert_subgroup"};

// Parameter: comm dtype fp32 / bf16, each without and with nanochat's options on two groups (MuonEq,
// Muon+, adjusted-lr decay: test_groups).
class OptimizerBitwise : public ::testing::TestWithParam<int> {};

TEST_P(OptimizerBitwise, MatchesLocalOptimizerAndPlanBytes) {
  const DType dt = GetParam() % 2 == 0 ? DType::F32 : DType::BF16;
  const bool nanochat = GetParam() >= 2;
  int runs = 0;
  for (const std::string& par : parallels()) {
    try {
      make_inventory(par);
    } catch (const std::invalid_argument& e) {
      continue;  // a recipe this world size cannot place
    }
    for (const char* s : kStrategies) {
      SCOPED_TRACE(par + " strategy " + s + " comm " + std::string(to_string(dt)) + (nanochat ? " nanochat" : ""));
      RunConfig c{par, s, dt};
      c.nanochat = nanochat;
      const Outcome o = run_and_compare(c);
      EXPECT_EQ(o.diffs, 0) << o.detail;
      EXPECT_TRUE(o.bytes_ok) << o.detail;
      ++runs;
    }
    if (par.find("dp_replicate") != std::string::npos) {  // HSDP: owners spread over replicas
      SCOPED_TRACE(par + " owner_a2a replica split");
      RunConfig c{par, "owner_a2a", dt, ReplicaMode::Split};
      c.nanochat = nanochat;
      const Outcome o = run_and_compare(c);
      EXPECT_EQ(o.diffs, 0) << o.detail;
      EXPECT_TRUE(o.bytes_ok) << o.detail;
    }
  }
  EXPECT_GT(runs, 0);
}
INSTANTIATE_TEST_SUITE_P(CommDtype, OptimizerBitwise, ::testing::Values(0, 1, 2, 3));

// Split orthogonalization (issue 37): row blocks that straddle the shards of every mesh, under every
// strategy that can run them (gram_allreduce cannot: a block is orthogonalized whole), with NorMuon
// and QK-clip on split weights, bitwise as LocalOptimizer; and the split changes the result.
TEST(OptimizerBitwise, SplitBlocksMatchLocalOptimizer) {
  int runs = 0;
  for (const std::string& par : parallels()) {
    try {
      make_inventory(par);
    } catch (const std::invalid_argument& e) {
      continue;
    }
    for (const char* s : {"auto", "owner_a2a", "allgather", "agrs"})
      for (const DType dt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(par + " split, strategy " + s + " comm " + std::string(to_string(dt)));
        RunConfig c{par, s, dt};
        c.split = true;
        const Outcome o = run_and_compare(c);
        EXPECT_EQ(o.diffs, 0) << o.detail;
        EXPECT_TRUE(o.bytes_ok) << o.detail;
        ++runs;
      }
  }
  EXPECT_GT(runs, 0);
  // negative control: the split blocks' result is not the whole matrices'
  Inventory inv = make_inventory("dp_shard=" + std::to_string(comm().size()));
  const size_t n = inv.params.size();
  LocalOptimizer whole(infos_of(inv), test_groups(n), LocalOptimizerOptions{});
  split_test_params(inv);
  LocalOptimizer split(infos_of(inv), test_groups(n), LocalOptimizerOptions{});
  std::vector<std::vector<float>> w1(n), w2(n), g(n);
  std::vector<TensorView> v1, v2, vg;
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = inv.params[i].shape.numel();
    for (int64_t j = 0; j < numel; ++j) {
      w1[i].push_back(value(static_cast<int>(i), j, 99, false));
      g[i].push_back(value(static_cast<int>(i), j, 0, false));
    }
    w2[i] = w1[i];
    v1.emplace_back(w1[i].data(), inv.params[i].shape), v2.emplace_back(w2[i].data(), inv.params[i].shape);
    vg.emplace_back(g[i].data(), inv.params[i].shape);
  }
  const std::map<int, std::vector<float>> logits{{0, {50.0f, 3.0f}}};
  ASSERT_TRUE(whole.step(v1, vg, logits));
  ASSERT_TRUE(split.step(v2, vg, logits));
  for (size_t i = 0; i < n; ++i) {
    const bool differs = bit_diffs(w1[i].data(), w2[i].data(), static_cast<int64_t>(w1[i].size())) > 0;
    EXPECT_EQ(differs, !inv.params[i].split.empty()) << inv.params[i].name;
  }
}

// Parameters whose gradient is absent on every rank sit the step out (values, state, step count),
// bitwise as LocalOptimizer does: a Muon matrix, a NorMuon one (owner_a2a moves its state), an
// expert stack and the AdamW bias, under every strategy.
TEST(OptimizerBitwise, AbsentGradientsEverywhereMatchLocalOptimizer) {
  const std::string par = "dp_shard=" + std::to_string(comm().size());
  for (const char* s : kStrategies) {
    SCOPED_TRACE(par + " strategy " + s);
    RunConfig c{par, s, DType::F32};
    c.no_grad = {0, 3, 6, 7};
    const Outcome o = run_and_compare(c);
    EXPECT_EQ(o.diffs, 0) << o.detail;
    EXPECT_TRUE(o.bytes_ok) << o.detail;
  }
}

TEST(OptimizerBitwise, NegativeControlCatchesOneUlp) {
  const Outcome o = run_and_compare({"dp_shard=" + std::to_string(comm().size()), "owner_a2a", DType::F32}, true);
  EXPECT_EQ(o.diffs, 1);
}

TEST(OptimizerBitwise, EveryStrategyIsExercised) {
  if (comm().size() < 2) GTEST_SKIP() << "strategies need ≥ 2 ranks";
  std::set<Strategy> seen;
  for (const std::string& par : parallels())
    for (const char* s : kStrategies) {
      try {
        Plan plan = make_plan(make_inventory(par), [&] {
          PlanOptions po;
          if (std::string(s) != "auto") po.pins = StrategyRules::parse(std::string("default:") + s);
          return po;
        }());
        for (const PlanEntry& e : plan.entries()) seen.insert(e.strategy);
      } catch (const std::invalid_argument&) {
      }
    }
  for (Strategy s : {Strategy::Local, Strategy::OwnerA2A, Strategy::AllGather, Strategy::Agrs, Strategy::ExpertLocal,
                     Strategy::ExpertSubgroup})
    EXPECT_TRUE(seen.count(s)) << to_string(s) << " is never used by the bitwise runs";
}

// gram_allreduce sums Gram matrices in MPI's order: within a tolerance of the reference.
TEST(OptimizerGram, WithinTolerance) {
  const Outcome o = run_and_compare({"dp_shard=" + std::to_string(comm().size()), "gram_allreduce", DType::F32});
  EXPECT_LT(o.max_rel, 1e-4) << o.detail;
  EXPECT_TRUE(o.bytes_ok) << o.detail;
}

// gram_allreduce orthogonalizes matrices that stay sharded: it refuses MuonEq and Muon+ at
// construction, on every rank alike, naming the parameter and the option (negative control: the
// same groups without them construct).
TEST(OptimizerGram, RefusesMuonEqOrMuonPlus) {
  if (comm().size() < 2) GTEST_SKIP() << "one rank: nothing is sharded, the plan has no gram_allreduce entry";
  const std::string par = "dp_shard=" + std::to_string(comm().size());
  const Inventory inv = make_inventory(par);
  const size_t n = inv.params.size();
  const OptimizerOptions o = options_for({par, "gram_allreduce", DType::F32});
  EXPECT_NO_THROW(Optimizer(shared_comm(), inv, test_groups(n, false, false, false), o));
  for (const char* which : {"muon_eq", "muon_plus"}) {
    std::vector<ParamGroup> groups = test_groups(n, false, false, true);
    if (std::string(which) == "muon_plus")
      for (ParamGroup& g : groups) g.options.ns.muon_eq = false;
    std::string msg;
    try {
      Optimizer opt(shared_comm(), inv, groups, o);
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(std::string("uses gram_allreduce, which does not support ") + which), std::string::npos) << msg;
    EXPECT_TRUE(same_everywhere(msg)) << msg;
  }
  // Turned on between steps (every option is read at every step): the step refuses, on every rank,
  // before anything changes; turned off again, it steps.
  Optimizer opt(shared_comm(), inv, test_groups(n, false, false, false), o);
  LocalShards x(opt, n);
  const std::vector<std::vector<float>> before = x.w;
  for (size_t g = 0; g + 1 < opt.groups().size(); ++g) opt.options(g).ns.muon_plus = true;  // the Muon groups
  std::string msg;
  try {
    opt.step(x.lw, x.lg, {{0, {50.0f, 3.0f}}});
  } catch (const std::invalid_argument& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("uses gram_allreduce, which does not support muon_plus"), std::string::npos) << msg;
  EXPECT_TRUE(same_everywhere(msg)) << msg;
  EXPECT_EQ(x.w, before);
  for (size_t g = 0; g + 1 < opt.groups().size(); ++g) opt.options(g).ns.muon_plus = false;
  EXPECT_TRUE(opt.step(x.lw, x.lg, {{0, {50.0f, 3.0f}}}));
  EXPECT_NE(x.w, before);
}

// ---- safety -----------------------------------------------------------------------------------

std::string construct_error(const Inventory& inv) {
  try {
    Optimizer opt(shared_comm(), inv, test_groups(inv.params.size()), options_for({"", "auto", DType::F32}));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(OptimizerSafety, ShapeMismatchSameErrorEverywhere) {
  if (comm().size() < 2) GTEST_SKIP();
  const std::string par = "dp_shard=" + std::to_string(comm().size());
  const std::string msg = construct_error(make_inventory(par, false, comm().rank() == 1 ? 6 : 5));
  EXPECT_NE(msg.find("the first that differs is #0: 'w57' [5, 7]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("; 'w57' [6, 7] (S(0)) on mesh 0 muon group 0 on rank 1"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("different parameter counts"), std::string::npos) << msg;
  EXPECT_TRUE(same_everywhere(msg)) << msg;
}

// Issue 10: at 3 ranks an extra parameter on rank 1 used to be reported as "parameter #1" with three
// identical descriptions (the plan's owners shifted); the message must show the real difference.
TEST(OptimizerSafety, ParameterCountMismatchSameErrorEverywhere) {
  if (comm().size() < 2) GTEST_SKIP();
  const int w = comm().size();
  const std::string par = "dp_shard=" + std::to_string(w);
  const std::string msg = construct_error(make_inventory(par, comm().rank() == 1));
  const std::string others = w == 2 ? "rank 0" : w == 3 ? "ranks 0, 2" : "ranks 0, 2, 3";
  EXPECT_NE(msg.find("different parameter counts (8 parameters on " + others + "; 9 parameters on rank 1)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the first that differs is #8: (no such parameter) on " + others + "; 'extra' [4, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("on rank 1;"), std::string::npos) << msg;
  EXPECT_TRUE(same_everywhere(msg)) << msg;
}

TEST(OptimizerSafety, OptionsMismatchNamesTheOptions) {
  if (comm().size() < 2) GTEST_SKIP();
  Inventory inv = make_inventory("dp_shard=" + std::to_string(comm().size()));
  OptimizerOptions o = options_for({"", "auto", DType::F32});
  if (comm().rank() == 1) o.non_finite = NonFinitePolicy::Skip;
  std::string msg;
  try {
    Optimizer opt(shared_comm(), inv, test_groups(inv.params.size()), o);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("ranks disagree on the optimizer options"), std::string::npos) << msg;
  EXPECT_NE(msg.find("non_finite skip on rank 1"), std::string::npos) << msg;
  EXPECT_TRUE(same_everywhere(msg)) << msg;
}

TEST(OptimizerSafety, NonFiniteGradientSameDecision) {
  const int w = comm().size();
  Inventory inv = make_inventory("dp_shard=" + std::to_string(w));
  for (NonFinitePolicy policy : {NonFinitePolicy::Raise, NonFinitePolicy::Skip}) {
    OptimizerOptions o = options_for({"", "auto", DType::F32});
    o.non_finite = policy;
    Optimizer opt(shared_comm(), inv, test_groups(inv.params.size()), o);
    std::vector<std::vector<float>> wv, gv;
    std::vector<TensorView> lw, lg;
    for (size_t i = 0; i < inv.params.size(); ++i) {
      wv.emplace_back(static_cast<size_t>(opt.local_shape(i).numel()), 1.0f);
      gv.emplace_back(static_cast<size_t>(opt.local_shape(i).numel()), 0.5f);
    }
    // the last rank holding elements of w1364 poisons one of them
    const int bad_rank = std::min(w - 1, 1);
    if (comm().rank() == bad_rank && !gv[3].empty()) gv[3][0] = std::numeric_limits<float>::quiet_NaN();
    for (size_t i = 0; i < inv.params.size(); ++i) {
      lw.emplace_back(wv[i].data(), opt.local_shape(i));
      lg.emplace_back(gv[i].data(), opt.local_shape(i));
    }
    const std::vector<std::vector<float>> before = wv;
    std::string msg;
    bool applied = true;
    try {
      applied = opt.step(lw, lg, {{0, {50.0f, 3.0f}}});
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_EQ(wv, before) << "parameters changed";
    EXPECT_EQ(opt.step_count(0), 0);
    if (policy == NonFinitePolicy::Raise) {
      EXPECT_NE(msg.find("gradient of parameter 'w1364' is not finite on rank " + std::to_string(bad_rank)), std::string::npos) << msg;
      EXPECT_TRUE(same_everywhere(msg)) << msg;
    } else {
      EXPECT_TRUE(msg.empty()) << msg;
      EXPECT_FALSE(applied);
      gv[3].assign(gv[3].size(), 0.5f);  // a clean step afterwards works everywhere
      EXPECT_TRUE(opt.step(lw, lg, {{0, {50.0f, 3.0f}}}));
    }
  }
}

TEST(OptimizerSafety, BadLocalShapeRejectedOnEveryRank) {
  Inventory inv = make_inventory("dp_shard=" + std::to_string(comm().size()));
  Optimizer opt(shared_comm(), inv, test_groups(inv.params.size()), options_for({"", "auto", DType::F32}));
  std::vector<std::vector<float>> wv;
  std::vector<TensorView> lw;
  for (size_t i = 0; i < inv.params.size(); ++i) wv.emplace_back(static_cast<size_t>(opt.local_shape(i).numel()) + 64, 1.0f);
  for (size_t i = 0; i < inv.params.size(); ++i) {
    Shape s = opt.local_shape(i);
    if (i == 1 && comm().rank() == 0) s[0] += 1;  // rank 0 passes a wrong shard shape for w183
    lw.emplace_back(wv[i].data(), s);
  }
  std::string msg;
  try {
    opt.step(lw, lw, {{0, {50.0f, 3.0f}}});
  } catch (const std::invalid_argument& e) {
    msg = e.what();
  }
  if (comm().rank() == 0) EXPECT_NE(msg.find("parameter 'w183': this rank's shard should have shape"), std::string::npos) << msg;
  else EXPECT_NE(msg.find("rank 0 rejected its step inputs"), std::string::npos) << msg;
}

}  // namespace
}  // namespace meshmuon

namespace meshmuon {
namespace {

// Mesh communicators owned outside: two optimizers (and anything else) share the sub-communicators
// the plan needs instead of each splitting its own; both still step.
TEST(OptimizerComms, SharesMeshCommunicators) {
  if (comm().size() < 2) GTEST_SKIP() << "agrs needs a shard group of ≥ 2 ranks";
  auto comms = std::make_shared<MeshCommunicators>(shared_comm());
  Inventory inv = make_inventory("dp_shard=" + std::to_string(comm().size()));
  const OptimizerOptions o = options_for({"", "agrs", DType::F32});
  Optimizer a(comms, inv, test_groups(inv.params.size()), o);
  const size_t made = comms->size();
  EXPECT_GT(made, 0u) << "agrs entries need a shard-group communicator";
  Optimizer b(comms, inv, test_groups(inv.params.size()), o);
  EXPECT_EQ(comms->size(), made) << "the second optimizer split new communicators";
  EXPECT_EQ(a.mesh_communicators(), comms);
  for (Optimizer* opt : {&a, &b}) {
    LocalShards x(*opt, inv.params.size());
    EXPECT_TRUE(opt->step(x.lw, x.lg, {{0, {50.0f, 3.0f}}}));
    EXPECT_EQ(opt->last_stats().bytes_sent, opt->last_stats().bytes_sent_predicted);
  }
}

// compute_streams: a chunk's units on several streams give bitwise the results of one stream, at
// any world size and strategy mix (each unit's arithmetic does not depend on its stream).
TEST(OptimizerBitwise, ComputeStreamsDoNotChangeAnyBit) {
  Inventory inv = make_inventory("dp_shard=" + std::to_string(comm().size()));
  const size_t n = inv.params.size();
  for (bool nanochat : {false, true}) {  // also with MuonEq and Muon+ (their own row-parallel loops)
    std::vector<std::vector<float>> first;
    for (int streams : {1, 3, 2, 0}) {
      OptimizerOptions o = options_for({"", "auto", DType::F32});
      o.compute_streams = streams;
      Optimizer opt(shared_comm(), inv, test_groups(n, true, true, nanochat), o);
      EXPECT_EQ(opt.compute_streams(), streams);
      LocalShards x(opt, n);
      for (size_t i = 0; i < n; ++i)
        for (size_t j = 0; j < x.w[i].size(); ++j) x.w[i][j] = value(static_cast<int>(i), static_cast<int64_t>(j) + 1000 * comm().rank(), 9, false);
      for (int t = 0; t < 2; ++t) {
        for (size_t i = 0; i < n; ++i)
          for (size_t j = 0; j < x.g[i].size(); ++j) x.g[i][j] = value(static_cast<int>(i), static_cast<int64_t>(j) + 1000 * comm().rank(), t, false);
        ASSERT_TRUE(opt.step(x.lw, x.lg, {{0, {50.0f, 3.0f}}}));
      }
      std::vector<std::vector<float>> got = x.w;
      for (size_t i = 0; i < n; ++i)
        for (const std::string& k : opt.state_keys(i)) {
          const TensorView v = opt.state(i, k);
          got.emplace_back(v.f32(), v.f32() + v.numel());
        }
      if (first.empty()) first = got;
      EXPECT_EQ(got, first) << "compute_streams " << streams << (nanochat ? " nanochat" : "");
    }
  }
}

}  // namespace
}  // namespace meshmuon
