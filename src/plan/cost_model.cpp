// Internal: the cost model's per-rank accounting of each strategy (docs/plan.md, "cost model").
#include "plan/cost_model.h"

#include <cmath>

#include "dmuon/comm.h"

namespace dmuon::detail {
namespace {

double log2_steps(int g) { return g <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(g))); }

}  // namespace

bool applies(Strategy s, const ParamSpec& p, const ShardTable& t) {
  switch (s) {
    case Strategy::Local: return !p.expert && t.whole_units;
    case Strategy::ExpertLocal: return p.expert && t.whole_units;
    case Strategy::OwnerA2A: return t.g > 1;
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
  const double B = static_cast<double>(dtype_size(o.comm_dtype)), F = 4.0;
  const double U = static_cast<double>(t.unit_numel), f = e.unit_flops;
  const auto holders = [&](int64_t u, auto&& body) {
    for (int32_t h = t.holder_offsets[static_cast<size_t>(u)]; h < t.holder_offsets[static_cast<size_t>(u) + 1]; ++h)
      body(t.holders[static_cast<size_t>(h)], static_cast<double>(t.holder_elems[static_cast<size_t>(h)]));
  };
  switch (e.strategy) {
    case Strategy::Local:
    case Strategy::ExpertLocal:
      for (int64_t u = 0; u < t.units; ++u)
        holders(u, [&](int k, double) {
          for (int j = 0; j < t.r; ++j) fn(t.rank(j, k), {0, 0, 0, 0, f, U * F});
        });
      return;
    case Strategy::AllGather: {
      const double P = U * static_cast<double>(t.units);
      for (int k = 0; k < t.g; ++k) {
        // all-gather: a rank sends its shard to each of the g−1 others and receives what it lacks
        const double n = static_cast<double>(t.numel[static_cast<size_t>(k)]);
        const double sent = n * (t.g - 1) * B, recv = (P - n) * B;
        for (int j = 0; j < t.r; ++j) fn(t.rank(j, k), {sent, recv, 0, 0, f * static_cast<double>(t.units), P * (F + B)});
      }
      return;
    }
    case Strategy::ExpertSubgroup:
      for (int64_t u = 0; u < t.units; ++u) {
        const double h = t.holder_offsets[static_cast<size_t>(u) + 1] - t.holder_offsets[static_cast<size_t>(u)];
        holders(u, [&](int k, double n) {  // each holder sends its part to the h−1 other holders
          for (int j = 0; j < t.r; ++j) fn(t.rank(j, k), {n * (h - 1) * B, (U - n) * B, 0, 0, f, U * (F + B)});
        });
      }
      return;
    case Strategy::GramAllReduce: {
      const double s = static_cast<double>(std::min(p.rows(), p.cols()));
      for (int k = 0; k < t.g; ++k) {
        // one all-reduce of the s×s fp32 Gram matrix per step (comm's all-reduce accounting)
        const double ar = o.ns.steps * static_cast<double>(comm_bytes_all_reduce(k, t.g, static_cast<int64_t>(s * s), 4).sent);
        const int64_t local_long = t.numel[static_cast<size_t>(k)] / std::max<int64_t>(1, std::min(p.rows(), p.cols()));
        const double flops = ns_flops(std::min(p.rows(), p.cols()), local_long, o.ns);
        const double buf = 2 * s * s * F + static_cast<double>(t.numel[static_cast<size_t>(k)]) * F;
        for (int j = 0; j < t.r; ++j) fn(t.rank(j, k), {ar, ar, 0, 0, flops, buf});
      }
      return;
    }
    case Strategy::Agrs:
      for (int64_t u = 0; u < t.units; ++u) {
        const int o_k = e.owner_index[static_cast<size_t>(u)];
        for (int k = 0; k < t.g; ++k) {
          // all-gather in (sent n·(g−1), received U−n), reduce-scatter out (sent U−n, received n·(g−1))
          const double n = static_cast<double>(t.numel[static_cast<size_t>(k)]);
          const double moved = (n * (t.g - 1) + (U - n)) * B;
          for (int j = 0; j < t.r; ++j)
            fn(t.rank(j, k), {moved, moved, 0, 0, k == o_k ? f : 0, 2 * U * B + (k == o_k ? U * F : 0)});
        }
      }
      return;
    case Strategy::OwnerA2A:
      for (int64_t u = 0; u < t.units; ++u) {
        const int o_k = e.owner_index[static_cast<size_t>(u)];
        double own = 0;  // elements the owner already holds
        holders(u, [&](int k, double n) { if (k == o_k) own = n; });
        if (!e.replica_split) {
          for (int j = 0; j < t.r; ++j) {
            holders(u, [&](int k, double n) { if (k != o_k) fn(t.rank(j, k), {n * B, n * B, 0, 0, 0, n * B}); });
            fn(t.rank(j, o_k), {(U - own) * B, (U - own) * B, 0, 0, f, U * (F + B)});
          }
          continue;
        }
        const int rho = e.owner_replica[static_cast<size_t>(u)];
        const double R = static_cast<double>(t.r);
        for (int j = 0; j < t.r; ++j)
          holders(u, [&](int k, double n) {
            if (j == rho && k == o_k) return;
            const bool cross = j != rho;  // result arrives from another replica group
            fn(t.rank(j, k), {j == rho ? n * B : 0, n * B, 0, cross ? n * B : 0, 0, n * B});
          });
        const double sent = (U - own) * B + (R - 1) * U * B;  // scatter to its group and to every other replica
        fn(t.rank(rho, o_k), {sent, (U - own) * B, (R - 1) * U * B, 0, f, U * (F + B)});
      }
      return;
  }
}

// Mirrors exec/routes.cpp: the state moves with the data (same pairs), holder-side counts from the
// state tensor's own boxes; fp32 whatever the comm dtype.
void visit_state(const PlanEntry& e, const ShardTable& t, const ShardTable& vt, const Visitor& fn) {
  constexpr double F = 4.0;
  std::vector<double> v(static_cast<size_t>(t.g));  // state elements per group position, one unit
  const auto load = [&](int64_t u) {
    std::fill(v.begin(), v.end(), 0.0);
    for (int32_t h = vt.holder_offsets[static_cast<size_t>(u)]; h < vt.holder_offsets[static_cast<size_t>(u) + 1]; ++h)
      v[static_cast<size_t>(vt.holders[static_cast<size_t>(h)])] = static_cast<double>(vt.holder_elems[static_cast<size_t>(h)]);
    double total = 0;
    for (double x : v) total += x;
    return total;
  };
  const auto vk = [&](int k) { return v[static_cast<size_t>(k)] * F; };
  switch (e.strategy) {
    case Strategy::OwnerA2A:
      for (int64_t u = 0; u < t.units; ++u) {
        const double V = load(u) * F;
        const int o_k = e.owner_index[static_cast<size_t>(u)];
        if (!e.replica_split) {
          for (int j = 0; j < t.r; ++j) {
            for (int k = 0; k < t.g; ++k)
              if (k != o_k && vk(k) > 0) fn(t.rank(j, k), {vk(k), vk(k), 0, 0, 0, 0});
            fn(t.rank(j, o_k), {V - vk(o_k), V - vk(o_k), 0, 0, 0, 0});
          }
          continue;
        }
        const int rho = e.owner_replica[static_cast<size_t>(u)];
        const double R = static_cast<double>(t.r);
        for (int j = 0; j < t.r; ++j)
          for (int k = 0; k < t.g; ++k) {
            if ((j == rho && k == o_k) || vk(k) == 0) continue;
            fn(t.rank(j, k), {j == rho ? vk(k) : 0, vk(k), 0, j != rho ? vk(k) : 0, 0, 0});
          }
        fn(t.rank(rho, o_k), {(V - vk(o_k)) + (R - 1) * V, V - vk(o_k), (R - 1) * V, 0, 0, 0});
      }
      return;
    case Strategy::AllGather:
      for (int64_t u = 0; u < t.units; ++u) {
        const double V = load(u) * F;
        for (int j = 0; j < t.r; ++j)
          for (int k = 0; k < t.g; ++k) fn(t.rank(j, k), {vk(k) * (t.g - 1), V - vk(k), 0, 0, 0, 0});
      }
      return;
    case Strategy::Agrs: {
      const double V = load(0) * F;
      const int o_k = e.owner_index[0];
      for (int j = 0; j < t.r; ++j) {
        for (int k = 0; k < t.g; ++k)
          if (k != o_k) fn(t.rank(j, k), {vk(k), vk(k), 0, 0, 0, 0});  // to the owner, and back
        fn(t.rank(j, o_k), {V - vk(o_k), V - vk(o_k), 0, 0, 0, 0});
      }
      return;
    }
    case Strategy::ExpertSubgroup:
      for (int64_t u = 0; u < t.units; ++u) {
        load(u);
        std::vector<int> hs;  // the unit's data holders exchange their state
        for (int32_t h = t.holder_offsets[static_cast<size_t>(u)]; h < t.holder_offsets[static_cast<size_t>(u) + 1]; ++h)
          hs.push_back(t.holders[static_cast<size_t>(h)]);
        double sum = 0;
        for (int k : hs) sum += vk(k);
        const double n = static_cast<double>(hs.size());
        for (int j = 0; j < t.r; ++j)
          for (int k : hs) fn(t.rank(j, k), {vk(k) * (n - 1), sum - vk(k), 0, 0, 0, 0});
      }
      return;
    default:
      return;  // local, expert_local: nothing moves; gram_allreduce does not support NorMuon
  }
}

void visit_all(const PlanEntry& e, ShardTables& tables, const Inventory& inv, const PlanOptions& o, const Visitor& fn) {
  const ShardTable& t = tables.get(e.param);
  visit(e, t, inv.params[static_cast<size_t>(e.param)], o, fn);
  if (static_cast<size_t>(e.param) < o.normuon.size() && o.normuon[static_cast<size_t>(e.param)])
    visit_state(e, t, tables.get_state(e.param), fn);
}

double amortized_seconds(Strategy s, const ParamSpec& p, const ShardTable& t, bool split, const PlanOptions& o) {
  PlanEntry e;
  e.strategy = s;
  e.replica_split = split && s == Strategy::OwnerA2A && t.r > 1;
  e.unit_flops = ns_flops(p.rows(), p.cols(), o.ns);
  e.owner_index.assign(static_cast<size_t>(t.units), 0);
  e.owner_replica.assign(static_cast<size_t>(t.units), 0);
  double sent = 0, recv = 0, rep = 0, flops = 0;
  visit(e, t, p, o, [&](int, const Contribution& c) {
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
