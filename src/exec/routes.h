// Internal: the executor's static routing. From the plan it derives, once at construction, which
// units (matrices / experts) this rank assembles and computes in each chunk, and every transfer of
// the chunk's gather and scatter all-to-alls that this rank takes part in, in a canonical order that
// sender and receiver both derive (so the byte streams match without any metadata on the wire).
#pragma once

#include <cstdint>
#include <vector>

#include "dmuon/box.h"
#include "dmuon/plan.h"

namespace dmuon::detail {

// Per parameter: this rank's box, and the boxes of every rank it exchanges with.
struct ParamLayout {
  bool expert = false;
  Shape shape, v_shape;          // global shape; NorMuon state shape
  int64_t rows = 0, cols = 0, units = 1, unit_numel = 0, v_len = 0;  // per unit
  Box box, v_box;                // this rank's
  int64_t local_numel = 0, local_v = 0;
};

// Where unit `unit` sits in a box's local tensor: element offset and count (count 0: not held).
struct UnitSpan {
  int64_t offset = 0, count = 0;
};
UnitSpan unit_span(const Box& box, bool expert, int64_t unit);

// Calls fn(global_offset_in_unit, length) for the contiguous runs of `box` inside unit `unit`, in
// the box's local order (the order of the unit's elements in the local tensor).
template <class F>
void for_each_run(const Box& box, const Shape& shape, bool expert, int64_t unit, F&& fn) {
  const int nd = shape.ndim();
  const int64_t cols = shape[nd - 1];
  const IndexSet& rs = box.dims[static_cast<size_t>(nd - 2)];
  const IndexSet& cs = box.dims[static_cast<size_t>(nd - 1)];
  if (expert && !box.dims[0].contains(unit)) return;
  for (const Range& r : rs.ranges())
    for (int64_t row = r.begin; row < r.end; ++row)
      for (const Range& c : cs.ranges()) fn(row * cols + c.begin, c.size());
}

enum class Payload : uint8_t { Data, State };  // comm-dtype update values / fp32 NorMuon state

struct Transfer {
  int peer = 0;      // world rank of the other side
  int entry = 0;     // plan entry index
  int64_t unit = 0;
  Payload what = Payload::Data;
  int64_t count = 0;  // elements
};

// A unit this rank assembles in full (and computes when `compute`).
struct Assembly {
  int entry = 0;
  int64_t unit = 0;
  bool compute = false;
  bool holder = false;   // this rank holds elements of the unit (takes its result locally)
  bool result_local = false;  // the result for this rank's own elements is taken from here
};

// An agrs reduce-scatter of one chunk over one shard-group communicator.
struct ReduceScatter {
  int comm = 0;                  // index into the executor's group communicators
  std::vector<int> entries;      // plan entries, in order
  std::vector<int> members;      // world ranks in communicator order
  std::vector<int64_t> counts;   // per member: elements it receives (its local elements, all entries)
};

struct ChunkRoutes {
  std::vector<int> entries;  // plan entry indices in this chunk
  std::vector<Transfer> gather_send, gather_recv, scatter_send, scatter_recv;  // canonical order
  std::vector<Assembly> assemblies;
  std::vector<ReduceScatter> reduce_scatters;
  std::vector<int> gram_entries;
};

// Identifies a shard-group communicator: (mesh index, dims).
struct GroupKey {
  int mesh = 0;
  DimMask dims = 0;
  friend bool operator==(const GroupKey&, const GroupKey&) = default;
};

struct Routes {
  std::vector<ParamLayout> layouts;  // per inventory parameter
  std::vector<ChunkRoutes> chunks;
  std::vector<GroupKey> group_keys;  // communicators to create (agrs, gram_allreduce), in order
};

// `normuon[param]`: whether the parameter's group runs NorMuon (its state travels).
Routes build_routes(const Plan& plan, int rank, const std::vector<bool>& normuon);

}  // namespace dmuon::detail
