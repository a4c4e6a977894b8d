// Internal: the passes of make_plan after the strategy choice (owners, chunks and costs, fingerprint).
#pragma once

#include <vector>

#include "meshmuon/plan.h"
#include "plan/shard_table.h"

namespace meshmuon::detail {

// Forms chunks in entry order. Owners are not known yet, so the cap applies to a chunk's MEAN
// buffer bytes per rank (owner matrices amortized over the group, as the per-chunk owner assignment
// spreads them); the busiest rank may exceed it by about one matrix, and the accounting reports the
// real per-rank peak. A chunk closes before an entry would pass options.chunk_bytes.
void form_chunks(std::vector<PlanEntry>& entries, ShardTables& tables, const Inventory& inv, const PlanOptions& o,
                 std::vector<Chunk>& chunks);

// Longest-processing-time first, chunk by chunk (chunks run one after another, so each must be
// balanced): matrices (experts) of owner strategies, largest flops first, each to the candidate
// with the least load in this chunk, then the least load overall (then lowest position, replica).
// Candidates: every group position for 2-D matrices, the expert's holders for stacks; every replica
// group too when the entry is replica_split.
void assign_owners(std::vector<PlanEntry>& entries, ShardTables& tables, const Inventory& inv);

// Accounts every rank's bytes, flops and buffers, chunk by chunk, into the chunks and summaries.
void account(std::vector<PlanEntry>& entries, ShardTables& tables, const Inventory& inv,
                       const PlanOptions& o, std::vector<Chunk>& chunks, CostSummary& total,
                       std::array<CostSummary, kNumStrategies>& by_strategy);

// 64-bit hashes (FNV-1a) of each entry and of the whole plan.
uint64_t entry_hash(const PlanEntry& e, const ParamSpec& p);
uint64_t plan_fingerprint(const Inventory& inv, const PlanOptions& o, const std::vector<PlanEntry>& entries);

}  // namespace meshmuon::detail
