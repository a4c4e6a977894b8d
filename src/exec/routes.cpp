// Internal: the executor's routes (routes.h), built once from the plan's transfers. Each chunk's
// arena holds, 64-byte aligned: the entries' local updates, the full units this rank computes (and
// their NorMuon state), then the regions of every message and group collective. Items keep the
// order for_each_transfer gives them, so the two sides of every message agree on its layout.
#include "exec/routes.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "meshmuon/error.h"
#include "meshmuon/update.h"
#include "plan/shard_table.h"

namespace meshmuon::detail {

UnitSpan unit_span(const Box& box, bool expert, int64_t unit) {
  const int64_t n = box.numel();
  if (!expert) return {0, n};
  const IndexSet& es = box.dims[0];
  int64_t pos = 0;
  for (const Range& r : es.ranges()) {
    if (unit >= r.begin && unit < r.end) {
      const int64_t per = box.dims[1].size() * box.dims[2].size();
      return {(pos + unit - r.begin) * per, per};
    }
    pos += r.size();
  }
  return {0, 0};
}

namespace {

int64_t aligned(int64_t x) { return (x + 63) / 64 * 64; }

struct P2pItem {
  int entry;
  P2pTransfer x;
};
struct GroupItem {
  int entry;
  GroupTransfer x;
};

class Builder {
 public:
  Builder(const Plan& plan, int rank, const std::vector<bool>& normuon, Routes& out)
      : plan_(plan), inv_(plan.inventory()), me_(rank), normuon_(normuon), out_(out), tables_(inv_) {
    const DType comm = plan.options().comm_dtype;
    elem_ = dtype_size(comm);
    to_wire_ = comm == DType::BF16 ? PackConv::F32ToBF16 : PackConv::Copy32;
    from_wire_ = comm == DType::BF16 ? PackConv::BF16ToF32 : PackConv::Copy32;
    fill_ = comm == DType::BF16 ? PackConv::FillNegZeroBF16 : PackConv::FillNegZero32;
    wire_type_ = comm_type(comm);
  }

  void layouts() {
    for (size_t i = 0; i < inv_.params.size(); ++i) {
      const ParamSpec& p = inv_.params[i];
      ParamLayout L;
      L.expert = p.expert;
      L.shape = p.shape;
      L.box = plan_.local_box(static_cast<int>(i), me_);
      L.local_numel = L.box.numel();
      if (p.role == Role::Muon) {
        const int nd = p.shape.ndim();
        L.rows = p.shape[nd - 2], L.cols = p.shape[nd - 1];
        L.units = p.expert ? p.shape[0] : 1;
        L.unit_numel = L.rows * L.cols;
        L.v_shape = normuon_state_shape(p.shape, p.expert);
        L.v_len = L.rows >= L.cols ? L.rows : L.cols;
        L.split = p.split;
        L.v_box = local_box(L.v_shape, p.placements, inv_.meshes[static_cast<size_t>(p.mesh)], me_);
        L.local_v = L.v_box.numel();
      }
      out_.layouts.push_back(std::move(L));
    }
  }

  void chunk(const Chunk& c) {
    ChunkRoutes cr;
    p2p_.clear(), groups_.clear(), compute_of_.clear();
    std::vector<std::tuple<int, UnitAssembly>> asms;
    for (int ei = c.first_entry; ei < c.end_entry; ++ei) collect(ei, cr, asms);
    cr_ = &cr;
    off_ = 0;
    for (int ei : cr.entries) cr.update_offset.push_back(take(layout(param_of(ei)).local_numel * 4));
    for (const auto& [ei, a] : asms) {
      if (!a.compute) continue;  // members that only relay (allgather non-holders, agrs non-owners) keep nothing
      const int param = param_of(ei);
      const ParamLayout& L = layout(param);
      // a unit this rank holds whole, row-major, is orthogonalized where its update already is
      const UnitSpan sp = unit_span(L.box, L.expert, a.unit);
      const int nd = L.shape.ndim();
      const bool whole = sp.count == L.unit_numel && L.box.dims[static_cast<size_t>(nd - 2)].contiguous() &&
                         L.box.dims[static_cast<size_t>(nd - 1)].contiguous();
      const int64_t full = whole ? update_at(ei) + sp.offset * 4 : take(L.unit_numel * 4);
      ComputeUnit cu{ei, param, full, normuon_[static_cast<size_t>(param)] ? take(L.v_len * 4) : -1};
      compute_of_[{ei, a.unit}] = {cr.compute.size(), a.holder && a.result_local, whole};
      cr.compute.push_back(cu);
    }
    own_elements();
    messages(Phase::Gather, cr.gather_send, cr.gather_recv);
    group_calls(Channel::AllGather, cr.gather_calls);
    messages(Phase::Scatter, cr.scatter_send, cr.scatter_recv);
    group_calls(Channel::ReduceScatter, cr.scatter_calls);
    own_results();
    cr.arena_bytes = off_;
    out_.chunks.push_back(std::move(cr));
  }

