// make_plan: strategy choice per Muon parameter (pin > env > cost model), then owners, chunks,
// costs and the fingerprint (planner_steps.h), and the plan's accessors.
#include <limits>
#include <map>
#include <tuple>

#include "meshmuon/error.h"
#include "plan/cost_model.h"
#include "plan/planner_steps.h"

namespace meshmuon {
namespace {

using detail::ShardTable;

void validate_options(const PlanOptions& o) {
  MESHMUON_CHECK(o.chunk_bytes > 0, "[plan] option 'chunk_bytes' must be positive (got ", o.chunk_bytes, ")");
  MESHMUON_CHECK(o.window >= 1, "[plan] option 'window' must be ≥ 1 (got ", o.window, ")");
  MESHMUON_CHECK(o.ns.steps >= 1, "[plan] option 'ns.steps' must be ≥ 1 (got ", o.ns.steps, ")");
  const MachineProfile& m = o.machine;
  MESHMUON_CHECK(m.bandwidth_Bps > 0 && m.replicate_bandwidth_Bps > 0 && m.flops_per_s > 0 && m.latency_s >= 0,
              "[plan] machine profile '", m.name, "' needs positive bandwidths and flop rate and latency ≥ 0");
}

// amortized_seconds depends on the parameter only through its table (mesh, shape, placements):
// computed once per (table, strategy, split), so a model of many equal layers costs one layer.
using Memo = std::map<std::tuple<const ShardTable*, int, bool>, double>;

Strategy cost_choice(const ParamSpec& p, const ShardTable& t, bool split, const PlanOptions& o, Memo& memo) {
  Strategy best = Strategy::Local;
  double best_s = std::numeric_limits<double>::infinity();
  for (int i = 0; i < kNumStrategies; ++i) {
    const Strategy s = static_cast<Strategy>(i);
    if (!detail::applies(s, p, t, split) || (o.exact && s == Strategy::GramAllReduce)) continue;
    double sec = 0;
    if (p.split.empty()) {
      const auto [it, fresh] = memo.try_emplace({&t, i, split}, 0.0);
      if (fresh) it->second = detail::amortized_seconds(s, p, t, split, o);
      sec = it->second;
    } else {
      sec = detail::amortized_seconds(s, p, t, split, o);  // flops per block split: not the table's alone
    }
    if (sec < best_s) best_s = sec, best = s;  // ties keep the earlier (simpler) strategy
  }
  return best;
}

// Pin or env rule for `p`, when one applies. A pattern naming a parameter that the strategy cannot
// run is a caller mistake; a `default:` rule that cannot run it falls back to the cost model.
bool rule_choice(const StrategyRules& rules, const char* source, const ParamSpec& p, const ShardTable& t, bool split,
                 Strategy& out, bool& fell_back) {
  bool by_pattern = false;
  const auto s = rules.match(p.name, &by_pattern);
  if (!s) return false;
  if (detail::applies(*s, p, t, split)) {
    out = *s;
    return true;
  }
  MESHMUON_CHECK(!by_pattern, "[plan] parameter '", p.name, "': ", source, " pins strategy '", to_string(*s),
              "' but it cannot run this parameter (shape ", p.shape.to_string(), ", ", t.g,
              "-rank shard group", p.expert ? ", expert stack" : "", "); pick another strategy for it");
  fell_back = true;
  return false;
}

void build(const Inventory& inv, const PlanOptions& o, bool split, detail::ShardTables& tables, Memo& memo,
           std::vector<PlanEntry>& entries, std::vector<Chunk>& chunks, CostSummary& total,
           std::array<CostSummary, kNumStrategies>& by) {
  for (size_t i = 0; i < inv.params.size(); ++i) {
    const ParamSpec& p = inv.params[i];
    if (p.role != Role::Muon) continue;
    const ShardTable& t = tables.get(static_cast<int>(i));
    PlanEntry e;
    e.param = static_cast<int>(i);
    e.mesh = p.mesh;
    e.group_dims = t.group_dims;
    e.replica_dims = t.replica_dims;
    bool fell_back = false;
    if (rule_choice(o.pins, "a user pin", p, t, split, e.strategy, fell_back)) {
      e.decision = Decision::Pin;
    } else if (!fell_back && rule_choice(o.env_override, "MESHMUON_STRATEGY", p, t, split, e.strategy, fell_back)) {
      e.decision = Decision::Env;
    } else {
      e.strategy = cost_choice(p, t, split, o, memo);
      e.decision = fell_back ? Decision::Fallback : Decision::Cost;
    }
    e.replica_split = split && t.r > 1 && e.strategy == Strategy::OwnerA2A;
    e.unit_flops = detail::unit_ns_flops(p, o.ns);
    entries.push_back(std::move(e));
  }
  detail::form_chunks(entries, tables, inv, o, chunks);
  detail::assign_owners(entries, tables, inv);
  detail::account(entries, tables, inv, o, chunks, total, by);
  for (PlanEntry& e : entries) e.hash = detail::entry_hash(e, inv.params[static_cast<size_t>(e.param)]);
}

}  // namespace

Plan make_plan(const Inventory& inventory, const PlanOptions& options) {
  inventory.validate();
  validate_options(options);
  bool has_replicas = false;
  for (const ParamSpec& p : inventory.params)
    if (p.role == Role::Muon) {
      const Mesh& mesh = inventory.meshes[static_cast<size_t>(p.mesh)];
      has_replicas |= mesh.group_size(replicate_dims(p.placements, mesh)) > 1;
    }
  detail::ShardTables tables(inventory);  // shared by both builds of `auto`
  Memo memo;
  const auto make = [&](bool split) {
    Plan plan;
    plan.inventory_ = inventory;
    plan.options_ = options;
    plan.options_.replica = split ? ReplicaMode::Split : ReplicaMode::Duplicate;
    build(inventory, plan.options_, split, tables, memo, plan.entries_, plan.chunks_, plan.total_, plan.by_strategy_);
    plan.entry_of_param_.assign(inventory.params.size(), -1);
    for (size_t i = 0; i < plan.entries_.size(); ++i) plan.entry_of_param_[static_cast<size_t>(plan.entries_[i].param)] = static_cast<int>(i);
    plan.fingerprint_ = detail::plan_fingerprint(inventory, plan.options_, plan.entries_);
    return plan;
  };
  if (options.replica == ReplicaMode::Split) return make(true);
  if (options.replica == ReplicaMode::Duplicate || !has_replicas) return make(false);
  Plan dup = make(false), spl = make(true);  // auto: the faster prediction, duplicate on ties
  return spl.total().predicted_seconds < dup.total().predicted_seconds ? std::move(spl) : std::move(dup);
}

bool strategy_applies(Strategy s, const Inventory& inventory, int param) {
  MESHMUON_CHECK(param >= 0 && param < static_cast<int>(inventory.params.size()), "[plan] parameter index ", param,
              " is out of range");
  detail::ShardTables tables(inventory);
  const ParamSpec& p = inventory.params[static_cast<size_t>(param)];
  return p.role == Role::Muon && detail::applies(s, p, tables.get(param));
}

const PlanEntry* Plan::entry_of(int param) const {
  if (param < 0 || param >= static_cast<int>(entry_of_param_.size())) return nullptr;
  const int i = entry_of_param_[static_cast<size_t>(param)];
  return i < 0 ? nullptr : &entries_[static_cast<size_t>(i)];
}

int Plan::owner_rank(const PlanEntry& e, int64_t unit, int rank) const {
  MESHMUON_CHECK(!e.owner_index.empty(), "[plan] parameter '", inventory_.params[static_cast<size_t>(e.param)].name,
              "' uses ", meshmuon::to_string(e.strategy), ", which has no owners");
  MESHMUON_CHECK(unit >= 0 && unit < static_cast<int64_t>(e.owner_index.size()), "[plan] unit ", unit, " is out of range");
  const Mesh& mesh = inventory_.meshes[static_cast<size_t>(e.mesh)];
  MESHMUON_CHECK(rank >= 0 && rank < mesh.size(), "[plan] rank ", rank, " is outside the world of ", mesh.size());
  int base = rank;  // a rank of the owning replica group
  if (e.replica_split) base = mesh.group_member(rank, e.replica_dims, e.owner_replica[static_cast<size_t>(unit)]);
  return mesh.group_member(base, e.group_dims, e.owner_index[static_cast<size_t>(unit)]);
}

Box Plan::local_box(int param, int rank) const {
  MESHMUON_CHECK(param >= 0 && param < static_cast<int>(inventory_.params.size()), "[plan] parameter index ", param,
              " is out of range");
  const ParamSpec& p = inventory_.params[static_cast<size_t>(param)];
  return meshmuon::local_box(p.shape, p.placements, inventory_.meshes[static_cast<size_t>(p.mesh)], rank);
}

std::array<int, kNumStrategies> Plan::strategy_counts() const {
  std::array<int, kNumStrategies> c{};
  for (const PlanEntry& e : entries_) ++c[static_cast<size_t>(e.strategy)];
  return c;
}

}  // namespace meshmuon
