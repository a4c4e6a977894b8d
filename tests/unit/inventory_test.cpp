// Inventory: presets against published totals, parallelism recipes (FSDP2 / torchtitan placements),
// the JSON loader and its errors. Run: build/bin/inventory_test
#include <gtest/gtest.h>

#include "meshmuon/box.h"
#include "test_support.h"
#include "meshmuon/inventory.h"

namespace meshmuon {
namespace {

using test::error_of;

const ParamSpec& find(const Inventory& inv, const std::string& name) {
  for (const ParamSpec& p : inv.params)
    if (p.name == name) return p;
  throw std::runtime_error("no parameter " + name);
}

std::string placements(const ParamSpec& p) {
  std::string s;
  for (const Placement& x : p.placements) s += (s.empty() ? "" : ",") + to_string(x);
  return s;
}

TEST(Presets, ElementCountsMatchPublishedTotals) {
  for (const std::string& name : preset_names()) {
    const ModelDesc m = preset_model(name);
    int64_t n = 0;
    for (const ParamSpec& p : m.params) n += p.numel();
    const double published = static_cast<double>(preset_published_total(name));
    ASSERT_GT(published, 0) << name;
    EXPECT_LT(std::abs(static_cast<double>(n) - published) / published, 0.01) << name << " has " << n;
  }
  // exact counts where the published figure is exact
  int64_t gpt2 = 0;
  for (const ParamSpec& p : preset_model("gpt2-124m").params) gpt2 += p.numel();
  EXPECT_EQ(gpt2, 124'439'808);
  int64_t llama = 0;
  for (const ParamSpec& p : preset_model("llama3-8b").params) llama += p.numel();
  EXPECT_EQ(llama, 8'030'261'248);
  EXPECT_NE(error_of([] { preset_model("llama9"); }).find("presets:"), std::string::npos);
}

TEST(Presets, EmbeddingsAndHeadsGoToAdamW) {
  for (const std::string& name : preset_names())
    for (const ParamSpec& p : preset_model(name).params) {
      if (p.name.find("emb") != std::string::npos || p.name.find("wte") != std::string::npos ||
          p.name.find("output") != std::string::npos || p.name.find("lm_head") != std::string::npos)
        EXPECT_EQ(p.role, Role::AdamW) << p.name;
      if (p.shape.ndim() == 1) EXPECT_EQ(p.role, Role::AdamW) << p.name;
    }
}

TEST(Recipes, FsdpTpHsdpPlacements) {
  const Inventory inv = apply_parallel(preset_model("llama3-8b"), parse_parallel("dp_replicate=2,dp_shard=4,tp=2"));
  EXPECT_EQ(inv.world_size(), 16);
  EXPECT_EQ(inv.meshes[0].to_string(), "dp_replicate=2,dp_shard=4,tp=2");
  EXPECT_EQ(placements(find(inv, "layers.0.attention.wq.weight")), "R,SS(0,2),S(0)");  // FSDP over colwise TP
  EXPECT_EQ(placements(find(inv, "layers.0.attention.wo.weight")), "R,S(0),S(1)");     // rowwise
  EXPECT_EQ(placements(find(inv, "layers.0.attention_norm.weight")), "R,S(0),R");
  const Inventory fsdp = apply_parallel(preset_model("llama3-8b"), parse_parallel("dp_shard=8"));
  EXPECT_EQ(placements(find(fsdp, "layers.0.feed_forward.w1.weight")), "S(0)");
  const Inventory one = apply_parallel(preset_model("gpt2-124m"), parse_parallel(""));
  EXPECT_EQ(one.world_size(), 1);
  EXPECT_TRUE(one.params[0].placements.empty());
}

TEST(Recipes, ExpertsOnEpThenEfsdp) {
  // qwen3: 128 experts, efsdp·ep = 8 ≤ 128: FSDP on dim 0 over the ep-sharded dim (strided)
  const Inventory q = apply_parallel(preset_model("qwen3-30b-a3b"), parse_parallel("dp_shard=8,ep=4"));
  ASSERT_EQ(q.meshes.size(), 2u);
  EXPECT_EQ(q.meshes[1].to_string(), "efsdp=2,ep=4");
  const ParamSpec& w1 = find(q, "layers.0.moe.experts.w1");
  EXPECT_EQ(q.mesh_names[static_cast<size_t>(w1.mesh)], "expert");
  EXPECT_EQ(placements(w1), "SS(0,4),S(0)");
  for (int r = 0; r < 8; ++r) {  // whole experts, 16 per rank
    const Box b = local_box(w1.shape, w1.placements, q.meshes[1], r);
    EXPECT_EQ(b.dims[0].size(), 16);
    EXPECT_EQ(b.dims[1].size(), 768);
  }
  // deepseek-v3 at 1,024 ranks, ep 64: efsdp 16 · 64 > 256 experts: FSDP on dim 1
  const Inventory d = apply_parallel(preset_model("deepseek-v3"), parse_parallel("dp_shard=1024,ep=64"));
  EXPECT_EQ(placements(find(d, "layers.3.moe.experts.w2")), "S(1),S(0)");
  // tp folds into ep (expert TP off): ep must be a multiple of tp and ep/tp divide dp_shard
  const Inventory t = apply_parallel(preset_model("qwen3-30b-a3b"), parse_parallel("dp_shard=4,tp=2,ep=4"));
  EXPECT_EQ(t.meshes[1].to_string(), "efsdp=2,ep=4");
  EXPECT_THROW(apply_parallel(preset_model("qwen3-30b-a3b"), parse_parallel("dp_shard=4,tp=2,ep=3")), std::invalid_argument);
  EXPECT_THROW(parse_parallel("pp=2"), std::invalid_argument);
}

const char* kGood = R"J({
  "model": "tiny",
  "meshes": [{"name": "dense", "dims": "dp=2,tp=2"}],
  "params": [
    {"name": "wq", "shape": [8, 4], "role": "muon", "placements": ["SS(0,2)", "S(0)"],
     "qk": {"layer": 0, "kind": "q", "heads": 2, "head_dim": 4}},
    {"name": "norm", "shape": [4], "role": "adamw", "dtype": "bf16", "placements": ["S(0)", "R"]}
  ]
})J";

TEST(ModelFile, LoadsPlacedModel) {
  const Inventory inv = load_inventory_json(kGood, nullptr);
  EXPECT_EQ(inv.model, "tiny");
  EXPECT_EQ(inv.world_size(), 4);
  EXPECT_EQ(inv.params[0].placements[0], Placement::strided_shard(0, 2));
  EXPECT_EQ(inv.params[1].dtype, DType::BF16);
  ASSERT_TRUE(inv.params[0].qk.has_value());
  EXPECT_EQ(inv.params[0].qk->heads, 2);
}

TEST(ModelFile, UnplacedModelUsesParallel) {
  const char* text = R"J({"model": "m", "params": [
    {"name": "w", "shape": [6, 4], "role": "muon", "tp": "colwise"},
    {"name": "e", "shape": [4, 6, 4], "role": "muon", "expert": true}]})J";
  const ParallelConfig c = parse_parallel("dp_shard=2,tp=2");
  const Inventory inv = load_inventory_json(text, &c);
  EXPECT_EQ(placements(inv.params[0]), "SS(0,2),S(0)");
  EXPECT_NE(error_of([&] { load_inventory_json(text, nullptr); }).find("--parallel"), std::string::npos);
}

