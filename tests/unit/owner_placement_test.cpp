// Owner placement (issue 38) in the layout and the planner: the Owned(k) placement's boxes, the plan
// of an owned matrix (`local`, zero bytes; negative control: the same matrix sharded moves bytes),
// LPT owners (balance, one layer's matrices on different ranks), the placement cost terms and the
// planner's placement choice. Run: build/bin/owner_placement_test
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "meshmuon/box.h"
#include "meshmuon/plan.h"
#include "plan/owner_placement.h"

namespace meshmuon {
namespace {

ParamSpec matrix(std::string name, int64_t rows, int64_t cols, Role role = Role::Muon) {
  ParamSpec p;
  p.name = std::move(name), p.shape = Shape{rows, cols}, p.role = role;
  return p;
}

TEST(OwnedPlacement, BoxesNamesAndErrors) {
  const Mesh fsdp = Mesh::parse("dp_shard=3");
  const Placement o1 = Placement::owned(1);
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_EQ(local_box(Shape{5, 4}, std::vector<Placement>{o1}, fsdp, rank).numel(), rank == 1 ? 20 : 0) << rank;
  const Mesh hsdp = Mesh::parse("dp_replicate=2,dp_shard=2");
  const std::vector<Placement> one_rank{Placement::owned(1), Placement::owned(0)};  // rank (1, 0) = 2
  for (int rank = 0; rank < 4; ++rank) {
    const Box b = local_box(Shape{3, 7}, one_rank, hsdp, rank);
    EXPECT_EQ(b.numel(), rank == 2 ? 21 : 0) << rank;
    if (rank == 2) EXPECT_EQ(b.shape(), (Shape{3, 7}));
  }
  EXPECT_EQ(to_string(o1), "O(1)");
  EXPECT_EQ(parse_placement("O(2)"), Placement::owned(2));
  EXPECT_EQ(parse_placement("Owned(0)"), Placement::owned(0));
  EXPECT_THROW(parse_placement("O(-1)"), std::invalid_argument);
  EXPECT_THROW((void)local_box(Shape{5, 4}, std::vector<Placement>{Placement::owned(3)}, fsdp, 0), std::invalid_argument);
}

Inventory one_matrix(const std::string& mesh, std::vector<Placement> placements) {
  Inventory inv;
  inv.model = "owner";
  inv.mesh_names = {"dense"};
  inv.meshes = {Mesh::parse(mesh)};
  ParamSpec p = matrix("layers.0.w", 64, 48);
  p.placements = std::move(placements);
  inv.params.push_back(p);
  return inv;
}

TEST(OwnedPlacement, PlanRunsOwnedMatricesLocalWithZeroBytes) {
  PlanOptions o;
  const Plan owned = make_plan(one_matrix("dp_replicate=2,dp_shard=3", {Placement::owned(1), Placement::owned(2)}), o);
  ASSERT_EQ(owned.entries().size(), 1u);
  EXPECT_EQ(owned.entries()[0].strategy, Strategy::Local);
  EXPECT_EQ(owned.total().bytes_sent_max, 0);
  EXPECT_EQ(owned.total().bytes_recv_max, 0);
  EXPECT_EQ(owned.total().collectives, 0);
  // the whole matrix's flops on one rank of six
  EXPECT_GT(owned.total().flops_max, 0);
  EXPECT_NEAR(owned.total().flops_mean * 6, owned.total().flops_max, owned.total().flops_max * 1e-9);
  // the owner is part of the fingerprint (ranks that disagree on it are caught)
  const Plan other = make_plan(one_matrix("dp_replicate=2,dp_shard=3", {Placement::owned(0), Placement::owned(2)}), o);
  EXPECT_NE(owned.fingerprint(), other.fingerprint());
  // negative control: the same matrix Shard(0) rows moves bytes in the step
  const Plan sharded = make_plan(one_matrix("dp_replicate=2,dp_shard=3", {Placement::replicate(), Placement::shard(0)}), o);
  EXPECT_NE(sharded.entries()[0].strategy, Strategy::Local);
  EXPECT_GT(sharded.total().bytes_sent_max, 0);
}

TEST(OwnerPlacement, LayerNames) {
  EXPECT_EQ(detail::layer_of("layers.3.attn.wq"), "layers.3");
  EXPECT_EQ(detail::layer_of("model.layers.12.mlp.w1"), "model.layers.12");
  EXPECT_EQ(detail::layer_of("wte"), "");
  EXPECT_EQ(detail::layer_of("head.proj"), "head");
}

TEST(OwnerPlacement, LptBalancesAndSpreadsALayer) {
  // 3 layers x 4 equal matrices on 4 ranks: every rank gets one matrix of every layer
  std::vector<ParamSpec> ps;
  for (int l = 0; l < 3; ++l)
    for (const char* w : {"q", "k", "v", "o"}) ps.push_back(matrix("layers." + std::to_string(l) + "." + w, 32, 32));
  ps.push_back(matrix("norm", 32, 1, Role::AdamW));
  std::vector<bool> owned(ps.size(), true);
  owned.back() = false;
  const std::vector<int> own = detail::choose_owners(ps, owned, 4);
  EXPECT_EQ(own.back(), -1);
  std::vector<int> count(4, 0);
  for (int l = 0; l < 3; ++l) {
    std::set<int> ranks;
    for (int k = 0; k < 4; ++k) ranks.insert(own[static_cast<size_t>(l * 4 + k)]);
    EXPECT_EQ(ranks.size(), 4u) << "layer " << l << " has two matrices on one rank";
  }
  for (size_t i = 0; i + 1 < ps.size(); ++i) ++count[static_cast<size_t>(own[i])];
  for (int c : count) EXPECT_EQ(c, 3);
  EXPECT_EQ(own, detail::choose_owners(ps, owned, 4));  // deterministic
  // longest first: one big matrix and four small ones on 2 ranks -> the big one alone
  std::vector<ParamSpec> mixed{matrix("a.w", 8, 8), matrix("b.w", 8, 8), matrix("big.w", 64, 64), matrix("c.w", 8, 8), matrix("d.w", 8, 8)};
  const std::vector<int> m2 = detail::choose_owners(mixed, std::vector<bool>(5, true), 2);
  for (size_t i = 0; i < 5; ++i)
    if (i != 2) EXPECT_NE(m2[i], m2[2]) << mixed[i].name;
}

TEST(OwnerPlacement, CostTermsAndChoice) {
  PlanOptions o;  // h100
  detail::PlacementInputs in;
  in.R = 2, in.S = 8, in.rows = 4096, in.cols = 4096;
  const detail::PlacementCost own = detail::owner_placement_cost(in, o.machine, o.ns);
  const detail::PlacementCost sh = detail::sharded_placement_cost(in, o.machine, o.ns);
  EXPECT_EQ(own.step_bytes, 0);
  EXPECT_GT(sh.step_bytes, 0);
  EXPECT_DOUBLE_EQ(own.peak_bytes, 4096.0 * 4096 * 4 * 2);
  EXPECT_DOUBLE_EQ(sh.peak_bytes, 512.0 * 4096 * 4 * 2);
  EXPECT_GT(own.fwd_bwd_bytes, sh.fwd_bwd_bytes);  // the reduce to the owner is heavier than a reduce-scatter
  EXPECT_LT(own.step_flops, sh.step_flops);        // HSDP: once in the mesh, not once per replica
  // scatter_gather (meshmuon.torch.own): the owner's link carries ~2 (N-1)/N of a gradient, not
  // (S-1) + (R-1) of them; the broadcast and everything else unchanged
  detail::PlacementInputs sg = in;
  sg.scatter_gather_reduce = true;
  const detail::PlacementCost own_sg = detail::owner_placement_cost(sg, o.machine, o.ns);
  const double P = 4096.0 * 4096 * 4;
  EXPECT_DOUBLE_EQ(own.fwd_bwd_bytes, P + 7 * P + 1 * P);
  EXPECT_DOUBLE_EQ(own_sg.fwd_bwd_bytes, P + 2.0 * 15 / 16 * P);
  EXPECT_LT(own_sg.seconds, own.seconds);
  EXPECT_EQ(own_sg.step_flops, own.step_flops);
  // the public entry point passes it through (and checks its mesh sizes)
  const std::vector<ParamSpec> one{matrix("layers.0.w", 4096, 4096)};
  const auto star = choose_owner_placement(one, 2, 8, o, "owner", 0.8, false);
  const auto two = choose_owner_placement(one, 2, 8, o, "owner", 0.8, true);
  EXPECT_TRUE(star[0].owned && two[0].owned);
  EXPECT_DOUBLE_EQ(star[0].owner_seconds, own.seconds);
  EXPECT_DOUBLE_EQ(two[0].owner_seconds, own_sg.seconds);
  EXPECT_THROW(choose_owner_placement(one, 0, 8, o, "owner"), std::invalid_argument);
  // no overlap given: the profile's fwd_bwd_overlap (measured ~0 on `cpu`, 0.8 assumed on the GPUs)
  EXPECT_DOUBLE_EQ(o.machine.fwd_bwd_overlap, 0.8);
  EXPECT_DOUBLE_EQ(choose_owner_placement(one, 2, 8, o, "owner", -1, true)[0].owner_seconds, own_sg.seconds);
  PlanOptions cpu;
  cpu.machine = MachineProfile::named("cpu");
  EXPECT_LT(cpu.machine.fwd_bwd_overlap, 0.1);
  const double profile_s = choose_owner_placement(one, 1, 4, cpu, "auto")[0].owner_seconds;
  EXPECT_DOUBLE_EQ(profile_s, choose_owner_placement(one, 1, 4, cpu, "auto", cpu.machine.fwd_bwd_overlap)[0].owner_seconds);
  EXPECT_LT(choose_owner_placement(one, 1, 4, cpu, "auto", 0.8)[0].owner_seconds, profile_s);
  EXPECT_DOUBLE_EQ(MachineProfile::from_json(R"({"fwd_bwd_overlap": 0.5})").fwd_bwd_overlap, 0.5);
  EXPECT_DOUBLE_EQ(MachineProfile::from_json(cpu.machine.to_json()).fwd_bwd_overlap, cpu.machine.fwd_bwd_overlap);
  EXPECT_THROW(MachineProfile::from_json(R"({"fwd_bwd_overlap": 2})"), std::invalid_argument);
  // a communication fit of the mesh's world size replaces the scalars (as in predict_step); others not
  PlanOptions fitted = cpu;
  fitted.machine.comm_fits = {{4, 1e6, 1.0}, {8, 1e12, 0.0}};
  const double slow = choose_owner_placement(one, 1, 4, fitted, "auto")[0].owner_seconds;
  EXPECT_GT(slow, profile_s + 0.9);  // ≥ one 1 s latency step exposed
  PlanOptions nofit = cpu;
  nofit.machine.comm_fits.clear();
  fitted.machine.comm_fits = {{8, 1e6, 1.0}};  // another world size: the scalars
  EXPECT_DOUBLE_EQ(choose_owner_placement(one, 1, 4, fitted, "auto")[0].owner_seconds,
                   choose_owner_placement(one, 1, 4, nofit, "auto")[0].owner_seconds);
  // choices: AdamW and expert stacks never owned; Owner owns every eligible matrix; one rank: sharded
  std::vector<ParamSpec> ps{matrix("layers.0.w", 256, 256), matrix("bias", 256, 1, Role::AdamW)};
  ParamSpec ex;
  ex.name = "layers.0.experts", ex.shape = Shape{4, 16, 16}, ex.expert = true;
  ps.push_back(ex);
  const auto all = detail::choose_placements(ps, 2, 2, o, detail::PlacementMode::Owner);
  EXPECT_TRUE(all[0].owned);
  EXPECT_FALSE(all[1].owned || all[1].eligible);
  EXPECT_FALSE(all[2].owned || all[2].eligible);
  EXPECT_FALSE(all[0].why.empty());
  for (const auto& c : detail::choose_placements(ps, 1, 1, o, detail::PlacementMode::Auto)) EXPECT_FALSE(c.owned);
  const auto none = detail::choose_placements(ps, 2, 2, o, detail::PlacementMode::Sharded);
  // per-rank bytes: the same total either way; owned: the whole matrix (+ momentum) on its owner
  const std::vector<double> b_own = detail::placement_bytes_per_rank(ps, 2, 2, all);
  const std::vector<double> b_sh = detail::placement_bytes_per_rank(ps, 2, 2, none);
  const double replicas_of_matrix = 256.0 * 256 * 4 * 2 * (2 - 1);  // sharded rows exist once per replica
  EXPECT_DOUBLE_EQ(std::accumulate(b_sh.begin(), b_sh.end(), 0.0) - std::accumulate(b_own.begin(), b_own.end(), 0.0),
                   replicas_of_matrix);
  EXPECT_GE(b_own[static_cast<size_t>(all[0].owner)], 256.0 * 256 * 4 * 2);
  // apply_placements: the owned matrix gets [Owned(r), Owned(s)] and the plan runs it local
  Inventory inv;
  inv.model = "m";
  inv.mesh_names = {"dense"};
  inv.meshes = {Mesh::parse("dp_replicate=2,dp_shard=2")};
  for (ParamSpec p : ps) {
    p.placements = {Placement::replicate(), Placement::shard(0)};
    inv.params.push_back(p);
  }
  const Inventory placed = detail::apply_placements(inv, all);
  EXPECT_EQ(placed.params[0].placements[0], Placement::owned(all[0].owner / 2));
  EXPECT_EQ(placed.params[0].placements[1], Placement::owned(all[0].owner % 2));
  EXPECT_EQ(placed.params[1].placements, inv.params[1].placements);
  EXPECT_EQ(make_plan(placed, o).entry_of(0)->strategy, Strategy::Local);
  EXPECT_THROW(detail::parse_placement_mode("everywhere"), std::invalid_argument);
}

}  // namespace
}  // namespace meshmuon
