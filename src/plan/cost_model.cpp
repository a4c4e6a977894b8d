// Internal: the cost model's per-rank accounting of each strategy (docs/plan.md, "cost model").
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace meshmuon::detail {
namespace {

// Sums of a transfer list's bytes over every rank (amortized_seconds).
struct Totals {
  static constexpr bool kAssemblies = false;
  double &sent, &recv, &rep;
  size_t elem;
  void p2p(const P2pTransfer& x) {
    const double b = static_cast<double>(x.count) * static_cast<double>(x.payload == Payload::Data ? elem : 4);
    if (x.cross_replica) rep += 2 * b;  // max(sent_rep, recv_rep) of each side
    else sent += b, recv += b;
  }
  void group(const GroupTransfer& x) {
    const auto [s, r] = bytes_total(x, elem);
    sent += s, recv += r;
  }
  void exchange(const Exchange& x) {
    bytes_of(x, elem, [&](int, double s, double r, double, double) { sent += s, recv += r; });
  }
  // owner_a2a without state: its messages' sum by arithmetic (every message's bytes is an integer
  // below 2^53, so the sum is the same in any order): the unit's elements but the skipped holder's,
  // once per direction the star moves them
  void star(const Star& x) {
    if (x.state) return for_each_message(x, [&](const P2pTransfer& m) { p2p(m); });
    const ShardTable& t = *x.table;
    const auto b0 = t.holders.begin() + t.holder_offsets[static_cast<size_t>(x.unit)];
    const auto b1 = t.holders.begin() + t.holder_offsets[static_cast<size_t>(x.unit) + 1];
    int64_t skipped = 0;
    if (x.skip >= 0) {
      const auto it = std::lower_bound(b0, b1, x.skip);
      if (it != b1 && *it == x.skip) skipped = t.holder_elems[static_cast<size_t>(it - t.holders.begin())];
    }
    const double b = static_cast<double>(t.unit_held[static_cast<size_t>(x.unit)] - skipped) * static_cast<double>(elem) *
                     ((x.gather ? 1.0 : 0.0) + (x.scatter ? 1.0 : 0.0));
    if (x.cross) rep += 2 * b;
    else sent += b, recv += b;
  }
};

double log2_steps(int g) { return g <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(g))); }

}  // namespace

bool applies(Strategy s, const ParamSpec& p, const ShardTable& t, bool split) {
  switch (s) {
    case Strategy::Local: return !p.expert && t.whole_units;
    case Strategy::ExpertLocal: return p.expert && t.whole_units;
    case Strategy::OwnerA2A: return t.g > 1 || (split && t.r > 1);
    case Strategy::AllGather: return t.g > 1;
    case Strategy::Agrs: return !p.expert && t.g > 1;
    case Strategy::GramAllReduce: return !p.expert && t.long_dim_only && p.split.empty();  // blocks: whole matrices
    case Strategy::ExpertSubgroup: return p.expert && t.g > 1;
  }
  return false;
}

double call_latency(Channel channel, int g, int calls, const MachineProfile& m) {
  switch (channel) {
    case Channel::PointToPoint: return calls * m.latency_s;
    case Channel::AllGather:
    case Channel::ReduceScatter: return calls * m.latency_s * log2_steps(g);
    case Channel::AllReduce: return calls * 2 * m.latency_s * log2_steps(g);
  }
  return 0;
}

double unit_ns_flops(const ParamSpec& p, const NsOptions& ns) {
  double f = 0;
  for (int64_t b : p.blocks()) f += ns_flops(b, p.cols(), ns);
  return f;
}

double amortized_seconds(Strategy s, const ParamSpec& p, const ShardTable& t, bool split, const PlanOptions& o) {
  PlanEntry e;
  e.strategy = s;
  e.replica_split = split && s == Strategy::OwnerA2A && t.r > 1;
  e.unit_flops = unit_ns_flops(p, o.ns);
  e.owner_index.assign(static_cast<size_t>(t.units), 0);
  e.owner_replica.assign(static_cast<size_t>(t.units), 0);
  double sent = 0, recv = 0, rep = 0, flops = 0;
  visit_entry(e, t, p, o, [&](int, const Contribution& c) { flops += c.flops; });
  // the transfers' byte sums over ranks (group collectives in O(1), not per rank)
  Totals totals{sent, recv, rep, dtype_size(o.comm_dtype)};
  for_each_transfer(e, t, nullptr, p, o.ns.steps, totals);
  // Latency is left out: collectives are batched per chunk, so it is shared by the chunk's
  // parameters and enters the plan's totals instead.
  const double w = static_cast<double>(t.g) * t.r;
  return std::max(sent, recv) / w / o.machine.bandwidth_Bps + rep / w / o.machine.replicate_bandwidth_Bps +
         flops / w / o.machine.ns_flops_per_s(o.ns);
}

}  // namespace meshmuon::detail

