// Per-step agreement of meshmuon::Optimizer (issue 10): a rank whose gradients are missing, a
// hyperparameter, policy, step count or QK logits that differ between ranks must raise the same
// error on every rank, naming the difference and the ranks on each side, with nothing modified;
// identical inputs (the negative control) step normally.
//   mpirun -n 3 --oversubscribe build/bin/optimizer_test --gtest_filter='StepAgreement*'
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "meshmuon/error.h"
#include "optimizer_fixture.h"

namespace meshmuon {
namespace {

// One optimizer on FSDP over the world, with its local buffers (params 1.0, grads 0.5).
struct Planned {
  Inventory inv = make_inventory("dp_shard=" + std::to_string(comm().size()));
  Optimizer opt;
  explicit Planned(const OptimizerOptions& o) : opt(shared_comm(), inv, test_groups(inv.params.size()), o) {}
};

struct Rig : Planned, LocalShards {
  std::map<int, std::vector<float>> logits{{0, {50.0f, 3.0f}}};

  explicit Rig(OptimizerOptions o = options_for({"", "auto", DType::F32}))
      : Planned(o), LocalShards(opt, inv.params.size()) {}

  // Steps; returns the meshmuon::Error message ("" when none) and checks nothing was modified on error.
  std::string step() {
    const auto before_w = w;
    std::vector<std::vector<float>> before_state;
    std::vector<int64_t> before_steps;
    for (size_t i = 0; i < inv.params.size(); ++i) {
      before_steps.push_back(opt.step_count(i));
      for (const std::string& k : opt.state_keys(i)) {
        TensorView v = opt.state(i, k);
        before_state.emplace_back(v.f32() ? v.f32() : nullptr, v.f32() ? v.f32() + v.numel() : nullptr);
      }
    }
    try {
      opt.step(lw, lg, logits);
    } catch (const Error& e) {
      EXPECT_EQ(w, before_w) << "parameters changed by a step that raised";
      size_t k = 0;
      for (size_t i = 0; i < inv.params.size(); ++i) {
        EXPECT_EQ(opt.step_count(i), before_steps[i]);
        for (const std::string& key : opt.state_keys(i)) {
          TensorView v = opt.state(i, key);
          EXPECT_EQ(std::vector<float>(v.f32() ? v.f32() : nullptr, v.f32() ? v.f32() + v.numel() : nullptr), before_state[k++])
              << inv.params[i].name << " " << key << " changed";
        }
      }
      return e.what();
    }
    return "";
  }
};

// The ranks other than `rank`, as the messages write them (runs of three or more as "a-c").
std::string others_than(int rank) {
  const int w = comm().size();
  if (w == 2) return rank == 0 ? "rank 1" : "rank 0";
  if (w == 3) return rank == 0 ? "ranks 1, 2" : rank == 1 ? "ranks 0, 2" : "ranks 0, 1";
  if (w == 4) return rank == 0 ? "ranks 1-3" : rank == 1 ? "ranks 0, 2, 3" : rank == 2 ? "ranks 0, 1, 3" : "ranks 0-2";
  ADD_FAILURE() << "no expected text for " << w << " ranks";
  return "?";
}

TEST(StepAgreement, SameInputsStep) {  // the negative control: nothing differs, steps apply
  Rig s;
  EXPECT_EQ(s.step(), "");
  EXPECT_EQ(s.step(), "");
  EXPECT_EQ(s.opt.step_count(0), 2);
}

TEST(StepAgreement, GradientMissingOnOneRank) {
  if (comm().size() < 2) GTEST_SKIP() << "needs ≥ 2 ranks";
  Rig s;
  if (comm().rank() == 1) s.lg[3] = TensorView();
  const std::string msg = s.step();
  EXPECT_NE(msg.find("parameter 'w1364' has no gradient on rank 1 but has one on " + others_than(1)), std::string::npos) << msg;
  EXPECT_TRUE(same_everywhere(msg)) << msg;
  s.lg[3] = TensorView(s.g[3].data(), s.opt.local_shape(3));
  EXPECT_EQ(s.step(), "") << "the next step (same inputs again) works";
}

TEST(StepAgreement, RankWithNoGradientsAtAllTakesPart) {
  if (comm().size() < 2) GTEST_SKIP() << "needs ≥ 2 ranks";
  Rig s;
  if (comm().rank() == 1)
    for (TensorView& v : s.lg) v = TensorView();
  const std::string msg = s.step();
  EXPECT_NE(msg.find("parameter 'w57' has no gradient on rank 1 but has one on " + others_than(1)), std::string::npos) << msg;
  EXPECT_TRUE(same_everywhere(msg)) << msg;
}

TEST(StepAgreement, LrDiffers) {
  if (comm().size() < 2) GTEST_SKIP() << "needs ≥ 2 ranks";
  Rig s;
  if (comm().rank() == 1) s.opt.options(1).lr = 0.031;
  const std::string msg = s.step();
  EXPECT_NE(msg.find("group 1 option 'lr' is 0.03 on " + others_than(1) + "; 0.031 on rank 1"), std::string::npos) << msg;
  EXPECT_TRUE(same_everywhere(msg)) << msg;
}

TEST(StepAgreement, NsOptionDiffers) {
  if (comm().size() < 2) GTEST_SKIP() << "needs ≥ 2 ranks";
  Rig s;
  if (comm().rank() == 0) s.opt.options(0).ns.steps = 6;
  const std::string msg = s.step();
  EXPECT_NE(msg.find("group 0 option 'ns.steps' is 6 on rank 0; 5 on " + others_than(0)), std::string::npos) << msg;
  EXPECT_TRUE(same_everywhere(msg)) << msg;
}

TEST(StepAgreement, StepCountDiffers) {
  if (comm().size() < 2) GTEST_SKIP() << "needs ≥ 2 ranks";
  Rig s;
  ASSERT_EQ(s.step(), "");
  if (comm().rank() == 1) s.opt.set_step_count(7, 5);  // e.g. a checkpoint loaded on one rank only
  const std::string msg = s.step();
  EXPECT_NE(msg.find("parameter 'bias' is at step 1 on " + others_than(1) + "; step 5 on rank 1"), std::string::npos) << msg;
  EXPECT_TRUE(same_everywhere(msg)) << msg;
}

TEST(StepAgreement, QkLogitsDiffer) {
  if (comm().size() < 2) GTEST_SKIP() << "needs ≥ 2 ranks";
  Rig s;
  if (comm().rank() == 1) s.logits[0][1] = 4.0f;
  const std::string msg = s.step();
  EXPECT_NE(msg.find("qk_logits[0] is [50,3] on " + others_than(1) + "; [50,4] on rank 1"), std::string::npos) << msg;
  EXPECT_TRUE(same_everywhere(msg)) << msg;
}

TEST(StepAgreement, AbsentEverywhereLeavesTheParameterUntouched) {
  Rig s;
  for (size_t i : {size_t{3}, size_t{7}}) s.lg[i] = TensorView();
  ASSERT_EQ(s.step(), "");
  for (size_t i = 0; i < s.inv.params.size(); ++i) {
    const bool absent = i == 3 || i == 7;
    EXPECT_EQ(s.opt.step_count(i), absent ? 0 : 1) << s.inv.params[i].name;
    if (absent) {
      EXPECT_EQ(s.w[i], std::vector<float>(s.w[i].size(), 1.0f)) << s.inv.params[i].name;
      for (const std::string& k : s.opt.state_keys(i)) {
        TensorView v = s.opt.state(i, k);
        for (int64_t j = 0; j < v.numel(); ++j) EXPECT_EQ(v.f32()[j], 0.0f) << s.inv.params[i].name << " " << k;
      }
    }
  }
}

}  // namespace
}  // namespace meshmuon