 private:
  struct Computed {
    size_t index = 0;
    bool takes_result = false;
    bool in_place = false;  // the full unit is this rank's update region (held whole): no copies
  };
  struct Sink {
    static constexpr bool kAssemblies = true;
    Builder& b;
    int entry;
    int replica;  // this rank's replica group in the entry's table
    ChunkRoutes& cr;
    std::vector<std::tuple<int, UnitAssembly>>& asms;
    void p2p(const P2pTransfer& x) {
      if (x.src != b.me_ && x.dst != b.me_) return;
      b.count_bytes(x, cr);
      b.p2p_.push_back({entry, x});
    }
    void group(const GroupTransfer& x) {
      if (x.replica != replica) return;
      b.count_bytes(x, cr);
      const PlanEntry& e = b.plan_.entries()[static_cast<size_t>(entry)];
      b.comm_index(GroupKey{e.mesh, e.group_dims});
      if (x.channel != Channel::AllReduce) b.groups_.push_back({entry, x});
    }
    // this rank's messages of the exchange, in the pair order (a, then b) both sides derive
    void exchange(const Exchange& x) {
      if (x.replica != replica) return;
      const int me = b.me_;
      const auto mine = std::find_if(x.members.begin(), x.members.end(), [&](int k) { return x.table->rank(replica, k) == me; });
      if (mine == x.members.end()) return;
      const size_t i = static_cast<size_t>(mine - x.members.begin());
      for (size_t a = 0; a < x.members.size(); ++a) {
        const int ra = x.table->rank(replica, x.members[a]);
        if (a == i) {
          for (size_t c = 0; c < x.members.size(); ++c)
            if (c != a && x.counts[a] > 0)
              p2p(P2pTransfer{x.phase, x.payload, x.unit, ra, x.table->rank(replica, x.members[c]), x.counts[a], false});
        } else if (x.counts[a] > 0) {
          p2p(P2pTransfer{x.phase, x.payload, x.unit, ra, me, x.counts[a], false});
        }
      }
    }
    void assemble(const UnitAssembly& a) {
      if (a.rank == b.me_) asms.emplace_back(entry, a);
    }
  };

  template <class X>
  void count_bytes(const X& x, ChunkRoutes& cr) {
    bytes_of(x, elem_, [&](int r, double s, double rv, double, double) {
      if (r != me_) return;
      out_.predicted_sent += static_cast<uint64_t>(s), out_.predicted_recv += static_cast<uint64_t>(rv);
      if (x.payload == Payload::State) cr.state_sent += static_cast<uint64_t>(s), cr.state_recv += static_cast<uint64_t>(rv);
    });
  }

  void collect(int ei, ChunkRoutes& cr, std::vector<std::tuple<int, UnitAssembly>>& asms) {
    const PlanEntry& e = plan_.entries()[static_cast<size_t>(ei)];
    const ShardTable& t = tables_.get(e.param);
    const ShardTable* vt = normuon_[static_cast<size_t>(e.param)] ? &tables_.get_state(e.param) : nullptr;
    cr.entries.push_back(ei);
    cr.params.push_back(static_cast<size_t>(e.param));
    if (e.strategy == Strategy::GramAllReduce) cr.gram_entries.push_back(ei);
    const auto [j, k] = position(t, inv_.meshes[static_cast<size_t>(e.mesh)]);
    my_k_[ei] = k;
    for_each_transfer(e, t, vt, inv_.params[static_cast<size_t>(e.param)], plan_.options().ns.steps,
                      Sink{*this, ei, j, cr, asms});
  }

