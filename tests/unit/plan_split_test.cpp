// Split orthogonalization in the planner and inventory (ParamSpec::split, issue 37): the blocks'
// flops, gram_allreduce refused for split matrices (a block is orthogonalized whole), the fingerprint
// and the plan output (text and JSON) show the blocks, model files carry "split", bad splits are
// refused naming the parameter, the group option resolves to blocks. Run: build/bin/plan_split_test
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "meshmuon/optim_options.h"
#include "meshmuon/plan.h"

namespace meshmuon {
namespace {

// A wide fused QKV [96, 192] sharded along its long dim (columns) over 4 ranks, and a plain matrix.
Inventory qkv_model(std::vector<int64_t> split) {
  Inventory inv;
  inv.model = "split";
  inv.mesh_names = {"dense"};
  inv.meshes = {Mesh::parse("dp=4")};
  ParamSpec q;
  q.name = "attn.qkv";
  q.shape = Shape{96, 192};
  q.placements = {Placement::shard(1)};
  q.split = std::move(split);
  ParamSpec w;
  w.name = "mlp.w";
  w.shape = Shape{64, 32};
  w.placements = {Placement::shard(0)};
  inv.params = {q, w};
  return inv;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(PlanSplit, BlocksChangeFlopsStrategiesFingerprintAndOutput) {
  const Inventory whole = qkv_model({}), split = qkv_model({32, 32, 32});
  EXPECT_TRUE(strategy_applies(Strategy::GramAllReduce, whole, 0));
  EXPECT_FALSE(strategy_applies(Strategy::GramAllReduce, split, 0));
  EXPECT_TRUE(strategy_applies(Strategy::OwnerA2A, split, 0));
  PlanOptions o;
  const Plan pw = make_plan(whole, o), ps = make_plan(split, o);
  EXPECT_NE(pw.fingerprint(), ps.fingerprint());
  EXPECT_DOUBLE_EQ(ps.entry_of(0)->unit_flops, 3 * ns_flops(32, 192, o.ns));
  EXPECT_DOUBLE_EQ(pw.entry_of(0)->unit_flops, ns_flops(96, 192, o.ns));
  EXPECT_LT(ps.entry_of(0)->unit_flops, pw.entry_of(0)->unit_flops);  // three short Gram sides
  EXPECT_EQ(ps.entry_of(1)->unit_flops, pw.entry_of(1)->unit_flops);
  EXPECT_NE(ps.to_string().find("split: 1 parameters orthogonalized as 3 row blocks (attn.qkv [32 x3])"), std::string::npos)
      << ps.to_string();
  EXPECT_EQ(pw.to_string().find("split:"), std::string::npos);
  EXPECT_NE(ps.to_json().find("\"blocks\": [\n        32,\n        32,\n        32\n      ]"), std::string::npos) << ps.to_json();
  // a pin of gram_allreduce on the split matrix names it
  PlanOptions pin;
  pin.pins = StrategyRules::parse("attn.*:gram_allreduce");
  pin.exact = false;
  EXPECT_NE(error_of([&] { make_plan(split, pin); }).find("'attn.qkv'"), std::string::npos);
  EXPECT_NO_THROW(make_plan(whole, pin));
}

TEST(PlanSplit, BadSplitsAreRefusedNamingTheParameter) {
  EXPECT_NE(error_of([&] { make_plan(qkv_model({32, 32}), PlanOptions{}); }).find("parameter 'attn.qkv': field 'split' sums to 64"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_plan(qkv_model({96, 0}), PlanOptions{}); }).find("block of 0 rows"), std::string::npos);
  Inventory adamw = qkv_model({48, 48});
  adamw.params[0].role = Role::AdamW;
  EXPECT_NE(error_of([&] { make_plan(adamw, PlanOptions{}); }).find("'split' is set on an AdamW parameter"), std::string::npos);
}

TEST(PlanSplit, ModelFileCarriesSplit) {
  const char* text = R"J({"model": "m", "params": [
    {"name": "qkv", "shape": [12, 4], "role": "muon", "tp": "colwise", "split": [8, 2, 2]},
    {"name": "w", "shape": [6, 4], "role": "muon"}]})J";
  const ParallelConfig c = parse_parallel("dp_shard=2,tp=2");
  const Inventory inv = load_inventory_json(text, &c);
  EXPECT_EQ(inv.params[0].split, (std::vector<int64_t>{8, 2, 2}));
  EXPECT_TRUE(inv.params[1].split.empty());
  const char* bad = R"J({"model": "m", "params": [{"name": "qkv", "shape": [12, 4], "role": "muon", "split": [8, -4]}]})J";
  EXPECT_NE(error_of([&] { load_inventory_json(bad, &c); }).find("field 'split' must hold positive integers"), std::string::npos);
}

TEST(PlanSplit, GroupOptionResolvesToBlocks) {
  GroupOptions o;
  EXPECT_TRUE(resolve_split(o, 12, "w").empty());
  o.num_heads = 1;
  EXPECT_TRUE(resolve_split(o, 12, "w").empty());
  o.num_heads = 3;
  EXPECT_EQ(resolve_split(o, 12, "w"), (std::vector<int64_t>{4, 4, 4}));
  EXPECT_NE(error_of([&] { resolve_split(o, 10, "w"); }).find("parameter 'w': num_heads 3 does not divide its 10 rows"),
            std::string::npos);
  o.num_heads = 0, o.split_sizes = {8, 2, 2};
  EXPECT_EQ(resolve_split(o, 12, "w"), o.split_sizes);
  EXPECT_NE(error_of([&] { resolve_split(o, 13, "w"); }).find("split_sizes sum to 12"), std::string::npos);
  o.num_heads = 2;
  EXPECT_NE(error_of([&] { validate_group_options(o, 1); }).find("group 1: num_heads 2 and split_sizes are both set"),
            std::string::npos);
  o.algorithm = Algorithm::AdamW;  // AdamW groups ignore Muon's fields
  EXPECT_TRUE(resolve_split(o, 12, "w").empty());
}

}  // namespace
}  // namespace meshmuon
