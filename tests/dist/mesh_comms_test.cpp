// MeshCommunicators suite; part of comm_test (mpirun -n 1..4 and the single backend):
//   ctest --test-dir build-comm -R comm --output-on-failure
// At 4 ranks the mesh is dp=2 x tp=2, otherwise dp=n x tp=1. Group members are checked by
// all-gathering world ranks over each sub-communicator against Mesh::group_ranks.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dist_env.h"
#include "meshmuon/error.h"
#include "meshmuon/mesh_comms.h"

namespace meshmuon {
namespace {

using test::comm;

Mesh test_mesh(const std::string& a = "dp", const std::string& b = "tp") {
  const int n = comm().size();
  return n == 4 ? Mesh({{a, 2}, {b, 2}}) : Mesh({{a, n}, {b, 1}});
}

// A world of its own for each test (a split of the suite's communicator), shared as the API wants.
std::shared_ptr<Communicator> own_world() { return comm().split(0, comm().rank(), "mesh world"); }

std::vector<int> members(Communicator& sub) {
  int32_t me = comm().rank();
  std::vector<int32_t> all(sub.size(), -1);
  sub.all_gather(InBuffer(&me, CommType::I32, 1), all, "members").wait();
  return {all.begin(), all.end()};
}

TEST(MeshComms, GroupsFollowTheMeshAndAreCached) {
  MeshCommunicators mc(own_world());
  const Mesh mesh = test_mesh();
  const int r = mc.world().rank();
  EXPECT_EQ(mc.size(), 0u);
  for (DimMask dims : {DimMask{1}, DimMask{2}, DimMask{3}, DimMask{0}}) {
    Communicator& sub = mc.get(mesh, dims);
    EXPECT_EQ(sub.size(), mesh.group_size(dims)) << "dims " << dims;
    EXPECT_EQ(sub.rank(), mesh.group_index(r, dims)) << "dims " << dims;
    EXPECT_EQ(members(sub), mesh.group_ranks(r, dims)) << "dims " << dims;
    EXPECT_EQ(&mc.get(mesh, dims), &sub) << "the same key returns the same communicator";
  }
  EXPECT_EQ(mc.size(), 4u);
  EXPECT_EQ(mc.get(mesh, 2).name(), "mesh world[" + mesh.to_string() + "]:tp");
  EXPECT_EQ(mc.get(mesh, 3).name(), "mesh world[" + mesh.to_string() + "]:dp+tp");
  EXPECT_EQ(mc.get(mesh, 0).name(), "mesh world[" + mesh.to_string() + "]:none");
  EXPECT_EQ(mc.share(mesh, 1).get(), &mc.get(mesh, 1));
  // Same shape, other names: another key, another communicator with the same members.
  const Mesh renamed = test_mesh("fsdp", "ep");
  Communicator& other = mc.get(renamed, 1);
  EXPECT_NE(&other, &mc.get(mesh, 1));
  EXPECT_EQ(members(other), members(mc.get(mesh, 1)));
  EXPECT_EQ(mc.size(), 5u);
}

TEST(MeshComms, CountersSumTheSubCommunicatorsOnly) {
  MeshCommunicators mc(own_world());
  const Mesh mesh = test_mesh();
  Communicator& rows = mc.get(mesh, 2);
  Communicator& cols = mc.get(mesh, 1);
  mc.reset_counters();
  mc.world().reset_counters();
  float x = 1, y = 0;
  rows.all_reduce(InBuffer(&x, CommType::F32, 1), OutBuffer(&y, CommType::F32, 1), ReduceOp::Sum, "rows").wait();
  EXPECT_EQ(y, static_cast<float>(rows.size()));
  cols.barrier("cols").wait();
  const CommCounters k = mc.counters();
  EXPECT_EQ(k.collectives, 2u);
  EXPECT_EQ(k.bytes_sent, rows.counters().bytes_sent);
  EXPECT_EQ(mc.world().counters().collectives, 0u) << "the world is not counted nor touched";
}

TEST(MeshComms, MisuseThrows) {
  EXPECT_THROW(MeshCommunicators(nullptr), std::invalid_argument);
  MeshCommunicators mc(own_world());
  const int n = mc.world().size();
  EXPECT_THROW((void)mc.get(Mesh({{"dp", n + 1}}), 1), std::invalid_argument);   // does not span the world
  EXPECT_THROW((void)mc.get(Mesh({{"dp", n}}), 2), std::invalid_argument);        // no dim 1
  mc.world().group_begin();
  EXPECT_THROW((void)mc.get(test_mesh(), 1), std::invalid_argument);             // a group is open
  EXPECT_TRUE(mc.world().group_end("none").completed());
  EXPECT_EQ(mc.size(), 0u);
  mc.world().barrier("nothing left posted").wait();
}

// Ranks asking for different keys get meshmuon::Error on every rank, and nothing is made.
TEST(MeshComms, RanksAskingForDifferentKeysAllFail) {
  MeshCommunicators mc(own_world());
  if (mc.world().size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  const Mesh mesh = test_mesh();
  EXPECT_THROW((void)mc.get(mesh, mc.world().rank() == 0 ? 1 : 2), Error);
  EXPECT_EQ(mc.size(), 0u);
  EXPECT_EQ(mc.get(mesh, 3).size(), mc.world().size()) << "agreeing again works";
}

}  // namespace
}  // namespace meshmuon