  // This rank's (replica group, group position) in table t: row-major over the dims in mesh order.
  std::pair<int, int> position(const ShardTable& t, const Mesh& mesh) const {
    int j = 0, k = 0;
    for (int d = 0; d < mesh.ndim(); ++d) {
      const int size = static_cast<int>(mesh.dim(d).size), c = static_cast<int>(mesh.coord(me_, d));
      if (t.group_dims >> d & 1) k = k * size + c;
      else if (t.replica_dims >> d & 1) j = j * size + c;
    }
    MESHMUON_CHECK_RUNTIME(t.rank(j, k) == me_, "[exec] rank ", me_, " is not at (replica ", j, ", position ", k,
                        ") of its shard table; the mesh's dims are neither shard nor replicate dims");
    return {j, k};
  }

  int comm_index(const GroupKey& key) {
    auto it = std::find(out_.group_keys.begin(), out_.group_keys.end(), key);
    if (it != out_.group_keys.end()) return static_cast<int>(it - out_.group_keys.begin());
    out_.group_keys.push_back(key);
    return static_cast<int>(out_.group_keys.size()) - 1;
  }

  int64_t take(int64_t bytes) {
    const int64_t o = off_;
    off_ = aligned(off_ + bytes);
    return o;
  }
  uint32_t state_buffer(int param) {
    auto& sp = cr_->state_params;
    const auto it = std::find(sp.begin(), sp.end(), param);
    if (it != sp.end()) return 1 + static_cast<uint32_t>(it - sp.begin());
    sp.push_back(param);
    return static_cast<uint32_t>(sp.size());
  }
  int param_of(int entry) const { return plan_.entries()[static_cast<size_t>(entry)].param; }
  const ParamLayout& layout(int param) const { return out_.layouts[static_cast<size_t>(param)]; }
  int64_t update_at(int entry) const { return cr_->update_offset[static_cast<size_t>(entry - cr_->entries.front())]; }
  const Box& box(int param, int r) {
    auto [it, fresh] = boxes_.try_emplace({param, r});
    if (fresh) it->second = plan_.local_box(param, r);
    return it->second;
  }
  const Box& v_box(int param, int r) {
    auto [it, fresh] = v_boxes_.try_emplace({param, r});
    if (fresh) {
      const ParamSpec& p = inv_.params[static_cast<size_t>(param)];
      it->second = local_box(layout(param).v_shape, p.placements, inv_.meshes[static_cast<size_t>(p.mesh)], r);
    }
    return it->second;
  }
  const Computed* computed(int entry, int64_t unit) const {
    const auto it = compute_of_.find({entry, unit});
    return it == compute_of_.end() ? nullptr : &it->second;
  }
  const ComputeUnit& unit_at(const Computed& c) const { return cr_->compute[c.index]; }

  // Adds the runs moving `holder`'s elements of unit u (data, or state when `state`) between a
  // packed region (the holder's local order; `packed`, element size `esize`) and the full unit at
  // this rank. to_full: packed -> full, else full -> packed. Returns the elements covered.
  int64_t unit_runs(std::vector<PackRun>& out, bool state, int entry, int64_t unit, int holder, uint32_t packed_buf,
                    int64_t packed, size_t esize, PackConv conv, bool to_full) {
    const int param = param_of(entry);
    const ParamLayout& L = layout(param);
    const Computed* c = computed(entry, unit);
    MESHMUON_CHECK_RUNTIME(c != nullptr, "[exec] rank ", me_, " has no full unit ", unit, " of entry ", entry, " to route into");
    const ComputeUnit& cu = unit_at(*c);
    const int64_t full = state ? cu.v_offset : cu.full_offset;
    const Box& b = state ? v_box(param, holder) : box(param, holder);
    int64_t covered = 0;
    const auto es = static_cast<int64_t>(esize);
    box_runs(b, state ? L.v_shape : L.shape, L.expert, unit,
             [&](int64_t uo, int64_t us, int64_t lo, int64_t ls, int64_t len, int64_t rows) {
               PackRun r;
               r.conv = conv, r.len = len, r.rows = rows;
               if (to_full) {
                 r.src = packed_buf, r.src_off = packed + lo * es, r.src_stride = ls * es;
                 r.dst = 0, r.dst_off = full + uo * 4, r.dst_stride = us * 4;
               } else {
                 r.src = 0, r.src_off = full + uo * 4, r.src_stride = us * 4;
                 r.dst = packed_buf, r.dst_off = packed + lo * es, r.dst_stride = ls * es;
               }
               out.push_back(r);
               covered += len * rows;
             });
    return covered;
  }

