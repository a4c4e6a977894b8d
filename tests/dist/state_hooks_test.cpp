// The state store's hooks (where offload plugs in): every step acquires each stepped parameter's
// state exactly once before using it and releases it exactly once after, per pipeline chunk and
// AdamW pass (distributed) and per parameter (LocalOptimizer); a skipped step touches nothing.
//   mpirun -n 3 --oversubscribe build/bin/optimizer_test --gtest_filter='StateHooks*'
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <vector>

#include "optimizer_fixture.h"

namespace meshmuon {
namespace {

struct Recorder {
  std::mutex m;
  std::map<size_t, int> held, acquired, released;
  bool misuse = false;
  StateHooks hooks() {
    return {[this](std::span<const size_t> ps) {
              std::lock_guard<std::mutex> lk(m);
              for (size_t p : ps) misuse |= held[p]++ != 0, ++acquired[p];
            },
            [this](std::span<const size_t> ps) {
              std::lock_guard<std::mutex> lk(m);
              for (size_t p : ps) misuse |= --held[p] != 0, ++released[p];
            }};
  }
};

TEST(StateHooks, DistributedStepAcquiresAndReleasesEachParameterOnce) {
  Inventory inv = make_inventory("dp_shard=" + std::to_string(comm().size()));
  Recorder rec;
  OptimizerOptions o = options_for({"", "auto", DType::F32});
  o.state_hooks = rec.hooks();
  Optimizer opt(shared_comm(), inv, test_groups(inv.params.size()), o);
  LocalShards x(opt, inv.params.size());
  ASSERT_TRUE(opt.step(x.lw, x.lg, {{0, {50.0f, 3.0f}}}));
  EXPECT_FALSE(rec.misuse) << "acquired twice, or released without acquire";
  for (size_t i = 0; i < inv.params.size(); ++i) {
    const bool adamw = inv.params[i].role == Role::AdamW;
    const int want = adamw && opt.local_shape(i).numel() == 0 ? 0 : 1;  // an empty AdamW shard has nothing to update
    EXPECT_EQ(rec.acquired[i], want) << inv.params[i].name;
    EXPECT_EQ(rec.released[i], want) << inv.params[i].name;
    EXPECT_EQ(rec.held[i], 0) << inv.params[i].name;
  }
}

TEST(StateHooks, LocalOptimizerAcquiresEachParameterOnceOnAnyThread) {
  Inventory inv = make_inventory("dp_shard=1");
  std::vector<ParamInfo> infos;
  for (const ParamSpec& p : inv.params) infos.push_back({p.name, p.shape, p.expert, p.qk});
  Recorder rec;
  LocalOptimizerOptions o;
  o.threads = 2;
  o.state_hooks = rec.hooks();
  LocalOptimizer opt(infos, test_groups(infos.size()), o);
  std::vector<std::vector<float>> w, g;
  std::vector<TensorView> lw, lg;
  for (const ParamInfo& p : infos) w.emplace_back(static_cast<size_t>(p.shape.numel()), 1.0f), g.emplace_back(w.back().size(), 0.5f);
  for (size_t i = 0; i < infos.size(); ++i) lw.emplace_back(w[i].data(), infos[i].shape), lg.emplace_back(g[i].data(), infos[i].shape);
  lg[2] = TensorView();  // no gradient: its state is not touched
  ASSERT_TRUE(opt.step(lw, lg, {{0, {50.0f, 3.0f}}}));
  EXPECT_FALSE(rec.misuse);
  for (size_t i = 0; i < infos.size(); ++i) {
    EXPECT_EQ(rec.acquired[i], i == 2 ? 0 : 1) << infos[i].name;
    EXPECT_EQ(rec.released[i], i == 2 ? 0 : 1) << infos[i].name;
  }
}

}  // namespace
}  // namespace meshmuon
