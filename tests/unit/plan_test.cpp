// Planner: determinism, fingerprint sensitivity, owner balance, precedence (pin > env > cost),
// strategy applicability, per-rank bytes against closed forms, chunks. Run: build/bin/plan_test
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <map>

#include "meshmuon/plan.h"
#include "plan/shard_table.h"
#include "plan/transfers.h"

namespace meshmuon {
namespace {

// n matrices [rows, cols] sharded Shard(0) over `mesh` (FSDP), plus one replicated 2-D matrix.
Inventory fsdp_model(const std::string& mesh_text, int n, int64_t rows, int64_t cols) {
  Inventory inv;
  inv.model = "synthetic";
  inv.mesh_names = {"dense"};
  inv.meshes = {Mesh::parse(mesh_text)};
  const int nd = inv.meshes[0].ndim();
  for (int i = 0; i < n; ++i) {
    ParamSpec p;
    p.name = "layers." + std::to_string(i) + ".w";
    p.shape = Shape{rows + (i % 3), cols};  // comparable, not identical
    p.placements.assign(static_cast<size_t>(nd), Placement::replicate());
    p.placements.back() = Placement::shard(0);
    inv.params.push_back(p);
  }
  ParamSpec r;
  r.name = "router";
  r.shape = Shape{8, 16};
  r.placements.assign(static_cast<size_t>(nd), Placement::replicate());
  inv.params.push_back(r);
  return inv;
}

TEST(Strategy, NamesRulesAndGlobs) {
  for (int i = 0; i < kNumStrategies; ++i)
    EXPECT_EQ(parse_strategy(to_string(static_cast<Strategy>(i))), static_cast<Strategy>(i));
  EXPECT_THROW(parse_strategy("zero2"), std::invalid_argument);
  const StrategyRules r = StrategyRules::parse("default:owner_a2a;*.experts.*:expert_local");
  EXPECT_EQ(r.match("layers.3.moe.experts.w1"), Strategy::ExpertLocal);
  EXPECT_EQ(r.match("layers.3.moe.shared_experts.w1.weight"), Strategy::OwnerA2A);
  EXPECT_EQ(StrategyRules::parse(r.to_string()).to_string(), r.to_string());
  EXPECT_TRUE(glob_match("a?c*", "abcdef"));
  EXPECT_FALSE(glob_match("a?c", "abcd"));
  EXPECT_THROW(StrategyRules::parse("owner_a2a"), std::invalid_argument);
  EXPECT_THROW(StrategyRules::parse("default:nope"), std::invalid_argument);
}

TEST(Plan, IdenticalAcrossCallsAndConstructionOrder) {
  const Inventory a = fsdp_model("dp=8", 20, 64, 48);
  PlanOptions o;
  const Plan p1 = make_plan(a, o), p2 = make_plan(a, o);
  EXPECT_EQ(p1.fingerprint(), p2.fingerprint());
  EXPECT_EQ(p1.to_json(), p2.to_json());
  // the same inventory built another way (mesh from its constructor, params appended in a loop copy)
  Inventory b;
  b.model = a.model;
  b.mesh_names = a.mesh_names;
  b.meshes = {Mesh(std::vector<MeshDim>{{"dp", 8}})};
  for (const ParamSpec& p : a.params) b.params.push_back(p);
  PlanOptions o2;
  o2.window = 2;
  o2.chunk_bytes = o.chunk_bytes;
  EXPECT_EQ(make_plan(b, o2).fingerprint(), p1.fingerprint());
}

TEST(Plan, FingerprintChangesWithEveryAgreedInput) {
  const Inventory base = fsdp_model("dp=4", 6, 32, 16);
  const PlanOptions o;
  const uint64_t fp = make_plan(base, o).fingerprint();
  std::vector<std::pair<std::string, Inventory>> inv_changes;
  auto add = [&](const std::string& what, auto&& mutate) {
    Inventory c = base;
    mutate(c);
    inv_changes.emplace_back(what, c);
  };
  add("shape", [](Inventory& c) { c.params[2].shape = Shape{33, 17}; });
  add("dtype", [](Inventory& c) { c.params[2].dtype = DType::BF16; });
  add("name", [](Inventory& c) { c.params[2].name = "other"; });
  add("role", [](Inventory& c) { c.params[2].role = Role::AdamW; });
  add("placement", [](Inventory& c) { c.params[2].placements[0] = Placement::shard(1); });
  add("qk", [](Inventory& c) { c.params[0].qk = QkTag{0, QkKind::Q, 2, 16, 0, 0}; });
  add("mesh", [](Inventory& c) { c.meshes[0] = Mesh::parse("fsdp=4"); });
  add("order", [](Inventory& c) { std::swap(c.params[0], c.params[1]); });
  for (const auto& [what, inv] : inv_changes) EXPECT_NE(make_plan(inv, o).fingerprint(), fp) << what;
  std::vector<std::pair<std::string, PlanOptions>> opt_changes;
  PlanOptions x = o;
  x.comm_dtype = DType::BF16;
  opt_changes.emplace_back("comm dtype", x);
  x = o;
  x.ns.steps = 6;
  opt_changes.emplace_back("ns steps", x);
  x = o;
  x.chunk_bytes = 4096;
  opt_changes.emplace_back("chunk bytes", x);
  x = o;
  x.normuon.assign(base.params.size(), true);
  opt_changes.emplace_back("normuon", x);
  x = o;
  x.pins = StrategyRules::parse("default:allgather");
  opt_changes.emplace_back("pins", x);
  for (const auto& [what, opt] : opt_changes) EXPECT_NE(make_plan(base, opt).fingerprint(), fp) << what;
  // negative control: an option the ranks need not agree on (the machine's name) leaves it alone
  x = o;
  x.machine.name = "renamed";
  EXPECT_EQ(make_plan(base, x).fingerprint(), fp);
}

class Balance : public ::testing::TestWithParam<int> {};

TEST_P(Balance, OwnerFlopsWithinTenPercentAtFourMatricesPerRank) {
  const int ranks = GetParam();
  const Inventory inv = fsdp_model("dp=" + std::to_string(ranks), 4 * ranks, 96, 80);
  PlanOptions o;
  o.chunk_bytes = int64_t{1} << 40;  // one chunk: balance over the whole model
  const Plan plan = make_plan(inv, o);
  const CostSummary& s = plan.by_strategy(Strategy::OwnerA2A);
  ASSERT_EQ(s.params, 4 * ranks);
  EXPECT_LE(s.flops_max / s.flops_mean, 1.1) << ranks;
}
INSTANTIATE_TEST_SUITE_P(Ranks, Balance, ::testing::Values(2, 3, 7, 16, 64));

TEST(Plan, BalanceCheckCanFail) {
  // negative control: fewer matrices than ranks cannot be balanced
  const Inventory inv = fsdp_model("dp=16", 5, 96, 80);
  const Plan plan = make_plan(inv, PlanOptions{});
  const CostSummary& s = plan.by_strategy(Strategy::OwnerA2A);
  EXPECT_GT(s.flops_max / s.flops_mean, 1.1);
}

TEST(Plan, CostModelChoicesAndOwnerBytesMatchClosedForm) {
  const int g = 8;
  const int64_t rows = 64, cols = 40;  // 64 rows over 8 ranks: even shards of 8 rows
  Inventory inv = fsdp_model("dp=8", 1, rows, cols);
  const Plan plan = make_plan(inv, PlanOptions{});
  ASSERT_EQ(plan.entries().size(), 2u);
  EXPECT_EQ(plan.entries()[0].strategy, Strategy::OwnerA2A);
  EXPECT_EQ(plan.entries()[1].strategy, Strategy::Local);  // replicated router
  // owner_a2a: the owner receives P·(g−1)/g and sends it back; the others send and receive P/g.
  const double P = static_cast<double>(rows * cols * 4), shard = P / g;
  const CostSummary& s = plan.by_strategy(Strategy::OwnerA2A);
  EXPECT_DOUBLE_EQ(s.bytes_recv_max, P - shard);
  EXPECT_DOUBLE_EQ(s.bytes_sent_mean, (P - shard + (g - 1) * shard) / g);
  const PlanEntry& e = plan.entries()[0];
  const int owner = plan.owner_rank(e, 0, 5);
  EXPECT_EQ(s.flops_max, e.unit_flops);
  EXPECT_EQ(e.unit_flops, ns_flops(rows, cols, PlanOptions{}.ns));
  EXPECT_GE(owner, 0);
  EXPECT_LT(owner, g);
  EXPECT_THROW(plan.owner_rank(plan.entries()[1], 0, 0), std::invalid_argument);
  EXPECT_EQ(plan.local_box(0, 7).dims[0].ranges()[0], (Range{56, 64}));
}

TEST(Plan, ExpertStacksAndReplicas) {
  const Inventory q = apply_parallel(preset_model("qwen3-30b-a3b"), parse_parallel("dp_replicate=2,dp_shard=4,ep=4"));
  // A machine whose compute is cheap next to its links (50 GB/s, 400 TFLOP/s): whole local experts
  // stay local. (On the h100 profile's fp32 rate, 50 TFLOP/s against 370 GB/s NVLink, spreading
  // the replicas' duplicate expert work over owners is predicted faster.)
  PlanOptions base;
  base.machine = MachineProfile{"test", 50e9, 50e9, 20e-6, 400e12, 0};
  const Plan plan = make_plan(q, base);
  int experts = 0;
  for (const PlanEntry& e : plan.entries()) {
    const ParamSpec& p = q.params[static_cast<size_t>(e.param)];
    if (p.expert) {
      EXPECT_EQ(e.strategy, Strategy::ExpertLocal) << p.name;
      ++experts;
    }
  }
  EXPECT_EQ(experts, 48 * 3);
  // split over replicas: owners live in every replica group, and each rank's owner is consistent
  PlanOptions o = base;
  o.replica = ReplicaMode::Split;
  const Plan split = make_plan(q, o);
  int wq_index = 0;
  while (q.params[static_cast<size_t>(wq_index)].name != "layers.0.attention.wq.weight") ++wq_index;
  const PlanEntry* wq = split.entry_of(wq_index);
  ASSERT_NE(wq, nullptr);
  ASSERT_TRUE(wq->replica_split);
  EXPECT_EQ(split.owner_rank(*wq, 0, 0), split.owner_rank(*wq, 0, 7));
  EXPECT_EQ(split.entry_of(0), nullptr);  // the embedding is AdamW
  // duplicate: every replica group has its own owner
  o.replica = ReplicaMode::Duplicate;
  const Plan dup = make_plan(q, o);
  EXPECT_NE(dup.owner_rank(*dup.entry_of(wq_index), 0, 0), dup.owner_rank(*dup.entry_of(wq_index), 0, 7));
}

TEST(Plan, PinBeatsEnvBeatsCost) {
  const Inventory inv = fsdp_model("dp=4", 3, 16, 12);
  PlanOptions o;
  o.env_override = StrategyRules::parse("default:allgather;layers.1.*:agrs");
  o.pins = StrategyRules::parse("layers.0.*:gram_allreduce");  // Shard(0) of a tall matrix: long dim
  const Plan plan = make_plan(inv, o);
  EXPECT_EQ(plan.entries()[0].strategy, Strategy::GramAllReduce);
  EXPECT_EQ(plan.entries()[0].decision, Decision::Pin);
  EXPECT_EQ(plan.entries()[1].strategy, Strategy::Agrs);
  EXPECT_EQ(plan.entries()[1].decision, Decision::Env);
  EXPECT_EQ(plan.entries()[2].strategy, Strategy::AllGather);
  // `default:allgather` cannot run the replicated router: the cost model takes it
  EXPECT_EQ(plan.entries()[3].strategy, Strategy::Local);
  EXPECT_EQ(plan.entries()[3].decision, Decision::Fallback);
  // a pattern that names a parameter with a strategy that cannot run it is an error naming it
  o.pins = StrategyRules::parse("router:owner_a2a");
  try {
    make_plan(inv, o);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'router'"), std::string::npos) << e.what();
  }
}

TEST(Plan, ChunksCoverEntriesInOrderUnderTheCap) {
  const Inventory inv = fsdp_model("dp=4", 12, 64, 64);
  PlanOptions o;
  o.chunk_bytes = 64 * 64 * 8;  // mean buffer per rank of about two owner_a2a entries
  const Plan plan = make_plan(inv, o);
  ASSERT_GT(plan.chunks().size(), 2u);
  int next = 0;
  for (size_t c = 0; c < plan.chunks().size(); ++c) {
    const Chunk& ch = plan.chunks()[c];
    EXPECT_EQ(ch.first_entry, next);
    EXPECT_GT(ch.end_entry, ch.first_entry);
    for (int e = ch.first_entry; e < ch.end_entry; ++e) EXPECT_EQ(plan.entries()[static_cast<size_t>(e)].chunk, static_cast<int>(c));
    next = ch.end_entry;
  }
  EXPECT_EQ(next, static_cast<int>(plan.entries().size()));
  o.chunk_bytes = int64_t{1} << 40;
  EXPECT_EQ(make_plan(inv, o).chunks().size(), 1u);
}

TEST(Plan, BadOptionsAndPresetsPlanAtScale) {
  const Inventory inv = fsdp_model("dp=4", 2, 8, 8);
  PlanOptions o;
  o.chunk_bytes = 0;
  EXPECT_THROW(make_plan(inv, o), std::invalid_argument);
  o = PlanOptions{};
  o.window = 0;
  EXPECT_THROW(make_plan(inv, o), std::invalid_argument);
  EXPECT_THROW(MachineProfile::from_json(R"J({"bandwith_Bps": 1})J"), std::invalid_argument);
  EXPECT_EQ(MachineProfile::from_json(R"J({"flops_per_s": 1e12})J").flops_per_s, 1e12);
  // every preset plans on an HSDP + TP mesh, and baselines run
  for (const std::string& name : preset_names()) {
    const ParallelConfig c = parse_parallel(name == "gpt2-124m" ? "dp_replicate=2,dp_shard=2" : "dp_replicate=2,dp_shard=4,tp=2");
    const Inventory m = apply_parallel(preset_model(name), c);
    const Plan plan = make_plan(m, PlanOptions{});
    EXPECT_GT(plan.total().predicted_seconds, 0) << name;
    const Strategy peers[] = {Strategy::OwnerA2A, Strategy::AllGather};
    const auto b = plan_baselines(m, PlanOptions{}, peers);
    EXPECT_GE(b[1].total.bytes_sent_max, b[0].total.bytes_sent_max) << name;
  }
}

}  // namespace
TEST(Plan, NormuonStateBytesAddFp32RowStatePerHolder) {
  // 6 matrices [32, 16] (per-row state [32, 1]) FSDP over 4 ranks, owner_a2a: per matrix, the 3
  // non-owners send their 8 rows of data (8x16 fp32) and of state (8 fp32) to the owner and get them back.
  Inventory inv = fsdp_model("dp=4", 6, 32, 16);
  for (ParamSpec& p : inv.params) p.shape = Shape{32, 16};
  PlanOptions o;
  o.pins = StrategyRules::parse("default:owner_a2a");
  const double data = make_plan(inv, o).total().bytes_sent_mean * 4;
  o.normuon.assign(inv.params.size(), true);
  const double with_state = make_plan(inv, o).total().bytes_sent_mean * 4;
  EXPECT_DOUBLE_EQ(data, 6 * 2 * 3 * (8 * 16 * 4.0));
  EXPECT_DOUBLE_EQ(with_state - data, 6 * 2 * 3 * (8 * 4.0));
}

// owner_a2a's transfers come as stars (plan/transfers.h): the accounting sums bytes_of(Star), the
// executor gets the star's messages (for_each_message). Every rank's every byte field must receive
// the same additions in the same order from both, so the figures are equal bit for bit.
TEST(Plan, OwnerStarBytesEqualTheirMessagesBitForBit) {
  const Inventory q = apply_parallel(preset_model("qwen3-30b-a3b"), parse_parallel("dp_replicate=2,dp_shard=8,ep=4"));
  detail::ShardTables tables(q);
  using Fields = std::array<double, 4>;
  const auto into = [](std::map<int, Fields>& m) {
    return [&m](int r, double s, double rv, double sr, double rr) {
      Fields& f = m[r];
      f[0] += s, f[1] += rv, f[2] += sr, f[3] += rr;
    };
  };
  int stars = 0, with_messages = 0;
  for (int i = 0; i < static_cast<int>(q.params.size()); ++i) {
    if (q.params[static_cast<size_t>(i)].role != Role::Muon) continue;
    const detail::ShardTable& t = tables.get(i);
    const detail::ShardTable* states[] = {nullptr, &tables.get_state(i)};
    for (const detail::ShardTable* vt : states)
      for (int64_t u = 0; u < std::min<int64_t>(t.units, 5); ++u) {
        const int64_t h0 = t.holder_offsets[static_cast<size_t>(u)];
        const int o_k = h0 < t.holder_offsets[static_cast<size_t>(u) + 1] ? t.holders[static_cast<size_t>(h0)] : 0;
        const int j = t.r - 1, o = t.rank(0, o_k);
        // as for_each_transfer lists them: in and out (duplicate), the split's gather and its scatter
        // to another replica group (cross) and to the owner's own
        const detail::Star cases[] = {{true, true, false, u, 0, o, o_k, &t, vt},
                                      {true, false, false, u, 0, o, o_k, &t, vt},
                                      {false, true, j != 0, u, j, o, j != 0 ? -1 : o_k, &t, vt},
                                      {false, true, false, u, 0, o, o_k, &t, vt}};
        for (const detail::Star& x : cases)
          for (size_t elem : {size_t{2}, size_t{4}}) {
            std::map<int, Fields> star, messages;
            const bool any = detail::bytes_of(x, elem, into(star));
            bool listed = false;
            detail::for_each_message(x, [&](const detail::P2pTransfer& m) {
              listed = true;
              detail::bytes_of(m, elem, into(messages));
            });
            EXPECT_EQ(any, listed) << q.params[static_cast<size_t>(i)].name << " unit " << u;
            EXPECT_EQ(star, messages) << q.params[static_cast<size_t>(i)].name << " unit " << u;
            ++stars, with_messages += listed;
          }
      }
  }
  EXPECT_GT(with_messages, 100);
  EXPECT_LT(with_messages, stars);  // some stars have no other holder
}

// Per-rank bytes of a transfer list with no star(): owner stars arrive as their messages.
struct Messages {
  static constexpr bool kAssemblies = false;
  std::vector<double>& sent;
  std::vector<double>& recv;
  size_t elem;
  void add(int r, double s, double rv, double, double) {
    sent[static_cast<size_t>(r)] += s;
    recv[static_cast<size_t>(r)] += rv;
  }
  void p2p(const detail::P2pTransfer& x) { detail::bytes_of(x, elem, [&](auto... a) { add(a...); }); }
  void group(const detail::GroupTransfer& x) { detail::bytes_of(x, elem, [&](auto... a) { add(a...); }); }
  void exchange(const detail::Exchange& x) { detail::bytes_of(x, elem, [&](auto... a) { add(a...); }); }
};

// The plan's byte figures are the sums of its transfer list taken message by message (the
// executor's view: stars expanded), per strategy and in total, for every strategy and option that
// changes what moves.
TEST(Plan, ByteFiguresEqualTheTransferListMessageByMessage) {
  const auto max_mean = [](const std::vector<double>& v) {
    double mx = 0, sum = 0;
    for (double x : v) mx = std::max(mx, x), sum += x;
    return std::pair{mx, sum / static_cast<double>(v.size())};
  };
  const Inventory invs[] = {
      apply_parallel(preset_model("qwen3-30b-a3b"), parse_parallel("dp_replicate=2,dp_shard=8,ep=4")),
      apply_parallel(preset_model("llama3-8b"), parse_parallel("dp_replicate=3,dp_shard=4,tp=2")),
      apply_parallel(preset_model("deepseek-v3"), parse_parallel("dp_shard=64,ep=16")),
      apply_parallel(preset_model("deepseek-v3"), parse_parallel("dp_replicate=2,dp_shard=8,tp=2,ep=4"))};
  const char* pins[] = {"", "default:owner_a2a", "default:agrs;*.experts.*:expert_subgroup", "default:allgather",
                        "default:gram_allreduce"};
  int plans = 0;
  for (const Inventory& inv : invs)
    for (const char* pin : pins)
      for (int variant = 0; variant < 4; ++variant) {
        // 0, 1: NorMuon state (split, duplicate); 2, 3: none (owner_a2a accounted by arithmetic)
        PlanOptions o;
        o.pins = StrategyRules::parse(pin);
        o.replica = variant == 1 || variant == 3 ? ReplicaMode::Duplicate : ReplicaMode::Split;
        if (variant < 2) o.normuon.assign(inv.params.size(), true);
        if (variant == 2) o.comm_dtype = DType::BF16, o.chunk_bytes = int64_t{32} << 20;
        Plan plan;
        try {
          plan = make_plan(inv, o);
        } catch (const std::invalid_argument&) {
          continue;  // a pin the model cannot run everywhere
        }
        ++plans;
        detail::ShardTables tables(inv);
        const size_t w = static_cast<size_t>(inv.world_size());
        std::vector<double> sent(w), recv(w);
        std::array<std::vector<double>, kNumStrategies> s_sent, s_recv;
        for (auto& v : s_sent) v.assign(w, 0);
        for (auto& v : s_recv) v.assign(w, 0);
        for (const PlanEntry& e : plan.entries()) {
          const size_t s = static_cast<size_t>(e.strategy);
          const detail::ShardTable* vt = o.normuon.empty() || !o.normuon[static_cast<size_t>(e.param)]
                                             ? nullptr
                                             : &tables.get_state(e.param);
          detail::for_each_transfer(e, tables.get(e.param), vt, inv.params[static_cast<size_t>(e.param)], o.ns.steps,
                                    Messages{s_sent[s], s_recv[s], dtype_size(o.comm_dtype)});
        }
        for (size_t r = 0; r < w; ++r)
          for (int s = 0; s < kNumStrategies; ++s) sent[r] += s_sent[static_cast<size_t>(s)][r], recv[r] += s_recv[static_cast<size_t>(s)][r];
        const auto check = [&](const CostSummary& c, const std::vector<double>& sv, const std::vector<double>& rv,
                               const std::string& what) {
          const auto [smax, smean] = max_mean(sv);
          const auto [rmax, rmean] = max_mean(rv);
          EXPECT_EQ(c.bytes_sent_max, smax) << what;
          EXPECT_EQ(c.bytes_sent_mean, smean) << what;
          EXPECT_EQ(c.bytes_recv_max, rmax) << what;
          EXPECT_EQ(c.bytes_recv_mean, rmean) << what;
        };
        const std::string label = inv.model + " " + pin + " variant " + std::to_string(variant);
        check(plan.total(), sent, recv, label);
        for (int s = 0; s < kNumStrategies; ++s)
          if (plan.by_strategy(static_cast<Strategy>(s)).params > 0)
            check(plan.by_strategy(static_cast<Strategy>(s)), s_sent[static_cast<size_t>(s)], s_recv[static_cast<size_t>(s)],
                  label + " " + std::string(to_string(static_cast<Strategy>(s))));
      }
  EXPECT_GE(plans, 50);
}

// A 4-D mesh (replicas, shards, tensor parallel, expert parallel): the plan equals, bit for bit,
// the one the planner made before owner_a2a was accounted by arithmetic and the owner search used
// cursors (fingerprints and totals printed by that build, commit 111275f, `meshmuon plan --json`).
// Correctness only: planning time is measured by `meshmuon bench plan --grid`, not here.
TEST(Plan, FourDimensionalMeshMatchesThePreviousPlanner) {
  const Inventory inv = apply_parallel(preset_model("deepseek-v3"), parse_parallel("dp_replicate=2,dp_shard=32,tp=2,ep=8"));
  struct Expected {
    ReplicaMode mode;
    uint64_t fingerprint;
    double sent_max, sent_mean, flops_max, flops_mean, peak, seconds;
    int owner_a2a;
  };
  const Expected cases[] = {
      {ReplicaMode::Duplicate, 0x8cf82f39618445beULL, 2957336576.0, 1975024128.0, 374324237434880.0, 362716707102720.0,
       3157041152.0, 19.647279791068023, 488},
      {ReplicaMode::Split, 0x5f46a7abc47328beULL, 22834937856.0, 21897616000.0, 187931662745600.0, 181211372636160.0,
       2246860800.0, 18.02722233943371, 662}};
  for (const Expected& x : cases) {
    PlanOptions o;
    o.replica = x.mode;
    const Plan plan = make_plan(inv, o);
    const std::string what(to_string(x.mode));
    EXPECT_EQ(plan.fingerprint(), x.fingerprint) << what;
    EXPECT_EQ(plan.total().bytes_sent_max, x.sent_max) << what;
    EXPECT_EQ(plan.total().bytes_sent_mean, x.sent_mean) << what;
    EXPECT_EQ(plan.total().flops_max, x.flops_max) << what;
    EXPECT_EQ(plan.total().flops_mean, x.flops_mean) << what;
    EXPECT_EQ(plan.total().peak_buffer_bytes_max, x.peak) << what;
    EXPECT_EQ(plan.total().predicted_seconds, x.seconds) << what;
    EXPECT_EQ(plan.strategy_counts()[static_cast<size_t>(Strategy::OwnerA2A)], x.owner_a2a) << what;
  }
}

}  // namespace meshmuon
