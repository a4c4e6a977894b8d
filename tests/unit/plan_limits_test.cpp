// Planner limits: sizes from user input that overflow 64-bit arithmetic are refused with errors that
// name the parameter and the limit (JSON loader, layout, cost model), a fuzz over huge and boundary
// shapes, world-size limits and parse errors, and planning cost that grows O(world), not O(world²).
// Run: build/bin/plan_limits_test
#include <gtest/gtest.h>

#include <chrono>
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "meshmuon/comm.h"
#include "meshmuon/plan.h"
#include "plan/visit.h"
#include "test_support.h"

namespace meshmuon {
namespace {

using test::expect_invalid;

std::string model_json(const std::string& params) { return R"J({"model": "m", "params": [)J" + params + "]}"; }

using test::error_of;

// The issue's three shapes: before, they planned with 0 or negative element counts and bytes.
TEST(PlanLimits, OverflowingShapesAreRefusedNamingParameterAndLimit) {
  const ParallelConfig four = parse_parallel("dp_shard=4");
  for (const char* shape : {"[4611686018427387904, 8]", "[4294967296, 2147483648]", "[1099511627776, 1099511627776]"}) {
    const std::string text = model_json(std::string(R"J({"name": "w", "role": "muon", "shape": )J") + shape + "}");
    const std::string msg = error_of([&] { make_plan(load_inventory_json(text, &four), PlanOptions{}); });
    EXPECT_NE(msg.find("'w'"), std::string::npos) << shape << ": " << msg;
    EXPECT_NE(msg.find("2^60"), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("[inventory]", 0), 0u) << msg;
  }
  // the exact count is quoted, even past int64
  const std::string msg = error_of([&] {
    load_inventory_json(model_json(R"J({"name": "w", "role": "muon", "shape": [1099511627776, 1099511627776]})J"), &four);
  });
  EXPECT_NE(msg.find("1208925819614629174706176 elements"), std::string::npos) << msg;
  // a huge extent is refused even when another extent is 0; extents past uint64 are a JSON error
  expect_invalid([&] { load_inventory_json(model_json(R"J({"name": "z", "role": "adamw", "shape": [9223372036854775807, 0]})J"), &four); },
                 "'z'", "[inventory]");
  expect_invalid([&] { load_inventory_json(model_json(R"J({"name": "u", "role": "adamw", "shape": [18446744073709551615]})J"), &four); },
                 "'u'", "[inventory]");
  // expert stacks: at most 2^20 experts; the model's total is bounded too
  expect_invalid([&] {
    load_inventory_json(model_json(R"J({"name": "e", "role": "muon", "expert": true, "shape": [1099511627776, 1, 1]})J"), &four);
  }, "2^20", "[inventory]");
  std::string many;
  for (int i = 0; i < 5; ++i) many += std::string(i ? "," : "") + R"J({"name": "a)J" + std::to_string(i) + R"J(", "role": "adamw", "shape": [1073741824, 268435456]})J";
  expect_invalid([&] { load_inventory_json(model_json(many), &four); }, "'a4'", "[inventory]");
  // QK tag integers that do not fit 32 bits
  expect_invalid([&] {
    load_inventory_json(model_json(R"J({"name": "q", "role": "muon", "shape": [8, 8], "qk": {"layer": 0, "kind": "q", "heads": 4294967298, "head_dim": 4}})J"), &four);
  }, "32-bit", "[inventory]");
}

TEST(PlanLimits, LayoutArithmeticIsExactNearInt64) {
  const int64_t big = INT64_MAX;
  // torch.chunk of 2^63−1 into 3: chunk ceil(n/3), the last piece ends at n (n + parts − 1 used to overflow)
  const int64_t chunk = big / 3 + 1;
  EXPECT_EQ(chunk_range(big, 3, 0), (Range{0, chunk}));
  EXPECT_EQ(chunk_range(big, 3, 2), (Range{2 * chunk, big}));
  EXPECT_EQ(chunk_range(big, 2, 5), (Range{big, big}));
  EXPECT_THROW(chunk_range(8, 0, 0), std::invalid_argument);
  Box b;
  b.dims = {IndexSet::full(int64_t{1} << 40), IndexSet::full(int64_t{1} << 40)};
  expect_invalid([&] { (void)b.numel(); }, "1208925819614629174706176", "[layout]");
  b.dims.push_back(IndexSet{});
  EXPECT_EQ(b.numel(), 0);  // an empty dim wins over the overflow of the others
}

// Exact element counts with 128-bit arithmetic, for the fuzz's reference.
__int128 exact_numel(const std::vector<int64_t>& shape) {
  __int128 n = 1;
  for (int64_t e : shape) {
    if (e == 0) return 0;
    if (n > (static_cast<__int128>(1) << 100)) return n;  // already far past every limit
    n *= e;
  }
  return n;
}

// Random huge and boundary shapes through loader -> apply_parallel -> make_plan: either a clean
// std::invalid_argument naming the parameter, or a plan whose counts are exact and bytes ≥ 0.
TEST(PlanLimits, FuzzHugeAndBoundaryShapes) {
  const int64_t p31 = int64_t{1} << 31, p20 = int64_t{1} << 20;
  const std::vector<int64_t> extents = {0, 1, 2, 3, 7, p31 - 1, p31, p31 + 1, int64_t{1} << 32, int64_t{1} << 40,
                                        (int64_t{1} << 60) - 1, int64_t{1} << 60, (int64_t{1} << 60) + 1,
                                        int64_t{1} << 62, INT64_MAX, p20, p20 + 1, 1000003};
  const char* layouts[] = {"dp_shard=4", "dp_shard=3,tp=2", "dp_replicate=2,dp_shard=2,ep=2", "tp=2", "dp_shard=5"};
  std::mt19937_64 rng(12345);
  const auto pick = [&] { return extents[rng() % extents.size()]; };
  int planned = 0, refused = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<std::vector<int64_t>> shapes;
    std::string params;
    const int kind = static_cast<int>(rng() % 3);  // 2-D muon, expert stack, 1-D adamw
    std::vector<int64_t> s = kind == 0 ? std::vector<int64_t>{pick(), pick()}
                             : kind == 1 ? std::vector<int64_t>{std::min<int64_t>(pick(), 64 + static_cast<int64_t>(rng() % 3) * p20), pick(), pick()}
                                         : std::vector<int64_t>{pick()};
    // products right at the limit: 2^60 = 2^a · 2^(60−a), and one past it
    if (iter % 7 == 0) {
      const int a = 1 + static_cast<int>(rng() % 59);
      s = {int64_t{1} << a, (int64_t{1} << (60 - a)) + (iter % 2)};
    }
    std::string shape_text;
    for (int64_t e : s) shape_text += (shape_text.empty() ? "" : ", ") + std::to_string(e);
    const std::string name = "p" + std::to_string(iter);
    params = std::string(R"J({"name": "small", "shape": [64, 32], "role": "muon"}, {"name": ")J") + name + R"J(", "shape": [)J" + shape_text + R"J(], "role": ")J" +
             (kind == 2 ? "adamw" : "muon") + "\"" + (kind == 1 ? R"J(, "expert": true)J" : "") + "}";
    const ParallelConfig config = parse_parallel(layouts[iter % 5]);
    try {
      const Inventory inv = load_inventory_json(model_json(params), &config);
      const Plan plan = make_plan(inv, PlanOptions{});
      ++planned;
      const __int128 want = exact_numel(s) + 64 * 32;
      ASSERT_LE(want, static_cast<__int128>(INT64_MAX)) << name << " " << shape_text;
      EXPECT_EQ(static_cast<__int128>(inv.num_elements()), want) << shape_text;
      EXPECT_LE(exact_numel(s), static_cast<__int128>(kMaxParamElements)) << shape_text;
      const CostSummary& t = plan.total();
      for (double x : {t.bytes_sent_max, t.bytes_sent_mean, t.bytes_recv_max, t.bytes_recv_mean, t.flops_max,
                       t.flops_mean, t.peak_buffer_bytes_max, t.predicted_seconds}) {
        EXPECT_TRUE(std::isfinite(x) && x >= 0) << shape_text << ": " << x;
      }
      // every rank's local box is exact: the boxes of one replica group tile the tensor
      const Mesh& mesh = inv.meshes[static_cast<size_t>(inv.params[1].mesh)];
      const DimMask rep = replicate_dims(inv.params[1].placements, mesh);
      __int128 sum = 0;
      for (int r = 0; r < mesh.size(); ++r)
        if (mesh.group_index(r, rep) == 0) sum += plan.local_box(1, r).numel();
      EXPECT_EQ(sum, exact_numel(s)) << shape_text;
    } catch (const std::invalid_argument& e) {
      ++refused;
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + name + "'"), std::string::npos) << shape_text << ": " << msg;
      EXPECT_EQ(msg.rfind("[", 0), 0u) << msg;
      // refusals are for sizes past the limits (or a Muon tensor's own rules), never for fitting sizes
      const bool too_big = exact_numel(s) + 64 * 32 > kMaxParamElements ||
                           *std::max_element(s.begin(), s.end()) > kMaxParamElements ||
                           (kind == 1 && s[0] > kMaxExperts);
      EXPECT_TRUE(too_big || msg.find("2^60") == std::string::npos) << shape_text << ": " << msg;
    }
  }
  EXPECT_GT(planned, 50);
  EXPECT_GT(refused, 50);
}

