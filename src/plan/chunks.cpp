// Internal: chunk formation under the buffer byte cap (planner_steps.h): consecutive entries share a
// chunk while the mean over ranks of their buffers stays under PlanOptions::chunk_bytes.
#include <map>
#include <tuple>
#include <vector>

#include "plan/planner_steps.h"
#include "plan/visit.h"

namespace meshmuon::detail {

void form_chunks(std::vector<PlanEntry>& entries, ShardTables& tables, const Inventory& inv, const PlanOptions& o,
                 std::vector<Chunk>& chunks) {
  const double w = static_cast<double>(inv.world_size()), cap = static_cast<double>(o.chunk_bytes);
  // an entry's buffer total depends on its table, strategy and split only: once per distinct triple
  std::map<std::tuple<const ShardTable*, Strategy, bool>, double> memo;
  double mean_sum = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const ShardTable& t = tables.get(entries[i].param);
    const auto [it, fresh] = memo.try_emplace({&t, entries[i].strategy, entries[i].replica_split}, 0.0);
    if (fresh) {
      PlanEntry e = entries[i];  // a copy with provisional owners
      const bool owned = e.strategy == Strategy::OwnerA2A || e.strategy == Strategy::Agrs;
      e.owner_index.assign(owned ? static_cast<size_t>(t.units) : 0, 0);
      e.owner_replica.assign(owned && e.replica_split ? static_cast<size_t>(t.units) : 0, 0);
      double total = 0;
      visit_entry(e, t, inv.params[static_cast<size_t>(e.param)], o, [&](int, const Contribution& c) { total += c.buffer; });
      it->second = total;
    }
    const double mean = it->second / w;
    if (chunks.empty() || mean_sum + mean > cap) {
      mean_sum = 0;
      chunks.push_back({static_cast<int>(i), static_cast<int>(i)});
    }
    mean_sum += mean;
    entries[i].chunk = static_cast<int>(chunks.size()) - 1;
    chunks.back().end_entry = static_cast<int>(i) + 1;
  }
}

}  // namespace meshmuon::detail
