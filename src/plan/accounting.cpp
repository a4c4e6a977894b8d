// Internal: chunk formation under the buffer byte cap, and the per-rank accounting of the plan
// (bytes, flops, peak buffers, collectives, predicted seconds).
#include <algorithm>
#include <cmath>

#include "plan/cost_model.h"
#include "plan/planner_steps.h"

namespace dmuon::detail {
namespace {

struct PerRank {
  std::vector<double> sent, recv, sent_rep, recv_rep, flops, buffer;
  explicit PerRank(size_t w) : sent(w), recv(w), sent_rep(w), recv_rep(w), flops(w), buffer(w) {}
  void clear() {
    for (auto* v : {&sent, &recv, &sent_rep, &recv_rep, &flops, &buffer}) std::fill(v->begin(), v->end(), 0.0);
  }
  void add(int r, const Contribution& c) {
    const size_t i = static_cast<size_t>(r);
    sent[i] += c.sent, recv[i] += c.recv, sent_rep[i] += c.sent_rep, recv_rep[i] += c.recv_rep;
    flops[i] += c.flops, buffer[i] += c.buffer;
  }
  double comm_seconds(const MachineProfile& m) const {
    double worst = 0;
    for (size_t i = 0; i < sent.size(); ++i)
      worst = std::max(worst, std::max(sent[i] - sent_rep[i], recv[i] - recv_rep[i]) / m.bandwidth_Bps +
                                  std::max(sent_rep[i], recv_rep[i]) / m.replicate_bandwidth_Bps);
    return worst;
  }
};

double max_of(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }
double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

void summarize(const PerRank& pr, CostSummary& s) {
  s.bytes_sent_max = max_of(pr.sent), s.bytes_sent_mean = mean_of(pr.sent);
  s.bytes_recv_max = max_of(pr.recv), s.bytes_recv_mean = mean_of(pr.recv);
  s.flops_max = max_of(pr.flops), s.flops_mean = mean_of(pr.flops);
}

// Latency bookkeeping of one chunk: per strategy, the largest group it runs a collective over.
struct ChunkGroups {
  std::array<int, kNumStrategies> g{}, g_split{};
  std::array<bool, kNumStrategies> split{};
  void add(const PlanEntry& e, const ShardTable& t) {
    const size_t s = static_cast<size_t>(e.strategy);
    g[s] = std::max(g[s], t.g);
    if (e.replica_split) split[s] = true, g_split[s] = std::max(g_split[s], t.g * t.r);
  }
};

}  // namespace

void form_chunks(std::vector<PlanEntry>& entries, ShardTables& tables, const Inventory& inv, const PlanOptions& o,
                 std::vector<Chunk>& chunks) {
  const double w = static_cast<double>(inv.world_size()), cap = static_cast<double>(o.chunk_bytes);
  double mean_sum = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    PlanEntry e = entries[i];  // a copy with provisional owners
    const ShardTable& t = tables.get(e.param);
    const bool owned = e.strategy == Strategy::OwnerA2A || e.strategy == Strategy::Agrs;
    e.owner_index.assign(owned ? static_cast<size_t>(t.units) : 0, 0);
    e.owner_replica.assign(owned && e.replica_split ? static_cast<size_t>(t.units) : 0, 0);
    double total = 0;
    visit(e, t, inv.params[static_cast<size_t>(e.param)], o, [&](int, const Contribution& c) { total += c.buffer; });
    const double mean = total / w;
    if (chunks.empty() || mean_sum + mean > cap) {
      mean_sum = 0;
      chunks.push_back({static_cast<int>(i), static_cast<int>(i)});
    }
    mean_sum += mean;
    entries[i].chunk = static_cast<int>(chunks.size()) - 1;
    chunks.back().end_entry = static_cast<int>(i) + 1;
  }
}