  // Own elements into the full units this rank computes (before the orthogonalization).
  void own_elements() {
    for (const auto& [key, c] : compute_of_) {
      const auto [ei, u] = key;
      const int param = param_of(ei);
      const ParamLayout& L = layout(param);
      const UnitSpan sp = unit_span(L.box, L.expert, u);
      if (sp.count > 0 && !c.in_place)
        unit_runs(cr_->unpack_gather, false, ei, u, me_, 0, update_at(ei) + sp.offset * 4, 4, PackConv::Copy32, true);
      if (unit_at(c).v_offset >= 0) {
        const UnitSpan vs = unit_span(L.v_box, L.expert, u);
        if (vs.count > 0) unit_runs(cr_->unpack_gather, true, ei, u, me_, state_buffer(param), vs.offset * 4, 4, PackConv::Copy32, true);
      }
    }
  }

  // Own results out of the full units (after the orthogonalization): update and NorMuon state.
  void own_results() {
    for (const auto& [key, c] : compute_of_) {
      const auto [ei, u] = key;
      const int param = param_of(ei);
      const ParamLayout& L = layout(param);
      const UnitSpan sp = unit_span(L.box, L.expert, u);
      if (c.takes_result && sp.count > 0 && !c.in_place)
        unit_runs(cr_->pack_scatter, false, ei, u, me_, 0, update_at(ei) + sp.offset * 4, 4, PackConv::Copy32, false);
      if (unit_at(c).v_offset >= 0) {
        const UnitSpan vs = unit_span(L.v_box, L.expert, u);
        if (vs.count > 0) unit_runs(cr_->pack_scatter, true, ei, u, me_, state_buffer(param), vs.offset * 4, 4, PackConv::Copy32, false);
      }
    }
  }

  size_t payload_size(Payload p) const { return p == Payload::Data ? elem_ : 4; }

  // The phase's point-to-point items: one message per peer and direction, items back to back in
  // transfer order.
  void messages(Phase phase, std::vector<Message>& sends, std::vector<Message>& recvs) {
    const bool gather = phase == Phase::Gather;
    std::map<int, std::vector<const P2pItem*>> out, in;
    for (const P2pItem& it : p2p_) {
      if (it.x.phase != phase) continue;
      if (it.x.src == me_) out[it.x.dst].push_back(&it);
      if (it.x.dst == me_) in[it.x.src].push_back(&it);
    }
    auto& pack = gather ? cr_->pack_gather : cr_->pack_scatter;
    auto& unpack = gather ? cr_->unpack_gather : cr_->unpack_scatter;
    const auto region = [&](const std::vector<const P2pItem*>& items) {
      int64_t bytes = 0;
      for (const P2pItem* it : items) bytes += it->x.count * static_cast<int64_t>(payload_size(it->x.payload));
      return bytes;
    };
    // outgoing: this rank's own elements (gather) or the peer's part of the result (scatter) into
    // the message; incoming: the peer's elements into the full unit (gather) or this rank's part of
    // the result into its update / state (scatter)
    for (const bool outgoing : {true, false}) {
      for (auto& [peer, items] : outgoing ? out : in) {
        const int64_t bytes = region(items);
        int64_t at = take(bytes);
        (outgoing ? sends : recvs).push_back({peer, at, bytes});
        for (const P2pItem* it : items) {
          const int param = param_of(it->entry);
          const ParamLayout& L = layout(param);
          const bool state = it->x.payload == Payload::State;
          const size_t es = payload_size(it->x.payload);
          const PackConv conv = state ? PackConv::Copy32 : outgoing ? to_wire_ : from_wire_;
          int64_t n = 0;
          if (outgoing == gather) {  // this rank's elements of the unit, in its local order: one run
            const UnitSpan sp = unit_span(state ? L.v_box : L.box, L.expert, it->x.unit);
            const uint32_t buf = state ? state_buffer(param) : 0;
            const int64_t local = state ? sp.offset * 4 : update_at(it->entry) + sp.offset * 4;
            PackRun r;
            r.src = outgoing ? buf : 0, r.src_off = outgoing ? local : at;
            r.dst = outgoing ? 0 : buf, r.dst_off = outgoing ? at : local;
            r.len = sp.count, r.conv = conv;
            (outgoing ? pack : unpack).push_back(r);
            n = sp.count;
          } else {  // the peer's elements of a full unit this rank computes
            n = unit_runs(outgoing ? pack : unpack, state, it->entry, it->x.unit, peer, 0, at, es, conv, !outgoing);
          }
          MESHMUON_CHECK_RUNTIME(n == it->x.count, "[exec] rank ", me_, ": the plan moves ", it->x.count, " elements of '",
                              inv_.params[static_cast<size_t>(param)].name, outgoing ? "' to rank " : "' from rank ", peer,
                              " but the boxes hold ", n);
          at += it->x.count * static_cast<int64_t>(es);
        }
      }
    }
  }

