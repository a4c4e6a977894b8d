// Internal: what moves for one plan entry, enumerated in ONE place for the planner and the executor.
//
// `for_each_transfer` lists an entry's messages (point-to-point, between two world ranks) and its
// group collectives (an all-gather, reduce-scatter or all-reduce over the entry's shard group in one
// replica group), with the payload (data in the comm dtype, fp32 NorMuon state, fp32 Gram matrices),
// the phase (gather before the orthogonalization, scatter after) and element counts; and, for the
// executor, which ranks assemble which unit and compute it. The planner's byte accounting sums these
// items (plan/accounting.cpp via bytes_of); the executor takes the items its rank is part of once, at
// construction, and turns them into pack tables (exec/routes.cpp). Flops, buffers and latency stay in
// the cost model (plan/visit.h, cost_model.cpp).
//
// Order: items come out in a fixed order that depends only on the plan (entry, unit, replica, group
// position), so the sender and the receiver of a message see it at the same place in their streams.
//
// Work: O(holders · replicas) per entry for the point-to-point strategies, O(replicas) items for the
// group collectives (each item carries the g per-position counts by reference): never O(group²).
// owner_a2a's messages come as one Star per unit and replica group to sinks that take stars (the
// planner's accounting: no message objects, half the per-rank updates); every other sink (the
// executor) gets the star's messages, in the same place of the stream.
//
// Adding a strategy: its case here (what moves, who computes), its `applies` rule and latency in
// cost_model.cpp, its flops and buffers in visit.h (docs/architecture.md, "How to add a strategy").
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "meshmuon/plan.h"
#include "plan/shard_table.h"

