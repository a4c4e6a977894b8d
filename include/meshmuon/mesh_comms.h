// MeshCommunicators: the sub-communicators of one world communicator along sets of mesh dims,
// made once and shared by every component that needs them (optimizer, FSDP, checkpoints).
//
// Contract:
// - KEY: (mesh dims' names and sizes, DimMask). Two meshes of the same shape with different names
//   are different keys; the same mesh and mask always return the same communicator.
// - COLLECTIVE on first use of a key: get() splits the world (Communicator::split_mesh_dims), so
//   every rank must request NEW keys in the same order (repeated requests are local and free).
//   A first request starts with one all-reduce on the world that checks every rank asked for the
//   same key: a disagreement throws meshmuon::Error on every rank instead of building wrong groups.
// - THREADS: as Communicator (one thread at a time, the driving thread).
// - LIFETIME: the communicators live as long as this object; references from get() stay valid.
#pragma once

#include <memory>
#include <vector>

#include "meshmuon/comm.h"
#include "meshmuon/export.h"
#include "meshmuon/mesh.h"

namespace meshmuon {

class MESHMUON_API MeshCommunicators {
 public:
  // `world` must not be null; it stays shared with the caller (and is not split until get()).
  explicit MeshCommunicators(std::shared_ptr<Communicator> world);
  ~MeshCommunicators();
  MeshCommunicators(const MeshCommunicators&) = delete;
  MeshCommunicators& operator=(const MeshCommunicators&) = delete;

  // The communicator of this rank's group over `dims` (bit d: mesh dim d), ranks ordered row-major
  // over the chosen dims as Mesh::group_ranks (group_index(world rank) is the new rank). dims 0 is
  // this rank alone. Throws std::invalid_argument (before any communication) when the mesh does not
  // span the world (mesh.size() != world().size()), dims names a dim the mesh lacks, or a group of
  // the world's communicator is open. Named "<world>[<mesh>]:<dim>+<dim>" ("...:none" for dims 0).
  Communicator& get(const Mesh& mesh, DimMask dims);
  // The same communicator, as shared ownership (it then outlives this object if held).
  std::shared_ptr<Communicator> share(const Mesh& mesh, DimMask dims);

  Communicator& world() const { return *world_; }
  const std::shared_ptr<Communicator>& world_ptr() const { return world_; }
  // Number of sub-communicators made so far (the world not included).
  size_t size() const { return entries_.size(); }
  // Sum of the counters of the sub-communicators (the world, shared with others, not included:
  // read world().counters() for it); reset_counters() resets those same ones.
  CommCounters counters() const;
  void reset_counters();

 private:
  struct Entry {
    std::vector<MeshDim> dims;
    DimMask mask = 0;
    std::shared_ptr<Communicator> comm;
  };
  std::shared_ptr<Communicator> world_;
  std::vector<Entry> entries_;  // in creation order; few, so looked up linearly
};

}  // namespace meshmuon