  // The chunk's collectives of one channel over shard groups: one call per communicator, its items
  // back to back in each member's block.
  void group_calls(Channel channel, std::vector<GroupCall>& calls) {
    std::vector<std::pair<int, std::vector<const GroupItem*>>> by_comm;
    for (const GroupItem& it : groups_) {
      if (it.x.channel != channel) continue;
      const PlanEntry& e = plan_.entries()[static_cast<size_t>(it.entry)];
      const int comm = comm_index(GroupKey{e.mesh, e.group_dims});
      auto f = std::find_if(by_comm.begin(), by_comm.end(), [&](const auto& b) { return b.first == comm; });
      if (f == by_comm.end()) by_comm.push_back({comm, {}}), f = by_comm.end() - 1;
      f->second.push_back(&it);
    }
    for (auto& [comm, items] : by_comm) {
      GroupCall call;
      call.channel = channel, call.comm = comm;
      const int g = items.front()->x.table->g;
      const int me_k = my_k_.at(items.front()->entry);
      call.counts.assign(static_cast<size_t>(g), 0);
      const bool ag = channel == Channel::AllGather;
      call.type = ag ? CommType::U8 : wire_type_;
      for (const GroupItem* it : items) {
        MESHMUON_CHECK_RUNTIME(it->x.table->g == g, "[exec] group collective over tables of different sizes");
        for (int k = 0; k < g; ++k)
          call.counts[static_cast<size_t>(k)] += it->x.counts[static_cast<size_t>(k)] * static_cast<int64_t>(ag ? payload_size(it->x.payload) : 1);
      }
      int64_t total = 0;
      std::vector<int64_t> displ(static_cast<size_t>(g));
      for (int k = 0; k < g; ++k) displ[static_cast<size_t>(k)] = total, total += call.counts[static_cast<size_t>(k)];
      const int64_t tsize = static_cast<int64_t>(comm_type_size(call.type));
      call.send_count = ag ? call.counts[static_cast<size_t>(me_k)] : total;
      call.recv_count = ag ? total : call.counts[static_cast<size_t>(me_k)];
      call.send_offset = take(call.send_count * tsize);
      call.recv_offset = take(call.recv_count * tsize);
      if (ag) all_gather_tables(call, items, me_k, displ);
      else reduce_scatter_tables(call, items, me_k);
      calls.push_back(std::move(call));
    }
  }

