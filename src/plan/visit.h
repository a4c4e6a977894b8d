// Internal: the cost model's per-rank contributions of one plan entry, as templates so that the
// planner's hot loops inline their visitor (cost_model.h wraps them in std::function for exec).
// Work: O(holders · replicas) for local, expert_local, owner_a2a and expert_subgroup; O(group ·
// replicas) for allgather, agrs and gram_allreduce, whose every group rank takes part.
#pragma once

#include <algorithm>
#include <vector>

#include "dmuon/plan.h"
#include "plan/shard_table.h"

namespace dmuon::detail {

// One rank's share of one entry. *_rep: the part that crosses replicate dims (HSDP split scatter).
struct Contribution {
  double sent = 0, recv = 0, sent_rep = 0, recv_rep = 0, flops = 0, buffer = 0;
};

// Bytes one rank of `size` sends (= receives) in an all-reduce of `count` elements: comm's
// comm_bytes_all_reduce (reduce-scatter + all-gather of balanced blocks), in O(1).
inline uint64_t all_reduce_bytes(int rank, int size, int64_t count, uint64_t elem_size) {
  const int64_t block = count / size + (rank < count % size ? 1 : 0);
  return static_cast<uint64_t>(count - block) * elem_size +
         static_cast<uint64_t>(block) * static_cast<uint64_t>(size - 1) * elem_size;
}

template <class F>
void visit_entry(const PlanEntry& e, const ShardTable& t, const ParamSpec& p, const PlanOptions& o, F&& fn) {
  const double B = static_cast<double>(dtype_size(o.comm_dtype)), F4 = 4.0;
  const double U = static_cast<double>(t.unit_numel), f = e.unit_flops;
  const auto holders = [&](int64_t u, auto&& body) {
    for (int64_t h = t.holder_offsets[static_cast<size_t>(u)]; h < t.holder_offsets[static_cast<size_t>(u) + 1]; ++h)
      body(t.holders[static_cast<size_t>(h)], static_cast<double>(t.holder_elems[static_cast<size_t>(h)]));
  };
  switch (e.strategy) {
    case Strategy::Local:
    case Strategy::ExpertLocal:
      for (int64_t u = 0; u < t.units; ++u)
        holders(u, [&](int k, double) {
          for (int j = 0; j < t.r; ++j) fn(t.rank(j, k), Contribution{0, 0, 0, 0, f, U * F4});
        });
      return;
    case Strategy::AllGather: {
      const double P = U * static_cast<double>(t.units);
      for (int k = 0; k < t.g; ++k) {
        // all-gather: a rank sends its shard to each of the g−1 others and receives what it lacks
        const double n = static_cast<double>(t.numel[static_cast<size_t>(k)]);
        const double sent = n * (t.g - 1) * B, recv = (P - n) * B;
        for (int j = 0; j < t.r; ++j)
          fn(t.rank(j, k), Contribution{sent, recv, 0, 0, f * static_cast<double>(t.units), P * (F4 + B)});
      }
      return;
    }
    case Strategy::ExpertSubgroup:
      for (int64_t u = 0; u < t.units; ++u) {
        const double h = static_cast<double>(t.holder_offsets[static_cast<size_t>(u) + 1] - t.holder_offsets[static_cast<size_t>(u)]);
        holders(u, [&](int k, double n) {  // each holder sends its part to the h−1 other holders
          for (int j = 0; j < t.r; ++j) fn(t.rank(j, k), Contribution{n * (h - 1) * B, (U - n) * B, 0, 0, f, U * (F4 + B)});
        });
      }
      return;
    case Strategy::GramAllReduce: {
      const double s = static_cast<double>(std::min(p.rows(), p.cols()));
      const int64_t short_side = std::min(p.rows(), p.cols());
      for (int k = 0; k < t.g; ++k) {
        // one all-reduce of the s×s fp32 Gram matrix per step (comm's all-reduce accounting)
        const double ar = o.ns.steps * static_cast<double>(all_reduce_bytes(k, t.g, static_cast<int64_t>(s * s), 4));
        const int64_t local_long = t.numel[static_cast<size_t>(k)] / std::max<int64_t>(1, short_side);
        const double flops = ns_flops(short_side, local_long, o.ns);
        const double buf = 2 * s * s * F4 + static_cast<double>(t.numel[static_cast<size_t>(k)]) * F4;
        for (int j = 0; j < t.r; ++j) fn(t.rank(j, k), Contribution{ar, ar, 0, 0, flops, buf});
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
            fn(t.rank(j, k), Contribution{moved, moved, 0, 0, k == o_k ? f : 0, 2 * U * B + (k == o_k ? U * F4 : 0)});
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
            holders(u, [&](int k, double n) { if (k != o_k) fn(t.rank(j, k), Contribution{n * B, n * B, 0, 0, 0, n * B}); });
            fn(t.rank(j, o_k), Contribution{(U - own) * B, (U - own) * B, 0, 0, f, U * (F4 + B)});
          }
          continue;
        }
        const int rho = e.owner_replica[static_cast<size_t>(u)];
        const double R = static_cast<double>(t.r);
        for (int j = 0; j < t.r; ++j)
          holders(u, [&](int k, double n) {
            if (j == rho && k == o_k) return;
            const bool cross = j != rho;  // result arrives from another replica group
            fn(t.rank(j, k), Contribution{j == rho ? n * B : 0, n * B, 0, cross ? n * B : 0, 0, n * B});
          });
        const double sent = (U - own) * B + (R - 1) * U * B;  // scatter to its group and to every other replica
        fn(t.rank(rho, o_k), Contribution{sent, (U - own) * B, (R - 1) * U * B, 0, f, U * (F4 + B)});
      }
      return;
  }
}

