// Internal: the cost model. For one plan entry it lists what every rank it touches sends, receives,
// computes and buffers (`visit`; the bodies are templates in plan/visit.h), and what collectives a
// chunk of such entries issues.
#pragma once

#include <functional>

#include "dmuon/plan.h"
#include "plan/shard_table.h"
#include "plan/visit.h"

namespace dmuon::detail {

using Visitor = std::function<void(int rank, const Contribution&)>;

// Calls `fn` for every (rank, contribution) of `entry` (owners must be set for owner strategies).
// A rank may be visited several times.
void visit(const PlanEntry& entry, const ShardTable& t, const ParamSpec& p, const PlanOptions& o,
           const Visitor& fn);

// The NorMuon state's share of `entry` (fp32, travelling with the data exactly as the executor's
// routes move it): `vt` is the state tensor's table (ShardTables::get_state).
void visit_state(const PlanEntry& entry, const ShardTable& t, const ShardTable& vt, const Visitor& fn);

// visit, plus visit_state when options.normuon marks the entry's parameter.
void visit_all(const PlanEntry& entry, ShardTables& tables, const Inventory& inv, const PlanOptions& o,
               const Visitor& fn);

// `split`: owners may be spread over replicas (ReplicaMode::Split); then owner_a2a also runs a
// replicated-only parameter (shard group of 1): one replica computes, the result is scattered.
bool applies(Strategy s, const ParamSpec& p, const ShardTable& t, bool split = false);

// Collective calls a chunk issues for the entries of strategy `s`, and their latency for a group
// of `g` ranks (log2 steps per call; an all-reduce is two passes).
int collectives_per_chunk(Strategy s, const PlanOptions& o);
double collective_latency(Strategy s, int g, bool split_scatter, int g_split, const PlanOptions& o);

// Amortized per-rank seconds (bandwidth and compute, no latency) of running `p` with `s` (means over
// ranks, so owner placement does not matter): what the per-parameter choice compares.
double amortized_seconds(Strategy s, const ParamSpec& p, const ShardTable& t, bool split, const PlanOptions& o);

}  // namespace dmuon::detail