void account(std::vector<PlanEntry>& entries, ShardTables& tables, const Inventory& inv,
                       const PlanOptions& o, std::vector<Chunk>& chunks, CostSummary& total,
                       std::array<CostSummary, kNumStrategies>& by_strategy) {
  const size_t w = static_cast<size_t>(inv.world_size());
  PerRank all(w), cur(w);
  std::vector<PerRank> strat(kNumStrategies, PerRank(w));
  std::vector<std::vector<double>> strat_buf(kNumStrategies, std::vector<double>(w));
  std::vector<std::vector<double>> window_bufs;  // buffers of the previous window−1 chunks
  std::vector<double> peak(w);
  std::vector<std::pair<int, Contribution>> contrib;
  ChunkGroups groups;
  double pipelined = 0;
  const int window = std::max(1, o.window);

  int chunk = -1;  // the chunk being accounted
  const auto close_chunk = [&]() {
    if (chunk < 0) return;
    Chunk& c = chunks[static_cast<size_t>(chunk)];
    c.compute_seconds = max_of(cur.flops) / o.machine.flops_per_s;
    c.comm_seconds = cur.comm_seconds(o.machine);
    for (int s = 0; s < kNumStrategies; ++s) {
      if (groups.g[static_cast<size_t>(s)] == 0) continue;
      const Strategy st = static_cast<Strategy>(s);
      const double lat = collective_latency(st, groups.g[static_cast<size_t>(s)], groups.split[static_cast<size_t>(s)],
                                            groups.g_split[static_cast<size_t>(s)], o);
      c.comm_seconds += lat;
      by_strategy[static_cast<size_t>(s)].comm_seconds += lat;
      by_strategy[static_cast<size_t>(s)].collectives += collectives_per_chunk(st, o);
      total.collectives += collectives_per_chunk(st, o);
      auto& sb = strat_buf[static_cast<size_t>(s)];
      by_strategy[static_cast<size_t>(s)].peak_buffer_bytes_max = std::max(by_strategy[static_cast<size_t>(s)].peak_buffer_bytes_max, max_of(sb));
      std::fill(sb.begin(), sb.end(), 0.0);
    }
    c.buffer_bytes_max = max_of(cur.buffer);
    // peak: this chunk plus the window−1 before it are in flight together
    for (size_t r = 0; r < w; ++r) {
      double sum = cur.buffer[r];
      for (const auto& prev : window_bufs) sum += prev[r];
      peak[r] = std::max(peak[r], sum);
    }
    if (window > 1) {
      window_bufs.push_back(cur.buffer);
      if (static_cast<int>(window_bufs.size()) > window - 1) window_bufs.erase(window_bufs.begin());
    }
    total.comm_seconds += c.comm_seconds;
    total.compute_seconds += c.compute_seconds;
    pipelined += window > 1 ? std::max(c.comm_seconds, c.compute_seconds) : c.comm_seconds + c.compute_seconds;
    cur.clear();
    groups = ChunkGroups{};
  };

  for (size_t i = 0; i < entries.size(); ++i) {
    PlanEntry& e = entries[i];
    const ShardTable& t = tables.get(e.param);
    contrib.clear();
    visit_all(e, tables, inv, o, [&](int r, const Contribution& c) { contrib.emplace_back(r, c); });
    if (e.chunk != chunk) {
      close_chunk();
      chunk = e.chunk;
    }
    groups.add(e, t);
    const size_t s = static_cast<size_t>(e.strategy);
    for (const auto& [r, c] : contrib) {
      cur.add(r, c);
      all.add(r, c);
      strat[s].add(r, c);
      strat_buf[s][static_cast<size_t>(r)] += c.buffer;
    }
    by_strategy[s].params += 1;
    by_strategy[s].matrices += t.units;
    total.params += 1;
    total.matrices += t.units;
  }
  close_chunk();
  if (!chunks.empty()) pipelined += window > 1 ? std::min(chunks.front().comm_seconds, chunks.front().compute_seconds) : 0;

  summarize(all, total);
  total.peak_buffer_bytes_max = max_of(peak);
  total.predicted_seconds = pipelined;
  for (int s = 0; s < kNumStrategies; ++s) {
    CostSummary& b = by_strategy[static_cast<size_t>(s)];
    if (b.params == 0) continue;
    summarize(strat[static_cast<size_t>(s)], b);
    b.comm_seconds += strat[static_cast<size_t>(s)].comm_seconds(o.machine);
    b.compute_seconds = b.flops_max / o.machine.flops_per_s;
    b.predicted_seconds = b.comm_seconds + b.compute_seconds;  // as if it ran alone, unoverlapped
  }
}

}  // namespace dmuon::detail
