// Layout: mesh coordinates and sub-groups (DeviceMesh order), placements, local boxes against a
// brute-force torch.chunk / _StridedShard reference written here. Run: build/bin/layout_test
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "meshmuon/box.h"

namespace meshmuon {
namespace {

// Reference: torch.chunk(list, parts) as lists, padded with empty pieces to `parts`.
std::vector<std::vector<int64_t>> ref_chunk(const std::vector<int64_t>& xs, int64_t parts) {
  std::vector<std::vector<int64_t>> out;
  const int64_t n = static_cast<int64_t>(xs.size());
  const int64_t c = n == 0 ? 1 : (n + parts - 1) / parts;
  for (int64_t s = 0; s < n; s += c) out.emplace_back(xs.begin() + s, xs.begin() + std::min(n, s + c));
  while (static_cast<int64_t>(out.size()) < parts) out.emplace_back();
  return out;
}

// Reference local indices per tensor dim: apply placements left to right on explicit index lists.
std::vector<std::vector<int64_t>> ref_box(const Shape& shape, const std::vector<Placement>& pl,
                                          const std::vector<int>& mesh_sizes, const std::vector<int>& coords) {
  std::vector<std::vector<int64_t>> dims(static_cast<size_t>(shape.ndim()));
  for (int d = 0; d < shape.ndim(); ++d)
    for (int64_t i = 0; i < shape[d]; ++i) dims[static_cast<size_t>(d)].push_back(i);
  for (size_t m = 0; m < pl.size(); ++m) {
    if (pl[m].kind == PlacementKind::Replicate) continue;
    auto& xs = dims[static_cast<size_t>(pl[m].dim)];
    const int w = mesh_sizes[m], c = coords[m];
    if (pl[m].kind == PlacementKind::Shard) {
      xs = ref_chunk(xs, w)[static_cast<size_t>(c)];
      continue;
    }
    const auto pieces = ref_chunk(xs, static_cast<int64_t>(w) * pl[m].split_factor);
    std::vector<int64_t> cat;
    for (int j = 0; j < pl[m].split_factor; ++j) {
      const auto& p = pieces[static_cast<size_t>(c + j * w)];
      cat.insert(cat.end(), p.begin(), p.end());
    }
    xs = cat;
  }
  return dims;
}

std::vector<int64_t> expand(const IndexSet& s) {
  std::vector<int64_t> out;
  for (const Range& r : s.ranges())
    for (int64_t i = r.begin; i < r.end; ++i) out.push_back(i);
  return out;
}

TEST(Mesh, RowMajorCoordinatesAndGroups) {
  const Mesh mesh = Mesh::parse("a=2,b=3,c=4");
  ASSERT_EQ(mesh.size(), 24);
  for (int r = 0; r < 24; ++r) {
    const auto c = mesh.coords(r);
    EXPECT_EQ(c[0] * 12 + c[1] * 4 + c[2], r);  // DeviceMesh: last dim fastest
    EXPECT_EQ(mesh.rank_of(c), r);
  }
  for (DimMask dims = 0; dims < 8; ++dims)
    for (int r = 0; r < 24; ++r) {
      std::vector<int> brute;  // ranks equal to r outside `dims`, ascending = row-major over dims
      for (int q = 0; q < 24; ++q) {
        bool same = true;
        for (int d = 0; d < 3; ++d)
          if (!(dims >> d & 1) && mesh.coord(q, d) != mesh.coord(r, d)) same = false;
        if (same) brute.push_back(q);
      }
      EXPECT_EQ(mesh.group_ranks(r, dims), brute);
      EXPECT_EQ(brute[static_cast<size_t>(mesh.group_index(r, dims))], r);
    }
}

TEST(Mesh, BadInput) {
  EXPECT_THROW(Mesh::parse("a=0"), std::invalid_argument);
  EXPECT_THROW(Mesh::parse("a=2,a=2"), std::invalid_argument);
  EXPECT_THROW(Mesh::parse("a"), std::invalid_argument);
  EXPECT_THROW(Mesh::parse("a=x"), std::invalid_argument);
  EXPECT_EQ(Mesh::parse("").size(), 1);
}

TEST(Placement, ParseAndPrint) {
  EXPECT_EQ(parse_placement("R"), Placement::replicate());
  EXPECT_EQ(parse_placement("Shard(1)"), Placement::shard(1));
  EXPECT_EQ(parse_placement("_StridedShard(0, split_factor=4)"), Placement::strided_shard(0, 4));
  EXPECT_EQ(parse_placement(to_string(Placement::strided_shard(2, 3))), Placement::strided_shard(2, 3));
  try {
    parse_placement("Partial()", "parameter 'w' field 'placements[0]'");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'w' field 'placements[0]'"), std::string::npos);
  }
  EXPECT_THROW(parse_placement("SS(0,0)"), std::invalid_argument);
  EXPECT_THROW(parse_placement("S(-1)"), std::invalid_argument);
}

TEST(Box, TorchChunkEmptyTrailingShards) {
  // 18 rows on 8 ranks: chunk 3, six ranks with 3 rows, two with 0 (REFERENCE.md section 4)
  const Mesh mesh = Mesh::parse("dp=8");
  const std::vector<Placement> pl = {Placement::shard(0)};
  std::vector<int64_t> rows;
  for (int r = 0; r < 8; ++r) rows.push_back(local_box(Shape{18, 5}, pl, mesh, r).dims[0].size());
  EXPECT_EQ(rows, (std::vector<int64_t>{3, 3, 3, 3, 3, 3, 0, 0}));
}

TEST(Box, StridedShardDocExample) {
  // DTensor's example: [8, 8] on (dp=2, tp=2), (_StridedShard(0, 2), Shard(0)): TP first, then FSDP.
  const Mesh mesh = Mesh::parse("dp=2,tp=2");
  const std::vector<Placement> pl = {Placement::strided_shard(0, 2), Placement::shard(0)};
  const int64_t expected_begin[] = {0, 4, 2, 6};
  for (int r = 0; r < 4; ++r) {
    const Box b = local_box(Shape{8, 8}, pl, mesh, r);
    ASSERT_TRUE(b.dims[0].contiguous());
    EXPECT_EQ(b.dims[0].ranges()[0], (Range{expected_begin[r], expected_begin[r] + 2})) << r;
  }
}

// Every element of the tensor lies in exactly one shard of each replica group.
bool covers_exactly_once(const Shape& shape, const std::vector<Box>& boxes) {
  std::vector<int> count(static_cast<size_t>(shape.numel()), 0);
  for (const Box& b : boxes) {
    std::vector<std::vector<int64_t>> idx;
    for (const IndexSet& s : b.dims) idx.push_back(expand(s));
    std::vector<size_t> pos(idx.size(), 0);
    if (b.numel() == 0) continue;
    while (true) {
      int64_t flat = 0;
      for (int d = 0; d < shape.ndim(); ++d) flat = flat * shape[d] + idx[static_cast<size_t>(d)][pos[static_cast<size_t>(d)]];
      ++count[static_cast<size_t>(flat)];
      int d = shape.ndim() - 1;
      while (d >= 0 && ++pos[static_cast<size_t>(d)] == idx[static_cast<size_t>(d)].size()) pos[static_cast<size_t>(d--)] = 0;
      if (d < 0) break;
    }
  }
  return std::all_of(count.begin(), count.end(), [](int c) { return c == 1; });
}

TEST(Box, RandomPlacementsMatchReferenceAndCoverOnce) {
  std::mt19937 rng(1234);
  const int64_t extents[] = {0, 1, 2, 3, 5, 7, 8, 11, 13};
  for (int trial = 0; trial < 400; ++trial) {
    const int nd = 1 + static_cast<int>(rng() % 3), md = 1 + static_cast<int>(rng() % 3);
    std::vector<int64_t> sh;
    for (int d = 0; d < nd; ++d) sh.push_back(extents[rng() % 9]);
    const Shape shape{std::span<const int64_t>(sh)};
    std::vector<MeshDim> mdims;
    std::vector<int> sizes;
    for (int m = 0; m < md; ++m) {
      sizes.push_back(1 + static_cast<int>(rng() % 4));
      mdims.push_back({"m" + std::to_string(m), sizes.back()});
    }
    const Mesh mesh(mdims);
    std::vector<Placement> pl;
    for (int m = 0; m < md; ++m) {
      const int kind = static_cast<int>(rng() % 3), d = static_cast<int>(rng() % static_cast<unsigned>(nd));
      pl.push_back(kind == 0 ? Placement::replicate()
                   : kind == 1 ? Placement::shard(d)
                               : Placement::strided_shard(d, 1 + static_cast<int>(rng() % 3)));
    }
    const DimMask rep = replicate_dims(pl, mesh);
    std::set<int> bases;
    for (int r = 0; r < mesh.size(); ++r) {
      const Box b = local_box(shape, pl, mesh, r);
      const auto ref = ref_box(shape, pl, sizes, mesh.coords(r));
      for (int d = 0; d < nd; ++d)
        ASSERT_EQ(expand(b.dims[static_cast<size_t>(d)]), ref[static_cast<size_t>(d)])
            << "trial " << trial << " rank " << r << " dim " << d << " shape " << shape.to_string();
      bases.insert(mesh.group_member(r, rep, 0));
    }
    for (int base : bases) {  // one replica group at a time
      std::vector<Box> boxes;
      for (int r : mesh.group_ranks(base, mesh.all_dims() & ~rep)) boxes.push_back(local_box(shape, pl, mesh, r));
      ASSERT_TRUE(covers_exactly_once(shape, boxes)) << "trial " << trial;
      // negative control: dropping a non-empty shard must break the coverage check
      auto it = std::find_if(boxes.begin(), boxes.end(), [](const Box& b) { return b.numel() > 0; });
      if (it != boxes.end()) {
        boxes.erase(it);
        ASSERT_FALSE(covers_exactly_once(shape, boxes));
      }
    }
  }
}

TEST(Box, BadPlacementsNameTheTensor) {
  const Mesh mesh = Mesh::parse("dp=2");
  try {
    check_placements(Shape{4, 4}, std::vector<Placement>{Placement::shard(2)}, mesh, "parameter 'w1'");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'w1'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("dim 2"), std::string::npos);
  }
  EXPECT_THROW(check_placements(Shape{4, 4}, std::vector<Placement>{}, mesh, "w"), std::invalid_argument);
  EXPECT_THROW(local_box(Shape{4}, std::vector<Placement>{Placement::shard(0)}, mesh, 2), std::invalid_argument);
}

}  // namespace
}  // namespace meshmuon