// Mirrors exec/routes.cpp: the state moves with the data (same pairs), holder-side counts from the
// state tensor's own boxes; fp32 whatever the comm dtype. `vt` is the state tensor's table.
template <class F>
void visit_state_entry(const PlanEntry& e, const ShardTable& t, const ShardTable& vt, F&& fn) {
  constexpr double F4 = 4.0;
  std::vector<double> v(static_cast<size_t>(t.g));  // state elements per group position, one unit
  int64_t loaded = -1;                                // the unit whose holders v holds
  const auto state_holders = [&](int64_t u, auto&& body) {
    for (int64_t h = vt.holder_offsets[static_cast<size_t>(u)]; h < vt.holder_offsets[static_cast<size_t>(u) + 1]; ++h)
      body(vt.holders[static_cast<size_t>(h)]);
  };
  const auto load = [&](int64_t u) {  // O(holders): clear the previous unit's entries only
    if (loaded >= 0) state_holders(loaded, [&](int k) { v[static_cast<size_t>(k)] = 0.0; });
    loaded = u;
    double total = 0;
    for (int64_t h = vt.holder_offsets[static_cast<size_t>(u)]; h < vt.holder_offsets[static_cast<size_t>(u) + 1]; ++h) {
      const double x = static_cast<double>(vt.holder_elems[static_cast<size_t>(h)]);
      v[static_cast<size_t>(vt.holders[static_cast<size_t>(h)])] = x;
      total += x;
    }
    return total;
  };
  const auto vk = [&](int k) { return v[static_cast<size_t>(k)] * F4; };
  switch (e.strategy) {
    case Strategy::OwnerA2A:
      for (int64_t u = 0; u < t.units; ++u) {
        const double V = load(u) * F4;
        const int o_k = e.owner_index[static_cast<size_t>(u)];
        if (!e.replica_split) {
          for (int j = 0; j < t.r; ++j) {
            state_holders(u, [&](int k) { if (k != o_k) fn(t.rank(j, k), Contribution{vk(k), vk(k), 0, 0, 0, 0}); });
            fn(t.rank(j, o_k), Contribution{V - vk(o_k), V - vk(o_k), 0, 0, 0, 0});
          }
          continue;
        }
        const int rho = e.owner_replica[static_cast<size_t>(u)];
        const double R = static_cast<double>(t.r);
        for (int j = 0; j < t.r; ++j)
          state_holders(u, [&](int k) {
            if (j == rho && k == o_k) return;
            fn(t.rank(j, k), Contribution{j == rho ? vk(k) : 0, vk(k), 0, j != rho ? vk(k) : 0, 0, 0});
          });
        fn(t.rank(rho, o_k), Contribution{(V - vk(o_k)) + (R - 1) * V, V - vk(o_k), (R - 1) * V, 0, 0, 0});
      }
      return;
    case Strategy::AllGather:
      for (int64_t u = 0; u < t.units; ++u) {
        const double V = load(u) * F4;
        for (int j = 0; j < t.r; ++j)
          for (int k = 0; k < t.g; ++k) fn(t.rank(j, k), Contribution{vk(k) * (t.g - 1), V - vk(k), 0, 0, 0, 0});
      }
      return;
    case Strategy::Agrs: {
      const double V = load(0) * F4;
      const int o_k = e.owner_index[0];
      for (int j = 0; j < t.r; ++j) {
        for (int k = 0; k < t.g; ++k)
          if (k != o_k) fn(t.rank(j, k), Contribution{vk(k), vk(k), 0, 0, 0, 0});  // to the owner, and back
        fn(t.rank(j, o_k), Contribution{V - vk(o_k), V - vk(o_k), 0, 0, 0, 0});
      }
      return;
    }
    case Strategy::ExpertSubgroup:
      for (int64_t u = 0; u < t.units; ++u) {
        load(u);
        double sum = 0;  // the unit's data holders exchange their state
        const int64_t h0 = t.holder_offsets[static_cast<size_t>(u)], h1 = t.holder_offsets[static_cast<size_t>(u) + 1];
        for (int64_t h = h0; h < h1; ++h) sum += vk(t.holders[static_cast<size_t>(h)]);
        const double n = static_cast<double>(h1 - h0);
        for (int j = 0; j < t.r; ++j)
          for (int64_t h = h0; h < h1; ++h) {
            const int k = t.holders[static_cast<size_t>(h)];
            fn(t.rank(j, k), Contribution{vk(k) * (n - 1), sum - vk(k), 0, 0, 0, 0});
          }
      }
      return;
    default:
      return;  // local, expert_local: nothing moves; gram_allreduce does not support NorMuon
  }
}

// visit_entry, plus visit_state_entry when options.normuon marks the entry's parameter.
template <class F>
void visit_all_entry(const PlanEntry& e, ShardTables& tables, const Inventory& inv, const PlanOptions& o, F&& fn) {
  const ShardTable& t = tables.get(e.param);
  visit_entry(e, t, inv.params[static_cast<size_t>(e.param)], o, fn);
  if (static_cast<size_t>(e.param) < o.normuon.size() && o.normuon[static_cast<size_t>(e.param)])
    visit_state_entry(e, t, tables.get_state(e.param), fn);
}

}  // namespace dmuon::detail
