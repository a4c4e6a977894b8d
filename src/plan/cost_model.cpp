// Internal: the cost model's per-rank accounting of each strategy (docs/plan.md, "cost model").
#include "plan/cost_model.h"

#include <cmath>

namespace dmuon::detail {
namespace {

double log2_steps(int g) { return g <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(g))); }

}  // namespace

bool applies(Strategy s, const ParamSpec& p, const ShardTable& t, bool split) {
  switch (s) {
    case Strategy::Local: return !p.expert && t.whole_units;
    case Strategy::ExpertLocal: return p.expert && t.whole_units;
    case Strategy::OwnerA2A: return t.g > 1 || (split && t.r > 1);
    case Strategy::AllGather: return t.g > 1;
    case Strategy::Agrs: return !p.expert && t.g > 1;
    case Strategy::GramAllReduce: return !p.expert && t.long_dim_only;
    case Strategy::ExpertSubgroup: return p.expert && t.g > 1;
  }
  return false;
}

int collectives_per_chunk(Strategy s, const PlanOptions& o) {
  switch (s) {
    case Strategy::OwnerA2A: return 2;      // gather a2a, scatter a2a
    case Strategy::AllGather: return 1;
    case Strategy::Agrs: return 2;          // all-gather, reduce-scatter
    case Strategy::GramAllReduce: return o.ns.steps;  // one Gram all-reduce per step (norm from the first)
    case Strategy::ExpertSubgroup: return 1;
    default: return 0;
  }
}

double collective_latency(Strategy s, int g, bool split_scatter, int g_split, const PlanOptions& o) {
  const double a = o.machine.latency_s;
  switch (s) {
    case Strategy::OwnerA2A: return a * (log2_steps(g) + log2_steps(split_scatter ? g_split : g));
    case Strategy::AllGather:
    case Strategy::ExpertSubgroup: return a * log2_steps(g);
    case Strategy::Agrs: return 2 * a * log2_steps(g);
    case Strategy::GramAllReduce: return collectives_per_chunk(s, o) * 2 * a * log2_steps(g);
    default: return 0;
  }
}

void visit(const PlanEntry& e, const ShardTable& t, const ParamSpec& p, const PlanOptions& o, const Visitor& fn) {
  visit_entry(e, t, p, o, fn);
}

void visit_state(const PlanEntry& e, const ShardTable& t, const ShardTable& vt, const Visitor& fn) {
  visit_state_entry(e, t, vt, fn);
}

void visit_all(const PlanEntry& e, ShardTables& tables, const Inventory& inv, const PlanOptions& o, const Visitor& fn) {
  visit_all_entry(e, tables, inv, o, fn);
}

double amortized_seconds(Strategy s, const ParamSpec& p, const ShardTable& t, bool split, const PlanOptions& o) {
  PlanEntry e;
  e.strategy = s;
  e.replica_split = split && s == Strategy::OwnerA2A && t.r > 1;
  e.unit_flops = ns_flops(p.rows(), p.cols(), o.ns);
  e.owner_index.assign(static_cast<size_t>(t.units), 0);
  e.owner_replica.assign(static_cast<size_t>(t.units), 0);
  double sent = 0, recv = 0, rep = 0, flops = 0;
  visit_entry(e, t, p, o, [&](int, const Contribution& c) {
    sent += c.sent - c.sent_rep;
    recv += c.recv - c.recv_rep;
    rep += std::max(c.sent_rep, c.recv_rep);
    flops += c.flops;
  });
  // Latency is left out: collectives are batched per chunk, so it is shared by the chunk's
  // parameters and enters the plan's totals instead.
  const double w = static_cast<double>(t.g) * t.r;
  return std::max(sent, recv) / w / o.machine.bandwidth_Bps + rep / w / o.machine.replicate_bandwidth_Bps +
         flops / w / o.machine.flops_per_s;
}

}  // namespace dmuon::detail
