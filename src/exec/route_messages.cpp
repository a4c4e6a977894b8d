// Internal: the routes' messages and group collectives (route_builder.h): each phase's
// point-to-point messages, one call per shard-group communicator and channel, and their pack tables.
#include "exec/route_builder.h"

namespace meshmuon::detail::route_build {

void Builder::messages(Phase phase, std::vector<Message>& sends, std::vector<Message>& recvs) {
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

void Builder::group_calls(Channel channel, std::vector<GroupCall>& calls) {
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

void Builder::all_gather_tables(const GroupCall& call, const std::vector<const GroupItem*>& items, int me_k,
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

void Builder::reduce_scatter_tables(const GroupCall& call, const std::vector<const GroupItem*>& items, int me_k) {
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

}  // namespace meshmuon::detail::route_build