struct BadCase {
  const char* json;
  const char* must_contain[2];
};

TEST(ModelFile, ClearErrorsNameTheParameterAndField) {
  const ParallelConfig eight = parse_parallel("dp_shard=8");
  const BadCase cases[] = {
      {R"J({"params": [ {"name": "w", )J", {"malformed JSON", ""}},
      {R"J({"meshes": [{"name": "d", "dims": "dp=2"}], "params": [{"name": "w1", "shape": [4, 4], "role": "muon", "placements": ["Partial()"]}]})J",
       {"'w1'", "placements[0]"}},
      {R"J({"meshes": [{"name": "d", "dims": "dp=2"}], "params": [{"name": "w2", "shape": [4, 4], "role": "muon", "placements": ["S(2)"]}]})J",
       {"'w2'", "dim 2"}},
      {R"J({"meshes": [{"name": "d", "dims": "dp=2"}], "params": [{"name": "w3", "shape": [4, 4], "role": "muon", "placements": ["S(0)", "R"]}]})J",
       {"'w3'", "placements"}},
      {R"J({"params": [{"name": "bias", "shape": [4], "role": "muon"}]})J", {"'bias'", "AdamW"}},
      {R"J({"params": [{"name": "layers.3.mlp.w1", "shape": [4, 4, 4], "role": "muon"}]})J", {"'layers.3.mlp.w1'", "expert"}},
      {R"J({"params": [{"name": "w4", "shape": [4, 4]}]})J", {"'w4'", "'role'"}},
      {R"J({"params": [{"name": "w5", "shape": [4, 4], "role": "muon", "tpp": "x"}]})J", {"'w5'", "'tpp'"}},
      {R"J({"params": [{"name": "w6", "shape": [4, -1], "role": "muon"}]})J", {"'w6'", "'shape'"}},
      {R"J({"params": [{"name": "w7", "shape": [4, 4], "role": "sgd"}]})J", {"'w7'", "'role'"}},
  };
  for (const BadCase& c : cases) {
    const std::string msg = error_of([&] { load_inventory_json(c.json, &eight); });
    ASSERT_FALSE(msg.empty()) << c.json;
    for (const char* part : c.must_contain) EXPECT_NE(msg.find(part), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("[", 0), 0u) << msg;  // starts with the area
  }
  // mesh size not matching the world given on the command line
  const std::string msg = error_of([&] { load_inventory_json(kGood, &eight); });
  EXPECT_NE(msg.find("world"), std::string::npos) << msg;
}

}  // namespace
}  // namespace meshmuon