namespace meshmuon {

// docs/plan.md, "Predicted step time". Newton–Schulz seconds (each matrix at its shape's rate): the
// busiest rank's total with chunks in flight (window ≥ 2), else the sum of each chunk's busiest;
// communication per chunk, the busiest rank's (bytes over the fitted bandwidth, the chunk's latency
// terms at the fitted latency), overlapped as the pipeline runs them; then the busiest rank's
// elementwise bytes. Work: O(entries · ranks each touches) plus
// O(parameters · world) for the local shard sizes (bench-sized worlds).
StepPrediction predict_step(const Plan& plan, int ranks_per_node, double ns_rate_scale) {
  using namespace detail;
  MESHMUON_CHECK(ns_rate_scale > 0 && std::isfinite(ns_rate_scale),
                 "[plan] predict_step's ns_rate_scale must be a finite number > 0 (1: the profile's rates), got ",
                 ns_rate_scale);
  const Inventory& inv = plan.inventory();
  const PlanOptions& o = plan.options();
  const MachineProfile& m = o.machine;
  const int w = plan.world_size();
  double bw = m.bandwidth_Bps, lat = m.latency_s;
  for (const MachineProfile::CommFit& f : m.comm_fits)
    if (f.ranks == w) {
      if (f.bandwidth_Bps > 0) bw = f.bandwidth_Bps;
      lat = f.latency_s;
    }
  StepPrediction out;
  out.time_sharing = m.cores > 0 && ranks_per_node > m.cores ? static_cast<double>(ranks_per_node) / m.cores : 1.0;
  ShardTables tables(inv);
  std::vector<double> secs(static_cast<size_t>(w)), sent(static_cast<size_t>(w)), recv(static_cast<size_t>(w)),
      sent_rep(static_cast<size_t>(w)), recv_rep(static_cast<size_t>(w));
  std::vector<double> pack_bytes(static_cast<size_t>(w)), rank_compute(static_cast<size_t>(w));  // whole step
  std::vector<int> touched;
  std::vector<char> seen(static_cast<size_t>(w));
  const auto touch = [&](int r) {
    if (!seen[static_cast<size_t>(r)]) seen[static_cast<size_t>(r)] = 1, touched.push_back(r);
  };
  bool first = true;
  double sum_compute = 0, hidden = 0;
  for (const Chunk& c : plan.chunks()) {
    for (int i = c.first_entry; i < c.end_entry; ++i) {
      const PlanEntry& e = plan.entries()[static_cast<size_t>(i)];
      const ParamSpec& p = inv.params[static_cast<size_t>(e.param)];
      const ShardTable& t = tables.get(e.param);
      const double rate = m.ns_rate(p.rows(), p.cols(), o.ns) * ns_rate_scale;
      visit_entry(e, t, p, o, [&](int r, const Contribution& x) {
        touch(r);
        secs[static_cast<size_t>(r)] += x.flops / rate;
      });
      const bool state = static_cast<size_t>(e.param) < o.normuon.size() && o.normuon[static_cast<size_t>(e.param)];
      std::function<void(int, const Contribution&)> add = [&](int r, const Contribution& x) {
        touch(r);
        sent[static_cast<size_t>(r)] += x.sent, recv[static_cast<size_t>(r)] += x.recv;
        sent_rep[static_cast<size_t>(r)] += x.sent_rep, recv_rep[static_cast<size_t>(r)] += x.recv_rep;
      };
      transfer_bytes(e, t, state ? &tables.get_state(e.param) : nullptr, p, o, add);
    }
    double compute = 0, band = 0, band_plan = 0;
    for (int r : touched) {
      const size_t k = static_cast<size_t>(r);
      compute = std::max(compute, secs[k]);
      rank_compute[k] += secs[k];
      const double inner = std::max(sent[k] - sent_rep[k], recv[k] - recv_rep[k]);
      const double rep = std::max(sent_rep[k], recv_rep[k]) / m.replicate_bandwidth_Bps;
      band = std::max(band, inner / bw + rep);
      band_plan = std::max(band_plan, inner / m.bandwidth_Bps + rep);
      pack_bytes[k] += kPackBytesPerCommByte * (sent[k] + recv[k]);
      secs[k] = sent[k] = recv[k] = sent_rep[k] = recv_rep[k] = 0, seen[k] = 0;
    }
    touched.clear();
    // the chunk's latency terms: what the plan charged beyond its bandwidth term, rescaled to the
    // fitted latency (they are linear in latency_s)
    const double lat_plan = std::max(0.0, c.comm_seconds - band_plan);
    const double latency = m.latency_s > 0 ? lat_plan * lat / m.latency_s : 0.0;
    compute *= out.time_sharing;
    const double comm = band + latency;
    sum_compute += compute, out.bandwidth += band, out.latency += latency;
    // the overlap the pipeline gets: each chunk's min(comm, compute), but the first chunk's (its
    // prologue: nothing before it to hide behind), as the plan's total counts it
    if (o.window > 1) hidden += m.overlap * std::min(comm, compute) - (first ? m.overlap * std::min(comm, compute) : 0.0);
    first = false;
  }
  const double comm_total = out.bandwidth + out.latency;
  if (o.window > 1) {
    // with chunks in flight a rank runs ahead of the others by up to `window` chunks, so a chunk's
    // imbalance (one rank's matrix larger than another's) is absorbed by the next ones: compute is
    // the busiest rank's total, not the sum of each chunk's busiest (measured: docs/plan.md)
    double busiest = 0;
    for (double x : rank_compute) busiest = std::max(busiest, x);
    out.compute = busiest * out.time_sharing;
    out.pipeline = out.compute + comm_total - std::min({hidden, out.compute, comm_total});
  } else {
    out.compute = sum_compute;
    out.pipeline = sum_compute + comm_total;
  }
  // elementwise passes of every rank's local shards
  double worst = 0;
  std::vector<double> elem_bytes(pack_bytes);
  for (size_t i = 0; i < inv.params.size(); ++i) {
    const bool muon = plan.entry_of(static_cast<int>(i)) != nullptr;
    const double per = muon ? kMomentumBytesPerElem + kUpdateBytesPerElem : kAdamWBytesPerElem;
    for (int r = 0; r < w; ++r) elem_bytes[static_cast<size_t>(r)] += per * static_cast<double>(plan.local_box(static_cast<int>(i), r).numel());
  }
  for (double b : elem_bytes) worst = std::max(worst, b);
  out.elementwise = m.memory_Bps > 0 ? worst / m.memory_Bps * out.time_sharing : 0.0;
  out.step = out.pipeline + out.elementwise;
  return out;
}

}  // namespace meshmuon
