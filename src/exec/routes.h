// Internal: the executor's static routing. At construction it takes, from the plan's transfers
// (plan/transfers.h, the same list the planner's byte accounting sums), the items this rank takes
// part in, and lays each chunk out once: one transient arena (byte offsets of every region), the
// messages and group collectives to post, the units to compute, and four pack tables (backend/pack.h)
// that move data between the arena and the state tensors. A step then only runs tables and posts.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/pack.h"
#include "meshmuon/box.h"
#include "meshmuon/comm.h"
#include "meshmuon/plan.h"
#include "plan/transfers.h"

namespace meshmuon::detail {

// Per parameter: this rank's box and its NorMuon state box.
struct ParamLayout {
  bool expert = false;
  Shape shape, v_shape;          // global shape; NorMuon state shape
  int64_t rows = 0, cols = 0, units = 1, unit_numel = 0, v_len = 0;  // per unit
  Box box, v_box;                // this rank's
  std::vector<int64_t> split;    // row blocks of one unit (ParamSpec::split; empty: one block)
  int64_t local_numel = 0, local_v = 0;
};

// Where unit `unit` sits in a box's local tensor: element offset and count (count 0: not held).
struct UnitSpan {
  int64_t offset = 0, count = 0;
};
UnitSpan unit_span(const Box& box, bool expert, int64_t unit);

// The runs of `box` inside unit `u` of a tensor of `shape` (expert: dim 0 indexes units), as 2-D
// blocks: fn(unit_offset, unit_stride, local_offset, local_stride, len, rows) in elements. Unit
// offsets index the full unit (row-major); local offsets count from the holder's first element of
// the unit in its local tensor (row-major over the box's index sets). The pack tables are made of
// these blocks; full-width blocks are merged into one run.
template <class F>
void box_runs(const Box& box, const Shape& shape, bool expert, int64_t u, F&& fn) {
  const int nd = shape.ndim();
  const int64_t cols = shape[nd - 1];
  const IndexSet& rs = box.dims[static_cast<size_t>(nd - 2)];
  const IndexSet& cs = box.dims[static_cast<size_t>(nd - 1)];
  if (expert && !box.dims[0].contains(u)) return;
  const int64_t lc = cs.size();
  int64_t pr = 0;
  for (const Range& r : rs.ranges()) {
    int64_t pc = 0;
    for (const Range& c : cs.ranges()) {
      if (c.size() == cols && lc == cols) fn(r.begin * cols, cols, pr * lc, lc, c.size() * r.size(), int64_t{1});
      else fn(r.begin * cols + c.begin, cols, pr * lc + pc, lc, c.size(), r.size());
      pc += c.size();
    }
    pr += r.size();
  }
}

// Identifies a shard-group communicator: (mesh index, dims).
struct GroupKey {
  int mesh = 0;
  DimMask dims = 0;
  friend bool operator==(const GroupKey&, const GroupKey&) = default;
};

// One message of a grouped point-to-point exchange on the optimizer's communicator: a region of the
// chunk's arena (every item this rank exchanges with `peer` in this phase, back to back).
struct Message {
  int peer = 0;
  int64_t offset = 0, bytes = 0;
};

// One collective over a shard-group communicator (Routes::group_keys[comm]).
struct GroupCall {
  Channel channel = Channel::AllGather;  // AllGather (gather phase) or ReduceScatter (scatter phase)
  int comm = 0;
  CommType type = CommType::U8;          // U8: all-gather blocks (data and state bytes); reduce-scatter: the comm dtype
  std::vector<int64_t> counts;           // per member, elements of `type`
  int64_t send_offset = 0, recv_offset = 0;  // arena bytes
  int64_t send_count = 0, recv_count = 0;    // elements of `type`
};

// A unit this rank orthogonalizes, at arena byte offsets (v_offset < 0: no NorMuon state).
struct ComputeUnit {
  int entry = 0, param = 0;
  int64_t full_offset = 0, v_offset = -1;
};

struct ChunkRoutes {
  std::vector<int> entries;            // plan entries of the chunk
  std::vector<int> gram_entries;       // gram_allreduce entries (run before the chunk's collectives)
  std::vector<size_t> params;          // the entries' parameters (state acquired / released)
  std::vector<int> state_params;       // parameters whose NorMuon state the tables touch: buffer 1 + index
  std::vector<int64_t> update_offset;  // per chunk entry: arena bytes of its local shard's update (fp32)
  std::vector<ComputeUnit> compute;
  std::vector<Message> gather_send, gather_recv, scatter_send, scatter_recv;
  std::vector<GroupCall> gather_calls, scatter_calls;
  // update / state -> send regions; own elements and received ones -> full units; results -> own
  // update, state and send regions (and −0 for the reduce-scatters of units computed elsewhere);
  // received results -> update / state.
  std::vector<PackRun> pack_gather, unpack_gather, pack_scatter, unpack_scatter;
  int64_t arena_bytes = 0;
  uint64_t state_sent = 0, state_recv = 0;  // NorMuon state bytes this rank moves (StepStats)
};

struct Routes {
  std::vector<ParamLayout> layouts;  // per inventory parameter
  std::vector<ChunkRoutes> chunks;
  std::vector<GroupKey> group_keys;  // communicators to create (collectives over shard groups), in plan order
  uint64_t predicted_sent = 0, predicted_recv = 0;  // this rank's bytes, summed from the same transfers
};

// `normuon[param]`: whether the parameter's group runs NorMuon (its state travels).
Routes build_routes(const Plan& plan, int rank, const std::vector<bool>& normuon);

}  // namespace meshmuon::detail
