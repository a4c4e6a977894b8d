// Internal: the cost model's per-rank contributions of one plan entry, as templates so that the
// planner's hot loops inline their visitor (cost_model.h wraps them in std::function for exec).
// visit_entry gives flops and buffers; the bytes come from the entry's transfers (plan/transfers.h,
// the same list the executor runs), summed by transfer_bytes.
// Work: O(holders · replicas) for local, expert_local, owner_a2a and expert_subgroup; O(group ·
// replicas) for allgather, agrs and gram_allreduce, whose every group rank takes part.
#pragma once

#include <algorithm>
#include <vector>

#include "meshmuon/plan.h"
#include "plan/shard_table.h"
#include "plan/transfers.h"

namespace meshmuon::detail {

// One rank's share of one entry. *_rep: the part that crosses replicate dims (HSDP split scatter).
struct Contribution {
  double sent = 0, recv = 0, sent_rep = 0, recv_rep = 0, flops = 0, buffer = 0;
};

// Flops and buffers of every rank `e` touches (bytes: transfer_bytes).
template <class F>
void visit_entry(const PlanEntry& e, const ShardTable& t, const ParamSpec& p, const PlanOptions& o, F&& fn) {
  const double B = static_cast<double>(dtype_size(o.comm_dtype)), F4 = 4.0;
  const double U = static_cast<double>(t.unit_numel), f = e.unit_flops;
  const auto holders = [&](int64_t u, auto&& body) {
    for (int64_t h = t.holder_offsets[static_cast<size_t>(u)]; h < t.holder_offsets[static_cast<size_t>(u) + 1]; ++h)
      body(t.holders[static_cast<size_t>(h)], static_cast<double>(t.holder_elems[static_cast<size_t>(h)]));
  };
  const auto at = [](double flops, double buffer) { return Contribution{0, 0, 0, 0, flops, buffer}; };
  switch (e.strategy) {
    case Strategy::Local:
    case Strategy::ExpertLocal:
      for (int64_t u = 0; u < t.units; ++u)
        holders(u, [&](int k, double) {
          for (int j = 0; j < t.r; ++j) fn(t.rank(j, k), at(f, U * F4));
        });
      return;
    case Strategy::AllGather: {
      const double P = U * static_cast<double>(t.units);
      for (int k = 0; k < t.g; ++k)
        for (int j = 0; j < t.r; ++j) fn(t.rank(j, k), at(f * static_cast<double>(t.units), P * (F4 + B)));
      return;
    }
    case Strategy::ExpertSubgroup:
      for (int64_t u = 0; u < t.units; ++u)
        holders(u, [&](int k, double) {
          for (int j = 0; j < t.r; ++j) fn(t.rank(j, k), at(f, U * (F4 + B)));
        });
      return;
    case Strategy::GramAllReduce: {
      const double s = static_cast<double>(std::min(p.rows(), p.cols()));
      const int64_t short_side = std::min(p.rows(), p.cols());
      for (int k = 0; k < t.g; ++k) {
        const int64_t local_long = t.numel[static_cast<size_t>(k)] / std::max<int64_t>(1, short_side);
        const double flops = ns_flops(short_side, local_long, o.ns);
        const double buf = 2 * s * s * F4 + static_cast<double>(t.numel[static_cast<size_t>(k)]) * F4;
        for (int j = 0; j < t.r; ++j) fn(t.rank(j, k), at(flops, buf));
      }
      return;
    }
    case Strategy::Agrs:
      for (int64_t u = 0; u < t.units; ++u) {
        const int o_k = e.owner_index[static_cast<size_t>(u)];
        for (int k = 0; k < t.g; ++k)
          for (int j = 0; j < t.r; ++j) fn(t.rank(j, k), at(k == o_k ? f : 0, 2 * U * B + (k == o_k ? U * F4 : 0)));
      }
      return;
    case Strategy::OwnerA2A:
      for (int64_t u = 0; u < t.units; ++u) {
        const int o_k = e.owner_index[static_cast<size_t>(u)];
        if (!e.replica_split) {
          for (int j = 0; j < t.r; ++j) {
            holders(u, [&](int k, double n) { if (k != o_k) fn(t.rank(j, k), at(0, n * B)); });
            fn(t.rank(j, o_k), at(f, U * (F4 + B)));
          }
          continue;
        }
        const int rho = e.owner_replica[static_cast<size_t>(u)];
        for (int j = 0; j < t.r; ++j)
          holders(u, [&](int k, double n) { if (j != rho || k != o_k) fn(t.rank(j, k), at(0, n * B)); });
        fn(t.rank(rho, o_k), at(f, U * (F4 + B)));
      }
      return;
  }
}

// Turns transfer items into per-rank byte contributions.
template <class F>
struct BytesSink {
  static constexpr bool kAssemblies = false;
  F& fn;
  size_t elem;
  void add(int r, double s, double rv, double sr, double rr) { fn(r, Contribution{s, rv, sr, rr, 0, 0}); }
  void p2p(const P2pTransfer& x) { bytes_of(x, elem, [&](int r, double s, double rv, double sr, double rr) { add(r, s, rv, sr, rr); }); }
  void group(const GroupTransfer& x) { bytes_of(x, elem, [&](int r, double s, double rv, double sr, double rr) { add(r, s, rv, sr, rr); }); }
  void exchange(const Exchange& x) { bytes_of(x, elem, [&](int r, double s, double rv, double sr, double rr) { add(r, s, rv, sr, rr); }); }
};

// The bytes of `e`'s transfers (vt: the NorMuon state's table, or null when no state travels).
template <class F>
void transfer_bytes(const PlanEntry& e, const ShardTable& t, const ShardTable* vt, const ParamSpec& p, const PlanOptions& o,
                    F&& fn) {
  BytesSink<F> sink{fn, dtype_size(o.comm_dtype)};
  for_each_transfer(e, t, vt, p, o.ns.steps, sink);
}

}  // namespace meshmuon::detail
