// Internal: the builder of the executor's routes (routes.h: build_routes), shared by its two files:
// routes.cpp (layouts, chunks, the full units and this rank's own elements) and route_messages.cpp
// (the regions and pack tables of every message and group collective).
#pragma once

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "exec/routes.h"
#include "meshmuon/error.h"
#include "meshmuon/update.h"
#include "plan/shard_table.h"

namespace meshmuon::detail::route_build {

inline int64_t aligned(int64_t x) { return (x + 63) / 64 * 64; }

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

  void layouts();

  void chunk(const Chunk& c);

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

  void collect(int ei, ChunkRoutes& cr, std::vector<std::tuple<int, UnitAssembly>>& asms);

  // This rank's (replica group, group position) in table t: row-major over the dims in mesh order.
  std::pair<int, int> position(const ShardTable& t, const Mesh& mesh) const;

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
                    int64_t packed, size_t esize, PackConv conv, bool to_full);

  // Own elements into the full units this rank computes (before the orthogonalization).
  void own_elements();

  // Own results out of the full units (after the orthogonalization): update and NorMuon state.
  void own_results();

  size_t payload_size(Payload p) const { return p == Payload::Data ? elem_ : 4; }

  // The phase's point-to-point items: one message per peer and direction, items back to back in
  // transfer order.
  void messages(Phase phase, std::vector<Message>& sends, std::vector<Message>& recvs);

  // The chunk's collectives of one channel over shard groups: one call per communicator, its items
  // back to back in each member's block.
  void group_calls(Channel channel, std::vector<GroupCall>& calls);

  void all_gather_tables(const GroupCall& call, const std::vector<const GroupItem*>& items, int me_k,
                         const std::vector<int64_t>& displ);

  // agrs: every member's elements of the result in member order; the owner sends the result, the
  // others −0 (x + −0 == x exactly, signs kept), so the sum is the owner's result bit for bit.
  void reduce_scatter_tables(const GroupCall& call, const std::vector<const GroupItem*>& items, int me_k);

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

}  // namespace meshmuon::detail::route_build
