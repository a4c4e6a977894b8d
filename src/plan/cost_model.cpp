// Internal: the cost model's per-rank accounting of each strategy (docs/plan.md, "cost model").
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

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
