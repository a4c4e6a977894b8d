// Placements: how one mesh dim splits a tensor, as DTensor's Replicate / Shard(d) / _StridedShard.
//
// Semantics (local, no communication), applied mesh dim by mesh dim, left to right, each to the
// LOCAL piece the previous dims left (DTensor's nesting):
//   Replicate            every rank of the mesh dim holds the whole piece.
//   Shard(d)             torch.chunk over W ranks: chunk = ceil(n / W); rank i holds positions
//                        [min(i·chunk, n), min((i+1)·chunk, n)); trailing ranks may hold nothing.
//   StridedShard(d, f)   torch's _StridedShard: torch.chunk into W·f pieces; rank i holds pieces
//                        i, i+W, ..., i+(f−1)·W, concatenated. FSDP2 uses it over a dim that a later
//                        mesh dim (TP, EP with f = its size) shards, so the result equals "TP first,
//                        then FSDP" whenever the sizes divide evenly. Local indices are not contiguous.
//   Owned(k)             owner placement (no DTensor equivalent): rank k of the mesh dim holds the
//                        whole piece, every other rank an empty piece (zero rows of tensor dim 0).
//                        [Owned(r), Owned(s)] on (dp_replicate, dp_shard) puts a matrix whole on the
//                        one rank (r, s) of the mesh (ShardedParamsOptions::placement).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "meshmuon/export.h"

namespace meshmuon {

enum class PlacementKind : uint8_t { Replicate, Shard, StridedShard, Owned };

struct Placement {
  PlacementKind kind = PlacementKind::Replicate;
  int dim = -1;          // tensor dim for Shard / StridedShard
  int split_factor = 1;  // StridedShard only, ≥ 1
  int owner = 0;         // Owned only: the mesh-dim coordinate that holds the piece

  static Placement replicate() { return {}; }
  static Placement shard(int d) { return {PlacementKind::Shard, d, 1}; }
  static Placement strided_shard(int d, int f) { return {PlacementKind::StridedShard, d, f}; }
  static Placement owned(int k) { return {PlacementKind::Owned, 0, 1, k}; }
  bool is_shard() const { return kind != PlacementKind::Replicate; }
  friend bool operator==(const Placement&, const Placement&) = default;
};

// "R", "S(0)", "SS(0,4)", "O(2)": the short names used in the CLI, JSON and plan output.
MESHMUON_API std::string to_string(const Placement& p);

// Accepts the short names and DTensor's spellings: "Replicate()", "Shard(1)", "_StridedShard(0,
// split_factor=4)", "StridedShard(0,4)", "Owned(2)". Throws std::invalid_argument naming `what` (e.g. the
// parameter and field) on anything else. Does not check the dim against a tensor (see box.h).
MESHMUON_API Placement parse_placement(std::string_view text, std::string_view what = "placement");

}  // namespace meshmuon
