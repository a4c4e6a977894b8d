// Internal: the per-rank accounting of the plan (bytes, flops, peak buffers, collectives, predicted
// seconds); chunks are formed before it (chunks.cpp).
//
// Cost: O(contributions) per entry plus O(world) once per plan (the final reductions); a chunk
// costs O(ranks it touches), never O(world), so small chunks at large worlds stay cheap.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <tuple>

#include "plan/cost_model.h"
#include "plan/planner_steps.h"

#if defined(__GNUC__)
#define MESHMUON_ALWAYS_INLINE __attribute__((always_inline))
#else
#define MESHMUON_ALWAYS_INLINE
#endif

namespace meshmuon::detail {
namespace {

// Per-rank totals, one record per rank (the six fields of Contribution).
struct PerRank {
  std::vector<Contribution> at;
  explicit PerRank(size_t w = 0) : at(w) {}
  void add(int r, const Contribution& c) {
    Contribution& a = at[static_cast<size_t>(r)];
    a.sent += c.sent, a.recv += c.recv, a.sent_rep += c.sent_rep, a.recv_rep += c.recv_rep;
    a.flops += c.flops, a.buffer += c.buffer;
  }
};

double comm_seconds_of(const Contribution& a, const MachineProfile& m) {
  return std::max(a.sent - a.sent_rep, a.recv - a.recv_rep) / m.bandwidth_Bps +
         std::max(a.sent_rep, a.recv_rep) / m.replicate_bandwidth_Bps;
}

// Max and mean over every rank of sent, recv and flops, in one pass (each in rank order; ranks
// without contributions count as 0)
void summarize(const PerRank& pr, CostSummary& s) {
  double smx = 0, ssum = 0, rmx = 0, rsum = 0, fmx = 0, fsum = 0;
  bool first = true;
  for (const Contribution& a : pr.at) {
    smx = first ? a.sent : std::max(smx, a.sent), ssum += a.sent;
    rmx = first ? a.recv : std::max(rmx, a.recv), rsum += a.recv;
    fmx = first ? a.flops : std::max(fmx, a.flops), fsum += a.flops;
    first = false;
  }
  const double n = static_cast<double>(pr.at.size());
  s.bytes_sent_max = smx, s.bytes_sent_mean = pr.at.empty() ? 0 : ssum / n;
  s.bytes_recv_max = rmx, s.bytes_recv_mean = pr.at.empty() ? 0 : rsum / n;
  s.flops_max = fmx, s.flops_mean = pr.at.empty() ? 0 : fsum / n;
}

double comm_seconds_max(const PerRank& pr, const MachineProfile& m) {
  double worst = 0;
  for (const Contribution& a : pr.at) worst = std::max(worst, comm_seconds_of(a, m));
  return worst;
}

// The collectives one chunk posts, as the executor runs them (exec/routes.cpp): one grouped
// point-to-point exchange per phase with messages, one all-gather / reduce-scatter per shard-group
// communicator (its entries' items share it), each gram entry's all-reduces. Each is charged to the
// strategy of the entry that opened it. Replica groups run theirs side by side: counted once.
struct ChunkCalls {
  struct Call {
    Channel channel;
    Phase phase;
    int mesh;
    DimMask dims;
    int g, calls;
    Strategy owner;
  };
  std::vector<Call> calls;
  void p2p(Phase phase, Strategy s) {
    for (const Call& c : calls)
      if (c.channel == Channel::PointToPoint && c.phase == phase) return;
    calls.push_back({Channel::PointToPoint, phase, 0, 0, 2, 1, s});
  }
  void group(const GroupTransfer& x, const PlanEntry& e) {
    if (x.replica != 0) return;
    if (x.channel != Channel::AllReduce)
      for (const Call& c : calls)
        if (c.channel == x.channel && c.mesh == e.mesh && c.dims == e.group_dims) return;
    calls.push_back({x.channel, x.phase, e.mesh, e.group_dims, x.table->g, x.channel == Channel::AllReduce ? x.calls : 1, e.strategy});
  }
};

// Bytes of an entry's transfers (BytesSink) and the calls they belong to.
// Messages go through `p2p_bytes`, group collectives through `group_bytes`.
template <class P, class G>
struct AccountSink {
  static constexpr bool kAssemblies = false;
  BytesSink<P> p2p_bytes;
  BytesSink<G> group_bytes;
  ChunkCalls& calls;
  const PlanEntry& e;
  void p2p(const P2pTransfer& x) {
    p2p_bytes.p2p(x);
    calls.p2p(x.phase, e.strategy);
  }
  void group(const GroupTransfer& x) {
    group_bytes.group(x);
    calls.group(x, e);
  }
  void star(const Star& x) {  // owner_a2a: O(holders), no message objects
    if (!bytes_of(x, p2p_bytes.elem, [&](int r, double s, double rv, double sr, double rr) { p2p_bytes.add(r, s, rv, sr, rr); }))
      return;
    // the calls its first message opens (a gather message always comes before the scatter's)
    if (x.gather) calls.p2p(Phase::Gather, e.strategy);
    if (x.scatter) calls.p2p(Phase::Scatter, e.strategy);
  }
  void exchange(const Exchange& x) {  // each member once: straight to `add`
    group_bytes.exchange(x);
    if (x.members.size() > 1) calls.p2p(x.phase, e.strategy);
  }
};

// A per-rank array that remembers which ranks it touched, so clearing and scanning it cost
// O(touched) (ranks in first-touch order; the reductions over them are order-free maxima).
template <class T>
struct Sparse {
  std::vector<T> at;
  std::vector<uint8_t> used;
  std::vector<int> touched;
  explicit Sparse(size_t w) : at(w), used(w) {}
  T& operator[](int r) {
    if (!used[static_cast<size_t>(r)]) used[static_cast<size_t>(r)] = 1, touched.push_back(r);
    return at[static_cast<size_t>(r)];
  }
  void clear() {
    for (int r : touched) at[static_cast<size_t>(r)] = T{}, used[static_cast<size_t>(r)] = 0;
    touched.clear();
  }
};

}  // namespace

void account(std::vector<PlanEntry>& entries, ShardTables& tables, const Inventory& inv,
                       const PlanOptions& o, std::vector<Chunk>& chunks, CostSummary& total,
                       std::array<CostSummary, kNumStrategies>& by_strategy) {
  const size_t w = static_cast<size_t>(inv.world_size());
  std::array<PerRank, kNumStrategies> strat;            // allocated for the strategies used
  std::array<std::unique_ptr<Sparse<double>>, kNumStrategies> strat_buf;  // this chunk's buffers
  Sparse<Contribution> cur(w);                           // this chunk
  std::unique_ptr<Sparse<Contribution>> entry_bytes_;    // this entry's message bytes (made when first needed)
  std::deque<std::vector<std::pair<int, double>>> window_bufs;  // buffers of the previous window−1 chunks
  Sparse<double> in_flight(w);                           // scratch: buffers of the chunks in flight
  double peak = 0;
  ChunkCalls calls;
  double pipelined = 0;
  const int window = std::max(1, o.window);

  // owner_a2a without replica split or NorMuon state, by arithmetic (see below): per chunk, the
  // tables of its entries and how many entries use each; every holder's part is added once per
  // table at the chunk's close, numel[k] · bytes · entries
  const double elem = static_cast<double>(dtype_size(o.comm_dtype));
  struct OwnerBase {
    const ShardTable* table;
    bool split;
    int64_t count = 0;               // entries of the chunk with this table
    std::vector<int64_t> rho_units;  // split: per (unit, replica) how many of them it owns there
  };
  std::vector<OwnerBase> owner_bases;
  const auto apply_owner_bases = [&]() {
    if (owner_bases.empty()) return;
    const size_t s = static_cast<size_t>(Strategy::OwnerA2A);
    PerRank& st = strat[s];
    Sparse<double>& sb = *strat_buf[s];
    const auto both = [&](int r, double sent, double recv, double recv_rep, double buffer) {
      Contribution& a = cur[r];
      a.sent += sent, a.recv += recv, a.recv_rep += recv_rep, a.buffer += buffer;
      Contribution& b = st.at[static_cast<size_t>(r)];
      b.sent += sent, b.recv += recv, b.recv_rep += recv_rep, b.buffer += buffer;
      if (buffer != 0) sb[r] += buffer;
    };
    for (const OwnerBase& ob : owner_bases) {
      const ShardTable& t = *ob.table;
      const double per = elem * static_cast<double>(ob.count);
      // duplicate: sent to the owner and back; split: every replica's holders get the result
      // (across replicas, but the owner's own: corrected below). Replica by replica, positions
      // inside: ranks in increasing order
      for (int j = 0; j < t.r; ++j)
        for (int k = 0; k < t.g; ++k) {
          const int64_t n = t.numel[static_cast<size_t>(k)];
          if (n <= 0) continue;
          const double x = static_cast<double>(n) * per;  // integer-valued: exact in any order
          both(t.rank(j, k), ob.split ? 0.0 : x, x, ob.split ? x : 0.0, x);
        }
      if (!ob.split) continue;
      // split: the owning replica's holders of a unit also send it, and get its result from inside
      for (int64_t u = 0; u < t.units; ++u)
        for (int j = 0; j < t.r; ++j) {
          const int64_t m = ob.rho_units[static_cast<size_t>(u * t.r + j)];
          if (m == 0) continue;
          for (int64_t h = t.holder_offsets[static_cast<size_t>(u)]; h < t.holder_offsets[static_cast<size_t>(u) + 1]; ++h) {
            const double y = static_cast<double>(t.holder_elems[static_cast<size_t>(h)]) * elem * static_cast<double>(m);
            both(t.rank(j, t.holders[static_cast<size_t>(h)]), y, 0.0, -y, 0.0);
          }
        }
    }
    owner_bases.clear();
  };

  int chunk = -1;  // the chunk being accounted
  const auto close_chunk = [&]() {
    if (chunk < 0) return;
    apply_owner_bases();
    Chunk& c = chunks[static_cast<size_t>(chunk)];
    double flops_max = 0, comm = 0, buffer_max = 0;
    for (int r : cur.touched) {
      const Contribution& a = cur.at[static_cast<size_t>(r)];
      flops_max = std::max(flops_max, a.flops);
      comm = std::max(comm, comm_seconds_of(a, o.machine));
      buffer_max = std::max(buffer_max, a.buffer);
    }
    c.compute_seconds = flops_max / o.machine.ns_flops_per_s(o.ns);
    c.comm_seconds = comm;
    for (const ChunkCalls::Call& k : calls.calls) {
      const double lat = call_latency(k.channel, k.g, k.calls, o.machine);
      c.comm_seconds += lat;
      by_strategy[static_cast<size_t>(k.owner)].comm_seconds += lat;
      by_strategy[static_cast<size_t>(k.owner)].collectives += k.calls;
      total.collectives += k.calls;
    }
    for (int s = 0; s < kNumStrategies; ++s) {
      if (!strat_buf[static_cast<size_t>(s)]) continue;
      Sparse<double>& sb = *strat_buf[static_cast<size_t>(s)];
      double& peak_s = by_strategy[static_cast<size_t>(s)].peak_buffer_bytes_max;
      for (int r : sb.touched) peak_s = std::max(peak_s, sb.at[static_cast<size_t>(r)]);
      sb.clear();
    }
    c.buffer_bytes_max = buffer_max;
    // peak: this chunk plus the window−1 before it are in flight together (summed in that order)
    for (int r : cur.touched) in_flight[r] = cur.at[static_cast<size_t>(r)].buffer;
    for (const auto& prev : window_bufs)
      for (const auto& [r, b] : prev) in_flight[r] += b;
    for (int r : in_flight.touched) peak = std::max(peak, in_flight.at[static_cast<size_t>(r)]);
    in_flight.clear();
    if (window > 1) {
      std::vector<std::pair<int, double>> mine;
      mine.reserve(cur.touched.size());
      for (int r : cur.touched) mine.emplace_back(r, cur.at[static_cast<size_t>(r)].buffer);
      window_bufs.push_back(std::move(mine));
      if (static_cast<int>(window_bufs.size()) > window - 1) window_bufs.pop_front();
    }
    total.comm_seconds += c.comm_seconds;
    total.compute_seconds += c.compute_seconds;
    pipelined += window > 1 ? std::max(c.comm_seconds, c.compute_seconds) : c.comm_seconds + c.compute_seconds;
    cur.clear();
    calls = ChunkCalls{};
  };

  for (size_t i = 0; i < entries.size(); ++i) {
    PlanEntry& e = entries[i];
    const ShardTable& t = tables.get(e.param);
    if (e.chunk != chunk) {
      close_chunk();
      chunk = e.chunk;
    }
    const size_t s = static_cast<size_t>(e.strategy);
    if (strat[s].at.empty()) strat[s] = PerRank(w);
    if (!strat_buf[s]) strat_buf[s] = std::make_unique<Sparse<double>>(w);
    PerRank& st = strat[s];
    Sparse<double>& sb = *strat_buf[s];
    // visit_entry's contributions carry flops and buffers only, the transfers' bytes only: each goes
    // to its own fields (the other fields would add +0.0, which changes nothing)
    const auto add = [&](int r, const Contribution& c) MESHMUON_ALWAYS_INLINE {
      Contribution& a = cur[r];
      a.flops += c.flops, a.buffer += c.buffer;
      Contribution& b = st.at[static_cast<size_t>(r)];
      b.flops += c.flops, b.buffer += c.buffer;
      sb[r] += c.buffer;
    };
    const auto add_bytes = [&](int r, const Contribution& c) MESHMUON_ALWAYS_INLINE {
      Contribution& a = cur[r];
      a.sent += c.sent, a.recv += c.recv, a.sent_rep += c.sent_rep, a.recv_rep += c.recv_rep;
      Contribution& b = st.at[static_cast<size_t>(r)];
      b.sent += c.sent, b.recv += c.recv, b.sent_rep += c.sent_rep, b.recv_rep += c.recv_rep;
    };
    const ParamSpec& p = inv.params[static_cast<size_t>(e.param)];
    const bool state = static_cast<size_t>(e.param) < o.normuon.size() && o.normuon[static_cast<size_t>(e.param)];
    const auto count_entry = [&]() {
      by_strategy[s].params += 1;
      by_strategy[s].matrices += t.units;
      total.params += 1;
      total.matrices += t.units;
    };
    if (e.strategy == Strategy::OwnerA2A && !state) {
      // The stars' holders, all at once: every holder k of a unit sends its n elements to the owner
      // and/or gets them back, and buffers them; summed over units that is numel[k] per position,
      // added per table at the chunk's close (apply_owner_bases, with the split's per-replica part).
      // Here, per unit and replica, the owner: it skips its own n (the base gave it), sends and
      // receives the others, computes f and buffers the whole matrix. Flops reach each rank in the
      // same order as holder by holder; bytes and buffers are integers, so each rank's sums are the
      // same as message by message, bit for bit, while below 2^53 bytes (plan_test and
      // tests/plan/compare_plans.sh compare them).
      auto base = std::find_if(owner_bases.begin(), owner_bases.end(),
                               [&](const OwnerBase& x) { return x.table == &t && x.split == e.replica_split; });
      if (base == owner_bases.end()) base = owner_bases.insert(owner_bases.end(), OwnerBase{&t, e.replica_split, 0, {}});
      base->count += 1;
      if (e.replica_split && base->rho_units.empty()) base->rho_units.assign(static_cast<size_t>(t.units * t.r), 0);
      const double U = static_cast<double>(t.unit_numel), whole = U * (4.0 + elem), f = e.unit_flops;
      const double r1 = static_cast<double>(t.r - 1);
      const auto owner_add = [&](int r, double sent, double recv, double sent_rep, double buf) {
        Contribution& a = cur[r];
        a.sent += sent, a.recv += recv, a.sent_rep += sent_rep, a.flops += f, a.buffer += buf;
        Contribution& b = st.at[static_cast<size_t>(r)];
        b.sent += sent, b.recv += recv, b.sent_rep += sent_rep, b.flops += f, b.buffer += buf;
        sb[r] += buf;
      };
      bool any = false;
      for (int64_t u = 0; u < t.units; ++u) {
        const int o_k = e.owner_index[static_cast<size_t>(u)];
        const auto b0 = t.holders.begin() + t.holder_offsets[static_cast<size_t>(u)];
        const auto b1 = t.holders.begin() + t.holder_offsets[static_cast<size_t>(u) + 1];
        const auto it = std::lower_bound(b0, b1, o_k);
        const int64_t own = it != b1 && *it == o_k ? t.holder_elems[static_cast<size_t>(it - t.holders.begin())] : 0;
        const int64_t all = t.unit_held[static_cast<size_t>(u)], other = all - own;
        const double dn = static_cast<double>(own) * elem, dother = static_cast<double>(other) * elem;
        const double buf = whole - dn;
        if (!e.replica_split) {
          any |= other > 0;
          for (int j = 0; j < t.r; ++j) owner_add(t.rank(j, o_k), dother - dn, dother - dn, 0.0, buf);
          continue;
        }
        // the calls in the order the stars open them: the gather star, then each replica's scatter
        if (other > 0) calls.p2p(Phase::Gather, e.strategy);
        if (other > 0 || (t.r > 1 && all > 0)) calls.p2p(Phase::Scatter, e.strategy);
        const int rho = e.owner_replica[static_cast<size_t>(u)];
        base->rho_units[static_cast<size_t>(u * t.r + rho)] += 1;
        const double dall = static_cast<double>(all) * elem, rep = r1 * dall;
        owner_add(t.rank(rho, o_k), dother + rep - dn, dother - dn, rep, buf);
      }
      if (any) calls.p2p(Phase::Gather, e.strategy), calls.p2p(Phase::Scatter, e.strategy);
      count_entry();
      continue;
    }
    visit_entry(e, t, p, o, add);
    // message bytes: summed per rank over the entry first, then added once per rank touched (group
    // collectives, which touch each rank once, go straight to `add_bytes`); measured the fastest order
    if (!entry_bytes_) entry_bytes_ = std::make_unique<Sparse<Contribution>>(w);
    Sparse<Contribution>& entry_bytes = *entry_bytes_;
    const auto bytes = [&](int r, const Contribution& c) MESHMUON_ALWAYS_INLINE {
      Contribution& a = entry_bytes[r];
      a.sent += c.sent, a.recv += c.recv, a.sent_rep += c.sent_rep, a.recv_rep += c.recv_rep;
    };
    for_each_transfer(e, t, state ? &tables.get_state(e.param) : nullptr, p, o.ns.steps,
                      AccountSink<decltype(bytes), decltype(add_bytes)>{{bytes, dtype_size(o.comm_dtype)},
                                                                        {add_bytes, dtype_size(o.comm_dtype)}, calls, e});
    for (int r : entry_bytes.touched) add_bytes(r, entry_bytes.at[static_cast<size_t>(r)]);
    entry_bytes.clear();
    count_entry();
  }
  close_chunk();
  if (!chunks.empty()) pipelined += window > 1 ? std::min(chunks.front().comm_seconds, chunks.front().compute_seconds) : 0;

  // every strategy's per-rank sums, rank by rank in strategy order, reduced as summarize does
  // (max and sum in rank order), without a world-sized array of them
  {
    double smx = 0, ssum = 0, rmx = 0, rsum = 0, fmx = 0, fsum = 0;
    for (size_t r = 0; r < w; ++r) {
      Contribution a;
      for (const PerRank& st : strat)
        if (!st.at.empty()) {
          const Contribution& c = st.at[r];
          a.sent += c.sent, a.recv += c.recv, a.flops += c.flops;
        }
      smx = r == 0 ? a.sent : std::max(smx, a.sent), ssum += a.sent;
      rmx = r == 0 ? a.recv : std::max(rmx, a.recv), rsum += a.recv;
      fmx = r == 0 ? a.flops : std::max(fmx, a.flops), fsum += a.flops;
    }
    const double n = static_cast<double>(w);
    total.bytes_sent_max = smx, total.bytes_sent_mean = w == 0 ? 0 : ssum / n;
    total.bytes_recv_max = rmx, total.bytes_recv_mean = w == 0 ? 0 : rsum / n;
    total.flops_max = fmx, total.flops_mean = w == 0 ? 0 : fsum / n;
  }
  total.peak_buffer_bytes_max = peak;
  total.predicted_seconds = pipelined;
  for (int s = 0; s < kNumStrategies; ++s) {
    CostSummary& b = by_strategy[static_cast<size_t>(s)];
    if (b.params == 0) continue;
    summarize(strat[static_cast<size_t>(s)], b);
    b.comm_seconds += comm_seconds_max(strat[static_cast<size_t>(s)], o.machine);
    b.compute_seconds = b.flops_max / o.machine.ns_flops_per_s(o.ns);
    b.predicted_seconds = b.comm_seconds + b.compute_seconds;  // as if it ran alone, unoverlapped
  }
}

}  // namespace meshmuon::detail
