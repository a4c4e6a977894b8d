// Pack tables: Backend::pack against the per-element reference on random tables, and the blocks the
// executor's tables are made of (box_runs) on random layouts against a per-element walk of each
// rank's local tensor (local position -> global index through the box's index sets).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "meshmuon/bf16.h"
#include "meshmuon/box.h"
#include "exec/routes.h"

namespace meshmuon::detail {
namespace {

TEST(Pack, CpuKernelMatchesTheReferenceOnRandomTables) {
  std::mt19937 rng(7);
  auto backend = make_cpu_backend();
  const PackConv convs[] = {PackConv::Copy32, PackConv::F32ToBF16, PackConv::BF16ToF32, PackConv::FillNegZero32,
                            PackConv::FillNegZeroBF16};
  for (int trial = 0; trial < 200; ++trial) {
    constexpr size_t kBytes = 1 << 16;
    std::vector<std::byte> src(kBytes), a(kBytes), b(kBytes);
    for (size_t i = 0; i + 4 <= kBytes; i += 4) {  // finite floats (bf16 halves read as finite values too)
      const float f = std::uniform_real_distribution<float>(-8, 8)(rng);
      std::memcpy(&src[i], &f, 4);
    }
    std::vector<PackRun> runs;
    const int n = 1 + static_cast<int>(rng() % 6);
    int64_t dst_at = 0;  // destinations do not overlap: each run writes its own range
    for (int k = 0; k < n; ++k) {
      PackRun r;
      r.src = 0, r.dst = 1, r.conv = convs[rng() % 5];
      r.len = 1 + static_cast<int64_t>(rng() % 40), r.rows = 1 + static_cast<int64_t>(rng() % 5);
      const auto ss = static_cast<int64_t>(pack_src_size(r.conv) ? pack_src_size(r.conv) : 4);
      const auto ds = static_cast<int64_t>(pack_dst_size(r.conv));
      r.src_stride = r.len * ss + static_cast<int64_t>(rng() % 3) * ss;
      r.dst_stride = r.len * ds + static_cast<int64_t>(rng() % 3) * ds;
      r.src_off = static_cast<int64_t>(rng() % 1000) * 4;
      r.dst_off = dst_at;
      dst_at += r.dst_stride * r.rows + 8;
      runs.push_back(r);
    }
    ASSERT_LT(dst_at, static_cast<int64_t>(kBytes));
    std::byte* bases_a[] = {src.data(), a.data()};
    std::byte* bases_b[] = {src.data(), b.data()};
    backend->pack(runs, bases_a);
    pack_reference(runs, bases_b);
    ASSERT_EQ(a, b) << "trial " << trial;
  }
}

TEST(Pack, NegativeControlADifferentTableDiffers) {
  auto backend = make_cpu_backend();
  std::vector<float> src = {1, 2, 3, 4}, a(4), b(4);
  const PackRun r{0, 1, PackConv::Copy32, 0, 0, 4, 1, 16, 16};
  PackRun shifted = r;
  shifted.src_off = 4, shifted.len = 3;
  std::byte* ba[] = {reinterpret_cast<std::byte*>(src.data()), reinterpret_cast<std::byte*>(a.data())};
  std::byte* bb[] = {reinterpret_cast<std::byte*>(src.data()), reinterpret_cast<std::byte*>(b.data())};
  backend->pack(std::span(&r, 1), ba);
  pack_reference(std::span(&shifted, 1), bb);
  EXPECT_NE(a, b);
}

Placement random_placement(std::mt19937& rng, int ndim) {
  switch (rng() % 3) {
    case 0: return Placement::replicate();
    case 1: return Placement::shard(static_cast<int>(rng() % static_cast<unsigned>(ndim)));
    default: return Placement::strided_shard(static_cast<int>(rng() % static_cast<unsigned>(ndim)), 1 + static_cast<int>(rng() % 3));
  }
}

// Each rank's local tensor holds the global flat index of its elements (the per-element reference);
// the box_runs blocks scatter it into each full unit. Every element of every unit must come out at
// its own index, and the ranks of one replica group must cover each element exactly once.
TEST(Pack, BoxRunsPlaceEveryLocalElementAtItsGlobalIndex) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const bool expert = rng() % 3 == 0;
    const int nd = expert ? 3 : 2;
    std::vector<int64_t> extents;
    for (int d = 0; d < nd; ++d) extents.push_back(1 + static_cast<int64_t>(rng() % 13));
    const Shape shape(extents);
    std::vector<MeshDim> dims;
    const int mdims = 1 + static_cast<int>(rng() % 3);
    for (int d = 0; d < mdims; ++d) dims.push_back({"d" + std::to_string(d), 1 + static_cast<int>(rng() % 4)});
    const Mesh mesh(dims);
    std::vector<Placement> pl;
    DimMask shard_dims = 0;
    for (int d = 0; d < mdims; ++d) {
      pl.push_back(random_placement(rng, nd));
      if (pl.back().kind != PlacementKind::Replicate) shard_dims |= DimMask{1} << d;
    }
    const int64_t units = expert ? shape[0] : 1;
    const int64_t rows = shape[nd - 2], cols = shape[nd - 1], unit_numel = rows * cols;
    std::vector<int> cover(static_cast<size_t>(units * unit_numel), 0);
    const std::vector<int> group = mesh.group_ranks(0, shard_dims);  // one replica group
    for (int rank : group) {
      const Box box = local_box(shape, pl, mesh, rank);
      // reference: local position -> global index, element by element
      std::vector<float> local;
      const auto& e = expert ? box.dims[0] : IndexSet::full(1);
      for (int64_t i = 0; i < e.size(); ++i)
        for (int64_t r = 0; r < box.dims[static_cast<size_t>(nd - 2)].size(); ++r)
          for (int64_t c = 0; c < box.dims[static_cast<size_t>(nd - 1)].size(); ++c)
            local.push_back(static_cast<float>(e.at(i) * unit_numel + box.dims[static_cast<size_t>(nd - 2)].at(r) * cols +
                                               box.dims[static_cast<size_t>(nd - 1)].at(c)));
      ASSERT_EQ(static_cast<int64_t>(local.size()), box.numel());
      for (int64_t u = 0; u < units; ++u) {
        const UnitSpan sp = unit_span(box, expert, u);
        std::vector<float> full(static_cast<size_t>(unit_numel), -1.0f);
        std::vector<PackRun> runs;
        int64_t covered = 0;
        box_runs(box, shape, expert, u, [&](int64_t uo, int64_t us, int64_t lo, int64_t ls, int64_t len, int64_t rws) {
          runs.push_back({0, 1, PackConv::Copy32, (sp.offset + lo) * 4, uo * 4, len, rws, ls * 4, us * 4});
          covered += len * rws;
        });
        ASSERT_EQ(covered, sp.count) << "rank " << rank << " unit " << u << " box " << box.to_string();
        std::byte* bases[] = {reinterpret_cast<std::byte*>(local.data()), reinterpret_cast<std::byte*>(full.data())};
        make_cpu_backend()->pack(runs, bases);
        for (int64_t x = 0; x < unit_numel; ++x) {
          if (full[static_cast<size_t>(x)] < 0) continue;
          ASSERT_EQ(full[static_cast<size_t>(x)], static_cast<float>(u * unit_numel + x))
              << "trial " << trial << " rank " << rank << " box " << box.to_string();
          cover[static_cast<size_t>(u * unit_numel + x)] += 1;
        }
      }
    }
    for (size_t x = 0; x < cover.size(); ++x) ASSERT_EQ(cover[x], 1) << "trial " << trial << " element " << x;
  }
}

}  // namespace
}  // namespace meshmuon::detail