  void all_gather_tables(const GroupCall& call, const std::vector<const GroupItem*>& items, int me_k,
                         const std::vector<int64_t>& displ) {
    int64_t at = call.send_offset;  // this rank's block: its whole local shard of each item
    for (const GroupItem* it : items) {
      const int param = param_of(it->entry);
      const ParamLayout& L = layout(param);
      const bool state = it->x.payload == Payload::State;
      const int64_t n = state ? L.local_v : L.local_numel;
      MESHMUON_CHECK_RUNTIME(n == it->x.counts[static_cast<size_t>(me_k)], "[exec] rank ", me_, ": the plan gathers ",
                          it->x.counts[static_cast<size_t>(me_k)], " elements of '", inv_.params[static_cast<size_t>(param)].name,
                          "' from it but it holds ", n);
      PackRun r;
      r.src = state ? state_buffer(param) : 0, r.src_off = state ? 0 : update_at(it->entry);
      r.dst = 0, r.dst_off = at, r.len = n, r.conv = state ? PackConv::Copy32 : to_wire_;
      cr_->pack_gather.push_back(r);
      at += n * static_cast<int64_t>(payload_size(it->x.payload));
    }
    const GroupTransfer& x0 = items.front()->x;
    for (int k = 0; k < x0.table->g; ++k) {  // every other member's block into the units computed here
      if (k == me_k) continue;
      const int member = x0.table->rank(x0.replica, k);
      int64_t cur = call.recv_offset + displ[static_cast<size_t>(k)];
      for (const GroupItem* it : items) {
        const int param = param_of(it->entry);
        const ParamLayout& L = layout(param);
        const bool state = it->x.payload == Payload::State;
        const size_t es = payload_size(it->x.payload);
        const Box& b = state ? v_box(param, member) : box(param, member);
        for (int64_t u = 0; u < L.units; ++u) {
          const UnitSpan sp = unit_span(b, L.expert, u);
          if (sp.count == 0 || !computed(it->entry, u)) continue;
          unit_runs(cr_->unpack_gather, state, it->entry, u, member, 0, cur + sp.offset * static_cast<int64_t>(es), es,
                    state ? PackConv::Copy32 : from_wire_, true);
        }
        cur += it->x.counts[static_cast<size_t>(k)] * static_cast<int64_t>(es);
      }
    }
  }

  // agrs: every member's elements of the result in member order; the owner sends the result, the
  // others −0 (x + −0 == x exactly, signs kept), so the sum is the owner's result bit for bit.
  void reduce_scatter_tables(const GroupCall& call, const std::vector<const GroupItem*>& items, int me_k) {
    const GroupTransfer& x0 = items.front()->x;
    int64_t at = call.send_offset;
    const auto es = static_cast<int64_t>(elem_);
    for (int k = 0; k < x0.table->g; ++k) {
      const int member = x0.table->rank(x0.replica, k);
      for (const GroupItem* it : items) {
        const int64_t n = it->x.counts[static_cast<size_t>(k)];
        if (computed(it->entry, 0)) {
          unit_runs(cr_->pack_scatter, false, it->entry, 0, member, 0, at, elem_, to_wire_, false);
        } else if (n > 0) {
          PackRun r;
          r.conv = fill_, r.dst = 0, r.dst_off = at, r.len = n;
          cr_->pack_scatter.push_back(r);
        }
        at += n * es;
      }
    }
    int64_t cur = call.recv_offset;
    for (const GroupItem* it : items) {
      const int64_t n = it->x.counts[static_cast<size_t>(me_k)];
      PackRun r;
      r.src = 0, r.src_off = cur, r.dst = 0, r.dst_off = update_at(it->entry), r.len = n, r.conv = from_wire_;
      cr_->unpack_scatter.push_back(r);
      cur += n * es;
    }
  }

  const Plan& plan_;
  const Inventory& inv_;
  int me_;
  const std::vector<bool>& normuon_;
  Routes& out_;
  ShardTables tables_;
  size_t elem_ = 4;
  PackConv to_wire_ = PackConv::Copy32, from_wire_ = PackConv::Copy32, fill_ = PackConv::FillNegZero32;
  CommType wire_type_ = CommType::F32;
  std::map<std::pair<int, int>, Box> boxes_, v_boxes_;
  // the chunk being built
  ChunkRoutes* cr_ = nullptr;
  int64_t off_ = 0;
  std::vector<P2pItem> p2p_;
  std::vector<GroupItem> groups_;
  std::map<std::pair<int, int64_t>, Computed> compute_of_;
  std::map<int, int> my_k_;  // per entry: this rank's group position
};

}  // namespace

Routes build_routes(const Plan& plan, int rank, const std::vector<bool>& normuon) {
  Routes out;
  Builder b(plan, rank, normuon, out);
  b.layouts();
  for (const Chunk& c : plan.chunks()) b.chunk(c);
  return out;
}

}  // namespace meshmuon::detail
