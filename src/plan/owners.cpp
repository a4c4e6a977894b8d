// Internal: owner assignment, longest-processing-time first on orthogonalization flops.
#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "plan/planner_steps.h"

namespace meshmuon::detail {

void assign_owners(std::vector<PlanEntry>& entries, ShardTables& tables, const Inventory& inv) {
  struct Job {
    int chunk;
    double flops;
    int entry;
    int64_t unit;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < entries.size(); ++i) {
    PlanEntry& e = entries[i];
    if (e.strategy != Strategy::OwnerA2A && e.strategy != Strategy::Agrs) continue;
    const ShardTable& t = tables.get(e.param);
    e.owner_index.assign(static_cast<size_t>(t.units), 0);
    if (e.replica_split) e.owner_replica.assign(static_cast<size_t>(t.units), 0);
    for (int64_t u = 0; u < t.units; ++u) jobs.push_back({e.chunk, e.unit_flops, static_cast<int>(i), u});
  }
  // pass 1: by chunk, largest first; equal flops keep model order so every rank gets the same result
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) {
    if (a.chunk != b.chunk) return a.chunk < b.chunk;
    if (a.flops != b.flops) return a.flops > b.flops;
    if (a.entry != b.entry) return a.entry < b.entry;
    return a.unit < b.unit;
  });
  // pass 2: each to the least-loaded candidate (loads are per world rank)
  std::vector<double> load(static_cast<size_t>(inv.world_size()), 0.0), chunk_load(load.size(), 0.0);
  std::vector<int> touched;
  // Per candidate list (a table's unit holders, or its whole group; times the replicas scanned): how
  // many leading candidates are known to carry load. Loads never decrease, so those never again
  // have load 0, and the first candidate with load 0 is what the scan below would stop at: found
  // by moving the cursor, in O(candidates) per list over the whole plan instead of per matrix.
  std::map<std::tuple<const ShardTable*, int64_t, int>, int64_t> cursors;
  int chunk = -1;
  for (const Job& job : jobs) {
    if (job.chunk != chunk) {
      for (int r : touched) chunk_load[static_cast<size_t>(r)] = 0;
      touched.clear();
      chunk = job.chunk;
    }
    PlanEntry& e = entries[static_cast<size_t>(job.entry)];
    const ShardTable& t = tables.get(e.param);
    const int replicas = e.replica_split ? t.r : 1;
    int best_k = 0, best_j = 0;
    double best = std::numeric_limits<double>::infinity(), best_all = best;
    // loads are ≥ 0: once a candidate with no load at all is found, no later one can win (the scan
    // keeps the first of equals), so the scan stops there
    const auto consider = [&](int k) {
      for (int j = 0; j < replicas; ++j) {
        const size_t r = static_cast<size_t>(t.rank(j, k));
        if (chunk_load[r] < best || (chunk_load[r] == best && load[r] < best_all)) {
          best = chunk_load[r], best_all = load[r], best_k = k, best_j = j;
          if (best == 0 && best_all == 0) return true;
        }
      }
      return false;
    };
    const bool stack = inv.params[static_cast<size_t>(e.param)].expert;
    const int64_t h0 = t.holder_offsets[static_cast<size_t>(job.unit)], h1 = t.holder_offsets[static_cast<size_t>(job.unit) + 1];
    const bool by_holders = stack && h1 > h0;
    const int64_t positions = by_holders ? h1 - h0 : t.g, candidates = positions * replicas;
    const auto position = [&](int64_t c) { return by_holders ? t.holders[static_cast<size_t>(h0 + c / replicas)] : static_cast<int>(c / replicas); };
    int64_t& next = cursors[{&t, by_holders ? job.unit : -1, replicas}];
    while (next < candidates && load[static_cast<size_t>(t.rank(static_cast<int>(next % replicas), position(next)))] > 0) ++next;
    if (next < candidates) {  // a candidate with no load at all (so none in this chunk): the scan's pick
      best_k = position(next), best_j = static_cast<int>(next % replicas);
    } else if (by_holders) {
      for (int64_t h = h0; h < h1; ++h)
        if (consider(t.holders[static_cast<size_t>(h)])) break;
    } else {
      for (int k = 0; k < t.g; ++k)
        if (consider(k)) break;
    }
    e.owner_index[static_cast<size_t>(job.unit)] = best_k;
    if (e.replica_split) e.owner_replica[static_cast<size_t>(job.unit)] = best_j;
    // without a split every replica group's rank at this position computes it
    const int copies = e.replica_split ? 1 : t.r;
    for (int j = 0; j < copies; ++j) {
      const size_t r = static_cast<size_t>(t.rank(e.replica_split ? best_j : j, best_k));
      if (chunk_load[r] == 0) touched.push_back(static_cast<int>(r));
      load[r] += job.flops;
      chunk_load[r] += job.flops;
    }
  }
}

}  // namespace meshmuon::detail
