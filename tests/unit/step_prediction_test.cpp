// The cost model's step prediction (predict_step, docs/plan.md "Predicted step time"): its
// arithmetic by hand on a two-rank plan, its agreement with the planner's own pipelined total when
// the measured fields are neutral, the Newton–Schulz rate by shape class, the comm fit per world
// size, time sharing, and machine profiles as JSON (round trip, errors naming the field).
// Run: build/bin/step_prediction_test
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "meshmuon/plan.h"

namespace meshmuon {
namespace {

// One Muon matrix [64, 32] and one AdamW matrix [50, 16], both Shard(0) over dp=2.
Inventory two_rank_model() {
  Inventory inv;
  inv.model = "tiny";
  inv.mesh_names = {"dense"};
  inv.meshes = {Mesh::parse("dp=2")};
  ParamSpec w;
  w.name = "w", w.shape = Shape{64, 32}, w.placements = {Placement::shard(0)};
  ParamSpec e = w;
  e.name = "emb", e.shape = Shape{50, 16}, e.role = Role::AdamW;
  inv.params = {w, e};
  return inv;
}

MachineProfile simple_profile() {
  MachineProfile m;
  m.name = "test";
  m.bandwidth_Bps = m.replicate_bandwidth_Bps = 1e9;
  m.latency_s = 1e-6;
  m.flops_per_s = 1e9;
  m.bf16_flops_per_s = 4e9;
  m.memory_Bps = 2e9;
  m.overlap = 0;
  m.cores = 1;
  return m;
}

TEST(StepPrediction, ArithmeticByHandOnTwoRanks) {
  PlanOptions o;
  o.machine = simple_profile();
  o.pins = StrategyRules::parse("default:owner_a2a", "test");
  const Plan plan = make_plan(two_rank_model(), o);
  ASSERT_EQ(plan.entries().size(), 1u);
  ASSERT_EQ(plan.chunks().size(), 1u);
  // compute: the owner orthogonalizes the whole matrix; two ranks on one core share it (x2)
  const double compute = ns_flops(64, 32, o.ns) / 1e9 * 2;
  // bandwidth: each rank sends and receives the other half once per direction: 32·32·4 bytes each
  // way (the owner receives the shard and sends the result; the other rank the converse)
  const double bytes = 32.0 * 32 * 4;
  const double band = bytes / 1e9;
  // latency: one grouped exchange to the owner and one back
  const double latency = 2 * 1e-6;
  // elementwise on either rank: its 1,024 Muon elements (momentum 16 + update 12 bytes), its 400
  // AdamW elements (28 bytes), and packing what it sends and receives (2 bytes per byte), x2 sharing
  const double elem = (1024.0 * (kMomentumBytesPerElem + kUpdateBytesPerElem) + 400.0 * kAdamWBytesPerElem +
                       kPackBytesPerCommByte * 2 * bytes) / 2e9 * 2;
  const StepPrediction p = predict_step(plan, 2);
  EXPECT_DOUBLE_EQ(p.time_sharing, 2.0);
  EXPECT_NEAR(p.compute, compute, 1e-15);
  EXPECT_NEAR(p.bandwidth, band, 1e-15);
  EXPECT_NEAR(p.latency, latency, 1e-15);
  EXPECT_NEAR(p.elementwise, elem, 1e-15);
  // overlap 0: the chunk's communication and compute add up
  EXPECT_NEAR(p.pipeline, compute + band + latency, 1e-15);
  EXPECT_NEAR(p.step, compute + band + latency + elem, 1e-15);
  // overlap 1 with one chunk: the pipeline's prologue is not hidden, so nothing is hidden
  o.machine.overlap = 1;
  EXPECT_NEAR(predict_step(make_plan(two_rank_model(), o), 2).pipeline, compute + band + latency, 1e-15);
  // one rank per core: no sharing
  EXPECT_NEAR(predict_step(plan, 1).compute, compute / 2, 1e-15);
  EXPECT_NEAR(predict_step(plan, 0).elementwise, elem / 2, 1e-15);
  // bf16 products: the bf16 rate
  o.ns.matmul_dtype = DType::BF16;
  o.machine.overlap = 0;
  EXPECT_NEAR(predict_step(make_plan(two_rank_model(), o), 2).compute, ns_flops(64, 32, o.ns) / 4e9 * 2, 1e-15);
}

// A same-run rate scale (bench step --predict's ns_rate_scale) divides the Newton–Schulz seconds
// and nothing else; a scale that is not a finite positive number is refused, naming it.
TEST(StepPrediction, NsRateScaleDividesOnlyTheComputeTerm) {
  PlanOptions o;
  o.machine = simple_profile();
  o.machine.ns_rates = {{32, 64, 2e9, 8e9}};  // a measured class: the scale applies to it too
  o.pins = StrategyRules::parse("default:owner_a2a", "test");
  const Plan plan = make_plan(two_rank_model(), o);
  const StepPrediction base = predict_step(plan, 2), fast = predict_step(plan, 2, 2.5);
  const double compute = ns_flops(64, 32, o.ns) / 2e9 * 2;  // the class's rate, x2 sharing
  EXPECT_NEAR(base.compute, compute, 1e-15);
  EXPECT_NEAR(fast.compute, compute / 2.5, 1e-15);
  EXPECT_DOUBLE_EQ(fast.bandwidth, base.bandwidth);
  EXPECT_DOUBLE_EQ(fast.latency, base.latency);
  EXPECT_DOUBLE_EQ(fast.elementwise, base.elementwise);
  // overlap 0, one chunk: step = compute + comm + elementwise, with the scaled compute
  EXPECT_NEAR(fast.step, compute / 2.5 + base.bandwidth + base.latency + base.elementwise, 1e-15);
  EXPECT_NEAR(predict_step(plan, 2, 1.0).step, base.step, 0.0);
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    try {
      (void)predict_step(plan, 2, bad);
      ADD_FAILURE() << "scale " << bad << " accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("ns_rate_scale"), std::string::npos) << e.what();
    }
  }
}

TEST(StepPrediction, CommFitForTheWorldSizeReplacesTheScalars) {
  PlanOptions o;
  o.machine = simple_profile();
  o.pins = StrategyRules::parse("default:owner_a2a", "test");
  o.machine.comm_fits = {{4, 1e6, 1.0}, {2, 0.5e9, 3e-6}};
  const StepPrediction p = predict_step(make_plan(two_rank_model(), o), 1);
  EXPECT_NEAR(p.bandwidth, 32.0 * 32 * 4 / 0.5e9, 1e-15);
  EXPECT_NEAR(p.latency, 2 * 3e-6, 1e-15);
}

// Neutral measured fields (no shape classes, no fits, no elementwise term, overlap 1, no sharing):
// with one chunk in flight (window 1) the prediction is the planner's own total, chunk by chunk
// (comm + compute each), for every strategy; with a window, compute is the busiest rank's total
// (plan flops_max / rate), at most the sum of each chunk's busiest, and the chunks' overlap is
// subtracted (at most the smaller of comm and compute).
TEST(StepPrediction, NeutralProfileAgreesWithThePlanner) {
  for (const char* machine : {"h100", "cpu", "h100-ib"})
    for (const char* strategy : {"", "default:owner_a2a", "default:allgather", "default:agrs"}) {
      PlanOptions o;
      o.machine = MachineProfile::named(machine);
      o.machine.memory_Bps = 0, o.machine.overlap = 1, o.machine.cores = 0;
      o.machine.ns_rates.clear(), o.machine.comm_fits.clear();
      o.pins = StrategyRules::parse(strategy, "test");
      o.chunk_bytes = int64_t{8} << 20;  // several chunks
      const Inventory inv = apply_parallel(preset_model("gpt2-124m"), parse_parallel("dp_shard=4"));
      o.window = 1;
      const Plan serial = make_plan(inv, o);
      ASSERT_GT(serial.chunks().size(), 2u);
      const StepPrediction p = predict_step(serial, 4);
      const CostSummary& t = serial.total();
      EXPECT_NEAR(p.step, t.predicted_seconds, 1e-9 * t.predicted_seconds) << machine << " " << strategy;
      EXPECT_NEAR(p.compute, t.compute_seconds, 1e-9 * t.compute_seconds) << machine << " " << strategy;
      EXPECT_NEAR(p.bandwidth + p.latency, t.comm_seconds, 1e-9 * t.comm_seconds) << machine << " " << strategy;
      o.window = 2;
      const Plan piped = make_plan(inv, o);
      const StepPrediction q = predict_step(piped, 4);
      const double rate = o.machine.ns_flops_per_s(o.ns);
      EXPECT_NEAR(q.compute, piped.total().flops_max / rate, 1e-9 * q.compute) << machine << " " << strategy;
      EXPECT_LE(q.compute, piped.total().compute_seconds * (1 + 1e-12));
      const double comm = q.bandwidth + q.latency;
      EXPECT_NEAR(comm, piped.total().comm_seconds, 1e-9 * comm);
      EXPECT_LE(q.pipeline, q.compute + comm + 1e-12);
      EXPECT_GE(q.pipeline, std::max(q.compute, comm) - 1e-12);
    }
}

TEST(StepPrediction, NsRateIsTheNearestMeasuredClass) {
  MachineProfile m = simple_profile();
  m.ns_rates = {{128, 128, 10, 40}, {768, 3072, 20, 0}, {1024, 1024, 30, 90}};
  NsOptions f32, bf16;
  bf16.matmul_dtype = DType::BF16;
  EXPECT_EQ(m.ns_rate(3072, 768, f32), 20);   // either orientation
  EXPECT_EQ(m.ns_rate(700, 2900, f32), 20);   // nearest in log space
  EXPECT_EQ(m.ns_rate(100, 100, f32), 10);
  EXPECT_EQ(m.ns_rate(1280, 1280, f32), 30);
  EXPECT_EQ(m.ns_rate(768, 3072, bf16), 90);  // the class measured for bf16 nearest to it
  m.ns_rates.clear();
  EXPECT_EQ(m.ns_rate(768, 3072, f32), 1e9);  // the scalars without classes
  EXPECT_EQ(m.ns_rate(768, 3072, bf16), 4e9);
}

TEST(StepPrediction, ProfileJsonRoundTripAndErrors) {
  MachineProfile m = simple_profile();
  m.ns_rates = {{128, 512, 1.5e10, 3e10}};
  m.comm_fits = {{2, 2e9, 4e-6}, {4, 1e9, 9e-6}};
  const MachineProfile r = MachineProfile::from_json(m.to_json());
  EXPECT_EQ(r.name, "test");
  EXPECT_EQ(r.to_json(), m.to_json());
  ASSERT_EQ(r.ns_rates.size(), 1u);
  EXPECT_EQ(r.ns_rates[0].long_side, 512);
  EXPECT_EQ(r.comm_fits[1].latency_s, 9e-6);
  EXPECT_EQ(r.cores, 1);
  const auto fails = [](const std::string& text, const std::string& needle) {
    try {
      (void)MachineProfile::from_json(text);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what()).find(needle) != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(fails(R"({"overlap": 2})", "overlap"));
  EXPECT_TRUE(fails(R"({"cores": 1.5})", "cores"));
  EXPECT_TRUE(fails(R"({"ns_rates": [{"short_side": 512, "long_side": 128}]})", "short_side"));
  EXPECT_TRUE(fails(R"({"comm_fits": [{"bandwidth_Bps": 1}]})", "ranks"));
  EXPECT_TRUE(fails(R"({"memory_bps": 1})", "memory_Bps"));  // unknown field: the list names the right one
  EXPECT_FALSE(fails(R"({"memory_Bps": 1})", "memory_Bps"));  // negative control
  // resolve: a name, or a file
  EXPECT_EQ(MachineProfile::resolve("cpu").name, "cpu");
  const std::string path = ::testing::TempDir() + "step_prediction_profile.json";
  std::ofstream(path) << m.to_json();
  EXPECT_EQ(MachineProfile::resolve(path).to_json(), m.to_json());
  std::remove(path.c_str());
  EXPECT_THROW((void)MachineProfile::resolve(path), std::invalid_argument);
}

}  // namespace
}  // namespace meshmuon