TEST(PlanLimits, WorldSizeLimitsAndParseErrorsSayTheLimit) {
  // too large to parse: the error says the limit instead of "give a positive integer"
  expect_invalid([] { parse_parallel("dp_shard=1099511627776"); }, "1048576", "[layout]");
  expect_invalid([] { parse_parallel("dp_shard=0"); }, "1048576", "[layout]");
  // 2^24 ranks: a clear error, not std::bad_alloc
  const std::string msg = error_of([] { parse_parallel("dp_shard=4096,tp=4096"); });
  EXPECT_NE(msg.find("16777216"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1048576"), std::string::npos) << msg;
  expect_invalid([] { Mesh::parse("a=2048,b=1024"); }, "2097152 ranks", "[layout]");
  EXPECT_EQ(Mesh::parse("a=1024,b=1024").size(), kMaxWorldSize);
  ParallelConfig c;  // built in C++, past the checks of parse_parallel
  c.dp_shard = 65536, c.tp = 65536;
  expect_invalid([&] { apply_parallel(preset_model("gpt2-124m"), c); }, "1048576", "[inventory]");
  // ep is not a factor of the world: dp_shard=2^19,ep=64 is a world of 2^19
  EXPECT_EQ(parse_parallel("dp_shard=524288,ep=64").world_size(), 524288);
}

TEST(PlanLimits, ErrorsQuoteOnlyWhatTheUserTyped) {
  EXPECT_EQ(to_string(parse_parallel("dp_shard=8")), "dp_shard=8");
  EXPECT_EQ(to_string(parse_parallel("tp=2,dp_shard=4")), "dp_shard=4,tp=2");
  const char* placed = R"J({"meshes": [{"name": "d", "dims": "dp=2,tp=2"}],
    "params": [{"name": "w", "shape": [8, 4], "role": "muon", "placements": ["S(0)", "R"]}]})J";
  const ParallelConfig tp2 = parse_parallel("tp=2");
  const std::string msg = error_of([&] { load_inventory_json(placed, &tp2); });
  EXPECT_NE(msg.find("--parallel tp=2 gives a world of 2"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("dp_shard"), std::string::npos) << msg;
}

// The cost model's closed-form all-reduce bytes equal comm's accounting (what the executor counts).
TEST(PlanLimits, AllReduceBytesMatchComm) {
  for (int size : {1, 2, 3, 7, 16})
    for (int64_t count : {0, 1, 5, 16, 17, 1000003})
      for (int rank = 0; rank < size; ++rank)
        EXPECT_EQ(detail::all_reduce_bytes(rank, size, count, 4), comm_bytes_all_reduce(rank, size, count, 4).sent)
            << rank << "/" << size << " " << count;
}

// Planning grows O(world): gram_allreduce at 2^20 ranks (per rank, its all-reduce bytes used to
// cost O(world), so O(world²) per parameter: hours here) and an owner plan at the largest world.
TEST(PlanLimits, PlansAtTheLargestWorld) {
  Inventory inv;
  inv.model = "two";
  inv.mesh_names = {"dense"};
  inv.meshes = {Mesh::parse("dp_shard=1048576")};
  for (const char* name : {"tall", "wide"}) {
    ParamSpec p;
    p.name = name;
    p.shape = name[0] == 't' ? Shape{int64_t{1} << 21, 64} : Shape{4096, 11008};
    p.placements = {Placement::shard(0)};
    inv.params.push_back(p);
  }
  PlanOptions o;
  o.pins = StrategyRules::parse("tall:gram_allreduce");
  // No timing here (benchmarks measure speed: `meshmuon bench plan`): the quadratic planner took hours
  // at 2^20 ranks, so ctest's timeout is the guard; the linear one plans it in ~0.3 s.
  const Plan plan = make_plan(inv, o);
  EXPECT_EQ(plan.entries()[0].strategy, Strategy::GramAllReduce);
  EXPECT_EQ(plan.world_size(), 1 << 20);
  EXPECT_GT(plan.total().bytes_sent_max, 0);
}

}  // namespace
}  // namespace meshmuon
