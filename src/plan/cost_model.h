// Internal: the cost model. For one plan entry, what every rank it touches computes and buffers
// (plan/visit.h) and sends and receives (its transfers, plan/transfers.h), and the latency of the
// collectives a chunk issues.
#pragma once


#include "meshmuon/plan.h"
#include "plan/shard_table.h"
#include "plan/visit.h"

namespace meshmuon::detail {

// `split`: owners may be spread over replicas (ReplicaMode::Split); then owner_a2a also runs a
// replicated-only parameter (shard group of 1): one replica computes, the result is scattered.
bool applies(Strategy s, const ParamSpec& p, const ShardTable& t, bool split = false);

// Latency of `calls` collectives of `channel` over a group of g ranks: log2(g) steps each (an
// all-reduce two passes); a grouped point-to-point exchange is one round of concurrent messages.
double call_latency(Channel channel, int g, int calls, const MachineProfile& m);

// Amortized per-rank seconds (bandwidth and compute, no latency) of running `p` with `s` (means over
// ranks, so owner placement does not matter): what the per-parameter choice compares.
// One matrix's (one expert's) orthogonalization flops: the sum over its row blocks (ParamSpec::split).
double unit_ns_flops(const ParamSpec& p, const NsOptions& ns);
double amortized_seconds(Strategy s, const ParamSpec& p, const ShardTable& t, bool split, const PlanOptions& o);

}  // namespace meshmuon::detail
