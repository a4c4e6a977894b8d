// Internal: derives the executor's per-chunk transfers and assemblies from the plan (routes.h).
// Canonical order inside a chunk: entry, unit, then sender and receiver in group order; Data before
// State for the same (unit, pair). Both sides walk the same loops, so the streams line up.
#include "exec/routes.h"

#include <algorithm>
#include <map>

#include "dmuon/error.h"
#include "dmuon/update.h"

namespace dmuon::detail {

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

class Builder {
 public:
  Builder(const Plan& plan, int rank, const std::vector<bool>& normuon, Routes& out)
      : plan_(plan), inv_(plan.inventory()), me_(rank), normuon_(normuon), out_(out) {}

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
        L.v_box = local_box(L.v_shape, p.placements, inv_.meshes[static_cast<size_t>(p.mesh)], me_);
        L.local_v = L.v_box.numel();
      }
      out_.layouts.push_back(std::move(L));
    }
  }

  void chunk(const Chunk& c) {
    ChunkRoutes cr;
    for (int ei = c.first_entry; ei < c.end_entry; ++ei) entry(ei, cr);
    out_.chunks.push_back(std::move(cr));
  }

 private:
  const Box& box(int param, int r) {
    auto& m = boxes_[param];
    auto it = m.find(r);
    if (it == m.end()) it = m.emplace(r, plan_.local_box(param, r)).first;
    return it->second;
  }
  const Box& v_box(int param, int r) {
    auto& m = v_boxes_[param];
    auto it = m.find(r);
    if (it == m.end()) {
      const ParamSpec& p = inv_.params[static_cast<size_t>(param)];
      it = m.emplace(r, local_box(out_.layouts[static_cast<size_t>(param)].v_shape, p.placements,
                                  inv_.meshes[static_cast<size_t>(p.mesh)], r)).first;
    }
    return it->second;
  }
  int64_t count(int param, int r, int64_t u) { return unit_span(box(param, r), layout(param).expert, u).count; }
  int64_t v_count(int param, int r, int64_t u) {
    if (!normuon_[static_cast<size_t>(param)]) return 0;
    return unit_span(v_box(param, r), layout(param).expert, u).count;
  }
  const ParamLayout& layout(int param) const { return out_.layouts[static_cast<size_t>(param)]; }

  // One (s -> d) transfer of unit u: data and (when NorMuon) state; recorded if this rank is a side.
  void pair(ChunkRoutes& cr, bool scatter, int s, int d, int ei, int param, int64_t u, bool data, bool state) {
    if (s != me_ && d != me_) return;
    const int64_t holder = scatter ? d : s;  // whose local elements travel
    const int64_t n = data ? count(param, static_cast<int>(holder), u) : 0;
    const int64_t vn = state ? v_count(param, static_cast<int>(holder), u) : 0;
    auto& send = scatter ? cr.scatter_send : cr.gather_send;
    auto& recv = scatter ? cr.scatter_recv : cr.gather_recv;
    for (const auto& [what, k] : {std::pair{Payload::Data, n}, std::pair{Payload::State, vn}}) {
      if (k == 0) continue;
      if (s == me_) send.push_back({d, ei, u, what, k});
      if (d == me_) recv.push_back({s, ei, u, what, k});
    }
  }

  int group_comm(const PlanEntry& e) {
    const GroupKey key{e.mesh, e.group_dims};
    auto it = std::find(out_.group_keys.begin(), out_.group_keys.end(), key);
    if (it != out_.group_keys.end()) return static_cast<int>(it - out_.group_keys.begin());
    out_.group_keys.push_back(key);
    return static_cast<int>(out_.group_keys.size()) - 1;
  }

  void entry(int ei, ChunkRoutes& cr) {
    const PlanEntry& e = plan_.entries()[static_cast<size_t>(ei)];
    const int param = e.param;
    const ParamLayout& L = layout(param);
    const Mesh& mesh = inv_.meshes[static_cast<size_t>(e.mesh)];
    const std::vector<int> team = mesh.group_ranks(me_, e.group_dims);
    cr.entries.push_back(ei);
    const auto mine = [&](int64_t u) { return count(param, me_, u) > 0; };
    switch (e.strategy) {
      case Strategy::Local:
      case Strategy::ExpertLocal:
        for (int64_t u = 0; u < L.units; ++u)
          if (mine(u)) cr.assemblies.push_back({ei, u, true, true, true});
        return;
      case Strategy::GramAllReduce:
        group_comm(e);
        cr.gram_entries.push_back(ei);
        return;
      case Strategy::OwnerA2A:
        for (int64_t u = 0; u < L.units; ++u) {
          const int o = plan_.owner_rank(e, u, me_);
          const std::vector<int> in = mesh.group_ranks(o, e.group_dims);
          const std::vector<int> out = e.replica_split ? mesh.group_ranks(o, e.group_dims | e.replica_dims) : in;
          for (int h : in)
            if (h != o) pair(cr, false, h, o, ei, param, u, true, true);
          for (int h : out)
            if (h != o) pair(cr, true, o, h, ei, param, u, true, true);
          if (o == me_) cr.assemblies.push_back({ei, u, true, mine(u), true});
        }
        return;
      case Strategy::AllGather:
        for (int64_t u = 0; u < L.units; ++u) {
          for (int s : team)
            for (int d : team)
              if (s != d) pair(cr, false, s, d, ei, param, u, true, true);
          cr.assemblies.push_back({ei, u, mine(u), mine(u), true});
        }
        return;
      case Strategy::Agrs: {
        const int o = plan_.owner_rank(e, 0, me_);
        for (int s : team)
          for (int d : team)
            if (s != d) pair(cr, false, s, d, ei, param, 0, true, d == o);
        for (int h : team)
          if (h != o) pair(cr, true, o, h, ei, param, 0, false, true);  // state back; data by RS
        cr.assemblies.push_back({ei, 0, o == me_, mine(0), false});
        const int gc = group_comm(e);
        auto it = std::find_if(cr.reduce_scatters.begin(), cr.reduce_scatters.end(),
                               [&](const ReduceScatter& rs) { return rs.comm == gc; });
        if (it == cr.reduce_scatters.end()) {
          cr.reduce_scatters.push_back({gc, {}, team, std::vector<int64_t>(team.size(), 0)});
          it = cr.reduce_scatters.end() - 1;
        }
        it->entries.push_back(ei);
        for (size_t j = 0; j < team.size(); ++j) it->counts[j] += count(param, team[j], 0);
        return;
      }
      case Strategy::ExpertSubgroup:
        for (int64_t u = 0; u < L.units; ++u) {
          if (!mine(u)) continue;
          std::vector<int> holders;
          for (int r : team)
            if (count(param, r, u) > 0) holders.push_back(r);
          for (int s : holders)
            for (int d : holders)
              if (s != d) pair(cr, false, s, d, ei, param, u, true, true);
          cr.assemblies.push_back({ei, u, true, true, true});
        }
        return;
    }
  }

  const Plan& plan_;
  const Inventory& inv_;
  int me_;
  const std::vector<bool>& normuon_;
  Routes& out_;
  std::map<int, std::map<int, Box>> boxes_, v_boxes_;
};

}  // namespace

Routes build_routes(const Plan& plan, int rank, const std::vector<bool>& normuon) {
  Routes out;
  Builder b(plan, rank, normuon, out);
  b.layouts();
  for (const Chunk& c : plan.chunks()) b.chunk(c);
  return out;
}

}  // namespace dmuon::detail