namespace meshmuon::detail {

enum class Phase : uint8_t { Gather, Scatter };
enum class Payload : uint8_t { Data, State, Gram };  // comm dtype / fp32 NorMuon state / fp32 Gram
enum class Channel : uint8_t { PointToPoint, AllGather, ReduceScatter, AllReduce };

// One message: `count` elements of unit `unit` from world rank src to world rank dst. The elements
// are those the holder (src in the gather, dst in the scatter) has of the unit, in its local order.
struct P2pTransfer {
  Phase phase = Phase::Gather;
  Payload payload = Payload::Data;
  int64_t unit = 0;
  int src = 0, dst = 0;
  int64_t count = 0;
  bool cross_replica = false;  // src and dst sit in different replica groups (HSDP split scatter)
};

// One collective over the entry's shard group of replica group `replica` (world rank of position k:
// table.rank(replica, k)). AllGather: position k contributes counts[k] elements (its local shard,
// every unit) and receives everyone's. ReduceScatter: every position sends the whole, position k
// receives counts[k]. AllReduce: `calls` all-reduces of `count` elements each.
struct GroupTransfer {
  Channel channel = Channel::AllGather;
  Phase phase = Phase::Gather;
  Payload payload = Payload::Data;
  int replica = 0;
  const ShardTable* table = nullptr;
  std::span<const int64_t> counts;  // per group position (AllGather, ReduceScatter)
  int64_t total = 0;                // the sum of counts (the whole tensor: positions partition it)
  int64_t count = 0;                // AllReduce
  int calls = 1;
};

// An all-pairs exchange among a subset of the shard group, as point-to-point messages: member i
// (group position members[i] of replica group `replica`) sends its counts[i] elements of the unit to
// every other member. Equivalent to one message per ordered pair (a, b), a != b, in the order a,
// then b; listed as one item so that accounting costs O(members), not O(members²).
struct Exchange {
  Phase phase = Phase::Gather;
  Payload payload = Payload::Data;
  int64_t unit = 0;
  int replica = 0;
  const ShardTable* table = nullptr;
  std::span<const int32_t> members;
  std::span<const int64_t> counts;  // per member (may be 0)
};

// Positions holding data (table t) or NorMuon state (vt, may be null) of unit u, increasing, with
// both counts: body(k, n, vn) (a merge of two CSR rows).
template <class Body>
void for_each_holder(const ShardTable& t, const ShardTable* vt, int64_t u, Body&& body) {
  const size_t d0 = static_cast<size_t>(t.holder_offsets[static_cast<size_t>(u)]);
  const size_t d1 = static_cast<size_t>(t.holder_offsets[static_cast<size_t>(u) + 1]);
  size_t s0 = 0, s1 = 0;
  if (vt) {
    s0 = static_cast<size_t>(vt->holder_offsets[static_cast<size_t>(u)]);
    s1 = static_cast<size_t>(vt->holder_offsets[static_cast<size_t>(u) + 1]);
  }
  if (s0 == s1) {  // no state: the data row alone
    for (size_t a = d0; a < d1; ++a) body(static_cast<int>(t.holders[a]), t.holder_elems[a], int64_t{0});
    return;
  }
  size_t a = d0, b = s0;
  while (a < d1 || b < s1) {
    const int ka = a < d1 ? t.holders[a] : INT32_MAX, kb = b < s1 ? vt->holders[b] : INT32_MAX;
    const int k = std::min(ka, kb);
    const int64_t n = ka == k ? t.holder_elems[a++] : int64_t{0};
    const int64_t vn = kb == k ? vt->holder_elems[b++] : int64_t{0};
    body(k, n, vn);
  }
}

// owner_a2a's messages for one unit and one replica group of holders, as one item: every holder k
// (group position of replica group `replica`, increasing; position `skip` left out) sends its n data
// and vn state elements of the unit to world rank `owner` (gather) and/or gets them back (scatter).
// Equivalent to, per holder in order: [gather: data k→owner, state k→owner] then [scatter: data
// owner→k, state owner→k], each message only when its count is > 0, with cross_replica = `cross`
// (for_each_message lists them). Listed as one item so that accounting costs O(holders) with no
// message objects; sinks without star() get the messages.
struct Star {
  bool gather = true, scatter = true;
  bool cross = false;
  int64_t unit = 0;
  int replica = 0;
  int owner = 0;
  int skip = -1;
  const ShardTable* table = nullptr;  // data
  const ShardTable* state = nullptr;  // NorMuon state, or null
};

template <class F>
void for_each_message(const Star& x, F&& f) {
  const ShardTable& t = *x.table;
  for_each_holder(t, x.state, x.unit, [&](int k, int64_t n, int64_t vn) {
    if (k == x.skip) return;
    const int h = t.rank(x.replica, k);
    if (x.gather) {
      if (n > 0) f(P2pTransfer{Phase::Gather, Payload::Data, x.unit, h, x.owner, n, x.cross});
      if (vn > 0) f(P2pTransfer{Phase::Gather, Payload::State, x.unit, h, x.owner, vn, x.cross});
    }
    if (x.scatter) {
      if (n > 0) f(P2pTransfer{Phase::Scatter, Payload::Data, x.unit, x.owner, h, n, x.cross});
      if (vn > 0) f(P2pTransfer{Phase::Scatter, Payload::State, x.unit, x.owner, h, vn, x.cross});
    }
  });
}

// A rank that holds the whole unit after the gather: computes it (`compute`), has elements of it
// (`holder`), and takes its own elements of the result from this assembly (`result_local`).
struct UnitAssembly {
  int64_t unit = 0;
  int rank = 0;
  bool compute = false, holder = false, result_local = false;
};

// Sinks provide p2p(const P2pTransfer&), group(const GroupTransfer&), exchange(const Exchange&), and when
// `Sink::kAssemblies` is true, assemble(const UnitAssembly&). A sink with star(const Star&) gets owner
// stars as one item each; any other gets their messages (for_each_message), in the same place.
template <class Sink>
void for_each_transfer(const PlanEntry& e, const ShardTable& t, const ShardTable* vt, const ParamSpec& p, int ns_steps,
                       Sink&& sink) {
  constexpr bool kAsm = std::remove_reference_t<Sink>::kAssemblies;
  const auto span_of = [](const ShardTable& tb, int64_t u) {
    const size_t b = static_cast<size_t>(tb.holder_offsets[static_cast<size_t>(u)]);
    const size_t n = static_cast<size_t>(tb.holder_offsets[static_cast<size_t>(u) + 1]) - b;
    return std::pair{std::span(tb.holders).subspan(b, n), std::span(tb.holder_elems).subspan(b, n)};
  };
  // Positions holding data or state of unit u, increasing, with both counts (merge of two CSR rows).
  const auto holders = [&](int64_t u, auto&& body) { for_each_holder(t, vt, u, body); };
  const auto star = [&](const Star& x) {
    if constexpr (requires { sink.star(x); }) sink.star(x);
    else for_each_message(x, [&](const P2pTransfer& m) { sink.p2p(m); });
  };
  const auto both = [&](Phase ph, int64_t u, int src, int dst, int64_t n, int64_t vn, bool cross) {
    if (n > 0) sink.p2p(P2pTransfer{ph, Payload::Data, u, src, dst, n, cross});
    if (vn > 0) sink.p2p(P2pTransfer{ph, Payload::State, u, src, dst, vn, cross});
  };
  const auto data_held = [&](int64_t u, int k) {
    const auto [dh, dn] = span_of(t, u);
    const auto it = std::lower_bound(dh.begin(), dh.end(), k);
    return it != dh.end() && *it == k;
  };
  switch (e.strategy) {
    case Strategy::Local:
    case Strategy::ExpertLocal:
      if constexpr (kAsm)
        for (int j = 0; j < t.r; ++j)
          for (int64_t u = 0; u < t.units; ++u) {
            const auto [dh, dn] = span_of(t, u);
            for (int k : dh) sink.assemble(UnitAssembly{u, t.rank(j, k), true, true, true});
          }
      return;
    case Strategy::GramAllReduce: {
      const int64_t s = std::min(p.rows(), p.cols());
      for (int j = 0; j < t.r; ++j)
        sink.group(GroupTransfer{Channel::AllReduce, Phase::Gather, Payload::Gram, j, &t, {}, 0, s * s, ns_steps});
      return;
    }
    case Strategy::AllGather:
      for (int j = 0; j < t.r; ++j) {
        sink.group(GroupTransfer{Channel::AllGather, Phase::Gather, Payload::Data, j, &t, t.numel, t.units * t.unit_numel, 0, 1});
        if (vt) sink.group(GroupTransfer{Channel::AllGather, Phase::Gather, Payload::State, j, vt, vt->numel, vt->units * vt->unit_numel, 0, 1});
        if constexpr (kAsm)
          for (int64_t u = 0; u < t.units; ++u)
            for (int k = 0; k < t.g; ++k) {  // every member assembles every unit; its holders compute it
              const bool mine = data_held(u, k);
              sink.assemble(UnitAssembly{u, t.rank(j, k), mine, mine, true});
            }
      }
      return;
    case Strategy::Agrs: {  // one matrix: all-gather, the owner computes, reduce-scatter of the result
      const int o_k = e.owner_index[0];
      for (int j = 0; j < t.r; ++j) {
        const int o = t.rank(j, o_k);
        sink.group(GroupTransfer{Channel::AllGather, Phase::Gather, Payload::Data, j, &t, t.numel, t.units * t.unit_numel, 0, 1});
        holders(0, [&](int k, int64_t, int64_t vn) {  // state to the owner and back
          if (k != o_k) both(Phase::Gather, 0, t.rank(j, k), o, 0, vn, false);
        });
        sink.group(GroupTransfer{Channel::ReduceScatter, Phase::Scatter, Payload::Data, j, &t, t.numel, t.units * t.unit_numel, 0, 1});
        holders(0, [&](int k, int64_t, int64_t vn) {
          if (k != o_k) both(Phase::Scatter, 0, o, t.rank(j, k), 0, vn, false);
        });
        if constexpr (kAsm)
          for (int k = 0; k < t.g; ++k)
            sink.assemble(UnitAssembly{0, t.rank(j, k), k == o_k, data_held(0, k), false});
      }
      return;
    }
    case Strategy::OwnerA2A:
      for (int64_t u = 0; u < t.units; ++u) {
        const int o_k = e.owner_index[static_cast<size_t>(u)];
        if (!e.replica_split) {
          for (int j = 0; j < t.r; ++j) {
            const int o = t.rank(j, o_k);
            // in and back out, holder by holder (phases keep their own order)
            star(Star{true, true, false, u, j, o, o_k, &t, vt});
            if constexpr (kAsm) sink.assemble(UnitAssembly{u, o, true, data_held(u, o_k), true});
          }
          continue;
        }
        // replica split: the owning replica group gathers and computes; the result goes to the
        // holders of every replica group
        const int rho = e.owner_replica[static_cast<size_t>(u)];
        const int o = t.rank(rho, o_k);
        star(Star{true, false, false, u, rho, o, o_k, &t, vt});
        for (int j = 0; j < t.r; ++j) star(Star{false, true, j != rho, u, j, o, j == rho ? o_k : -1, &t, vt});
        if constexpr (kAsm) sink.assemble(UnitAssembly{u, o, true, data_held(u, o_k), true});
      }
      return;
    case Strategy::ExpertSubgroup: {  // each expert's holders exchange their parts and all compute it
      std::vector<int64_t> vcounts;
      for (int64_t u = 0; u < t.units; ++u) {
        const auto [dh, dn] = span_of(t, u);
        if (vt) {  // each data holder's state elements of the unit (0 where it has none)
          vcounts.assign(dh.size(), 0);
          const auto [sh, sn] = span_of(*vt, u);
          for (size_t a = 0; a < dh.size(); ++a) {
            const auto it = std::lower_bound(sh.begin(), sh.end(), dh[a]);
            if (it != sh.end() && *it == dh[a]) vcounts[a] = sn[static_cast<size_t>(it - sh.begin())];
          }
        }
        for (int j = 0; j < t.r; ++j) {
          sink.exchange(Exchange{Phase::Gather, Payload::Data, u, j, &t, dh, dn});
          if (vt) sink.exchange(Exchange{Phase::Gather, Payload::State, u, j, &t, dh, vcounts});
          if constexpr (kAsm)
            for (int k : dh) sink.assemble(UnitAssembly{u, t.rank(j, k), true, true, true});
        }
      }
      return;
    }
  }
}

// Bytes of one rank's part in a transfer item (the comm's counting rules, comm.h): fn(rank, sent,
// recv, sent_cross_replica, recv_cross_replica) for every rank the item touches.
// Bytes one rank of `size` sends (= receives) in an all-reduce of `count` elements: comm's
// comm_bytes_all_reduce (reduce-scatter + all-gather of balanced blocks), in O(1).
inline uint64_t all_reduce_bytes(int rank, int size, int64_t count, uint64_t elem_size) {
  const int64_t block = count / size + (rank < count % size ? 1 : 0);
  return static_cast<uint64_t>(count - block) * elem_size +
         static_cast<uint64_t>(block) * static_cast<uint64_t>(size - 1) * elem_size;
}

template <class F>
void bytes_of(const P2pTransfer& x, size_t elem, F&& fn) {
  const double b = static_cast<double>(x.count) * static_cast<double>(x.payload == Payload::Data ? elem : 4);
  fn(x.src, b, 0.0, x.cross_replica ? b : 0.0, 0.0);
  fn(x.dst, 0.0, b, 0.0, x.cross_replica ? b : 0.0);
}

template <class F>
void bytes_of(const GroupTransfer& x, size_t elem, F&& fn) {
  const ShardTable& t = *x.table;
  const double B = static_cast<double>(x.payload == Payload::Data ? elem : 4);
  const double g = static_cast<double>(t.g);
  if (x.channel == Channel::AllReduce) {  // reduce-scatter + all-gather of balanced blocks
    for (int k = 0; k < t.g; ++k) {
      const double b = x.calls * static_cast<double>(all_reduce_bytes(k, t.g, x.count, 4));
      fn(t.rank(x.replica, k), b, b, 0.0, 0.0);
    }
    return;
  }
  const double total = static_cast<double>(x.total);
  for (int k = 0; k < t.g; ++k) {
    const double n = static_cast<double>(x.counts[static_cast<size_t>(k)]);
    const double own_out = n * (g - 1) * B, others = (total - n) * B;
    if (x.channel == Channel::AllGather) fn(t.rank(x.replica, k), own_out, others, 0.0, 0.0);
    else fn(t.rank(x.replica, k), others, own_out, 0.0, 0.0);  // reduce-scatter
  }
}

// Per holder: fn(holder, ...) then fn(owner, ...), data before state; each rank's fields receive the
// same additions in the same order as from bytes_of over for_each_message(x) (message bytes are
// summed per rank, so the results are equal bit for bit). Returns whether any message moves.
template <class F>
bool bytes_of(const Star& x, size_t elem, F&& fn) {
  const ShardTable& t = *x.table;
  const double B = static_cast<double>(elem), cg = x.gather ? 1.0 : 0.0, cs = x.scatter ? 1.0 : 0.0;
  bool any = false;
  for_each_holder(t, x.state, x.unit, [&](int k, int64_t n, int64_t vn) {
    if (k == x.skip) return;
    const int h = t.rank(x.replica, k);
    if (n > 0) {
      const double b = static_cast<double>(n) * B, out = cg * b, in = cs * b;
      fn(h, out, in, x.cross ? out : 0.0, x.cross ? in : 0.0);
      fn(x.owner, in, out, x.cross ? in : 0.0, x.cross ? out : 0.0);
      any = true;
    }
    if (vn > 0) {
      const double b = static_cast<double>(vn) * 4.0, out = cg * b, in = cs * b;
      fn(h, out, in, x.cross ? out : 0.0, x.cross ? in : 0.0);
      fn(x.owner, in, out, x.cross ? in : 0.0, x.cross ? out : 0.0);
      any = true;
    }
  });
  return any;
}

template <class F>
void bytes_of(const Exchange& x, size_t elem, F&& fn) {
  const double B = static_cast<double>(x.payload == Payload::Data ? elem : 4);
  double total = 0;
  for (int64_t n : x.counts) total += static_cast<double>(n);
  const double others = static_cast<double>(x.members.size()) - 1;
  for (size_t i = 0; i < x.members.size(); ++i) {
    const double n = static_cast<double>(x.counts[i]);
    fn(x.table->rank(x.replica, x.members[i]), n * others * B, (total - n) * B, 0.0, 0.0);
  }
}

// The sums over every rank of bytes_of(x): (sent, recv), in O(1).
inline std::pair<double, double> bytes_total(const GroupTransfer& x, size_t elem) {
  const double B = static_cast<double>(x.payload == Payload::Data ? elem : 4);
  const double g1 = static_cast<double>(x.table->g - 1);
  const double b = x.channel == Channel::AllReduce ? 2.0 * x.calls * static_cast<double>(x.count) * g1 * B
                                                   : static_cast<double>(x.total) * g1 * B;
  return {b, b};
}

}  // namespace meshmuon::detail
