// MeshCommunicators: sub-communicators of a world keyed by (mesh, dims), made on first request with
// split_mesh_dims after the ranks have checked they ask for the same key.
#include "meshmuon/mesh_comms.h"

#include "core/hash.h"
#include "meshmuon/error.h"

namespace meshmuon {
namespace {

std::string comm_name(const Communicator& world, const Mesh& mesh, DimMask dims) {
  std::string out = detail::concat(world.name(), "[", mesh.to_string(), "]:");
  if (dims == 0) return out + "none";
  for (int d = 0, n = 0; d < mesh.ndim(); ++d)
    if (dims >> d & 1) out += (n++ ? "+" : "") + mesh.dim(d).name;
  return out;
}

uint64_t key_hash(const Mesh& mesh, DimMask dims) {
  detail::Fnv1a f;
  f.pod(mesh.ndim());
  for (const MeshDim& d : mesh.dims()) f.str(d.name), f.pod(d.size);
  f.pod(dims);
  return f.h;
}

}  // namespace

MeshCommunicators::MeshCommunicators(std::shared_ptr<Communicator> world) : world_(std::move(world)) {
  MESHMUON_CHECK(world_ != nullptr, "[comm] MeshCommunicators needs a world communicator, got null");
}

MeshCommunicators::~MeshCommunicators() = default;

Communicator& MeshCommunicators::get(const Mesh& mesh, DimMask dims) { return *share(mesh, dims); }

std::shared_ptr<Communicator> MeshCommunicators::share(const Mesh& mesh, DimMask dims) {
  for (const Entry& e : entries_)
    if (e.mask == dims && e.dims == mesh.dims()) return e.comm;
  Communicator& w = *world_;
  MESHMUON_CHECK(mesh.size() == w.size(), "[comm] mesh ", mesh.to_string(), " has ", mesh.size(),
              " ranks but communicator '", w.name(), "' has ", w.size(), "; a mesh must span the world");
  MESHMUON_CHECK((dims & ~mesh.all_dims()) == 0, "[comm] dims mask 0x", std::hex, dims, std::dec, " names dims the mesh ",
              mesh.to_string(), " lacks (it has ", mesh.ndim(), ")");
  // pass 1: every rank asks for the same new key (max of h and of ~h equal to one's own on every
  // rank iff all agree), so that no rank builds groups from a different layout.
  const uint64_t h = key_hash(mesh, dims);
  uint64_t agree[2] = {h, ~h};
  w.all_reduce(OutBuffer(agree, CommType::U64, 2), ReduceOp::Max, "mesh communicator key").wait();
  MESHMUON_CHECK_RUNTIME(agree[0] == h && agree[1] == ~h, "[comm] rank ", w.rank(), " asked communicator '", w.name(),
                      "' for ", comm_name(w, mesh, dims), " but other ranks asked for a different mesh or dims; "
                      "every rank must request new mesh communicators in the same order");
  // pass 2: the split, ranks row-major over the chosen dims in mesh order (as Mesh::group_ranks).
  std::vector<int64_t> shape, coords;
  std::vector<int> chosen;
  for (int d = 0; d < mesh.ndim(); ++d) {
    shape.push_back(mesh.dim(d).size);
    coords.push_back(mesh.coord(w.rank(), d));
    if (dims >> d & 1) chosen.push_back(d);
  }
  std::shared_ptr<Communicator> comm = w.split_mesh_dims(shape, coords, chosen, comm_name(w, mesh, dims));
  entries_.push_back({mesh.dims(), dims, comm});
  return comm;
}

CommCounters MeshCommunicators::counters() const {
  CommCounters sum;
  for (const Entry& e : entries_) {
    const CommCounters c = e.comm->counters();
    sum.bytes_sent += c.bytes_sent;
    sum.bytes_recv += c.bytes_recv;
    sum.collectives += c.collectives;
  }
  return sum;
}

void MeshCommunicators::reset_counters() {
  for (const Entry& e : entries_) e.comm->reset_counters();
}

}  // namespace meshmuon
