// Internal: the executor's routes (routes.h), built once from the plan's transfers. Each chunk's
// arena holds, 64-byte aligned: the entries' local updates, the full units this rank computes (and
// their NorMuon state), then the regions of every message and group collective. Items keep the
// order for_each_transfer gives them, so the two sides of every message agree on its layout.
#include "exec/routes.h"

#include "exec/route_builder.h"

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

namespace route_build {

void Builder::layouts() {
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

void Builder::chunk(const Chunk& c) {
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

void Builder::collect(int ei, ChunkRoutes& cr, std::vector<std::tuple<int, UnitAssembly>>& asms) {
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

std::pair<int, int> Builder::position(const ShardTable& t, const Mesh& mesh) const {
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

int64_t Builder::unit_runs(std::vector<PackRun>& out, bool state, int entry, int64_t unit, int holder, uint32_t packed_buf,
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

void Builder::own_elements() {
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

void Builder::own_results() {
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

}  // namespace route_build

Routes build_routes(const Plan& plan, int rank, const std::vector<bool>& normuon) {
  Routes out;
  route_build::Builder b(plan, rank, normuon, out);
  b.layouts();
  for (const Chunk& c : plan.chunks()) b.chunk(c);
  return out;
}

}  // namespace meshmuon::detail
