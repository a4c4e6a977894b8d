// The nccl communicator's bootstrap (meshmuon/comm_nccl.h): each rank checks its device and loads
// libnccl, rank 0 makes the unique id, one exchange (the caller's, or MPI's) gives every rank that
// id and every peer's failure, then the root communicator is made (non-blocking, polled under the
// default timeout) and wrapped in the nccl transport (nccl_transport.h) under the Communicator base.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/shared/device_guard.h"
#include "comm/nccl/nccl_args.h"
#include "comm/nccl/nccl_loader.h"
#include "comm/nccl/nccl_transport.h"
#include "comm/transport_registry.h"
#include "comm/work_impl.h"
#include "meshmuon/comm_nccl.h"
#include "meshmuon/comm_transport.h"
#include "meshmuon/error.h"

namespace meshmuon {
namespace {

using detail::concat;
using detail::DeviceGuard;
using detail::NcclShared;
using detail::throw_error;

// The number of visible devices; throws meshmuon::Error naming the runtime's reason when there is none.
int require_devices(int rank) {
  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    throw_error(concat("[nccl] rank ", rank, ": no CUDA device: ",
                       probe != cudaSuccess ? cudaGetErrorString(probe) : "the runtime sees 0 devices",
                       "; the nccl communicator needs one GPU per rank (ranks sharing a GPU: use the mpi "
                       "communicator, which stages device buffers through pinned memory)"));
  }
  return devices;
}

}  // namespace

// What each rank contributes to the bootstrap exchange: whether its local preparation (device,
// libnccl, rank 0's unique id) worked, why not, and rank 0's id. A rank that failed still joins the
// exchange, so every rank learns of the failure and throws instead of waiting on a peer that left.
struct NcclHello {
  char ok = 0;
  char reason[383] = {};
  ncclUniqueId id{};
};
static_assert(sizeof(NcclHello) == 512, "the bootstrap blob's size is part of the exchange (and its tests)");

std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, CommExchange exchange, int device,
                                                     std::string name) {
  detail::check_nccl_args(rank, size, exchange);
  const detail::NcclApi* api_ptr = nullptr;
  NcclHello hello;
  std::exception_ptr failure;
  try {
    const int devices = require_devices(rank);
    if (device < 0) {
      if (cudaGetDevice(&device) != cudaSuccess) device = 0;
    }
    MESHMUON_CHECK(device < devices, "[nccl] rank ", rank, ": device ", device, " does not exist (", devices,
                " visible)");
    api_ptr = &detail::nccl_api();
    if (rank == 0) {
      const ncclResult_t r = api_ptr->get_unique_id(&hello.id);
      MESHMUON_CHECK_RUNTIME(r == ncclSuccess, "[nccl] rank 0: ncclGetUniqueId failed: ", api_ptr->get_error_string(r));
    }
    hello.ok = 1;
  } catch (const std::exception& e) {
    failure = std::current_exception();
    std::strncpy(hello.reason, e.what(), sizeof(hello.reason) - 1);
  }
  const auto* mine = reinterpret_cast<const std::byte*>(&hello);
  const std::vector<std::byte> all = exchange(std::span<const std::byte>(mine, sizeof(hello)));
  if (failure) std::rethrow_exception(failure);
  MESHMUON_CHECK(all.size() == sizeof(hello) * static_cast<size_t>(size), "[nccl] make_nccl_communicator: the exchange "
              "returned ", all.size(), " bytes; expected ", size, " blobs of ", sizeof(hello), " bytes");
  for (int r = 0; r < size; ++r) {
    NcclHello peer;
    std::memcpy(&peer, all.data() + static_cast<size_t>(r) * sizeof(peer), sizeof(peer));
    peer.reason[sizeof(peer.reason) - 1] = '\0';
    MESHMUON_CHECK_RUNTIME(peer.ok == 1, "[nccl] rank ", rank, ": rank ", r, " of ", size,
                        " could not prepare its nccl communicator '", name, "', so no rank makes one: ", peer.reason);
    if (r == 0) hello.id = peer.id;  // rank 0's
  }
  const detail::NcclApi& api = *api_ptr;
  const ncclUniqueId id = hello.id;

  auto shared = std::make_shared<NcclShared>();
  shared->api = &api;
  shared->device = device;
  shared->world_rank = rank;
  shared->timeout = detail::default_timeout_from_env();
  ncclComm_t comm = nullptr;
  {
    DeviceGuard g(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = api.comm_init_rank_config(&comm, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      throw_error(concat("[nccl] rank ", rank, ": ncclCommInitRankConfig failed: ", api.get_error_string(r)));
    bool ok = false;
    try {
      ok = shared->settle(comm, "ncclCommInitRankConfig", shared->timeout);
    } catch (const std::exception& e) {
      (void)api.comm_abort(comm);
      throw_error(concat("[nccl] rank ", rank, ": ", e.what()));
    }
    if (!ok) {
      (void)api.comm_abort(comm);
      throw_error(concat("[nccl] rank ", rank, ": ncclCommInitRankConfig timed out after ",
                         static_cast<double>(shared->timeout.count()) / 1000.0, " s on communicator '", name,
                         "' (rank ", rank, " of ", size, "); a peer died or did not create it; NCCL aborted"));
    }
  }
  shared->comms.push_back(comm);
  std::shared_ptr<Transport> transport = detail::make_nccl_transport(shared, comm, rank, size, name);
  return make_communicator(std::move(transport), rank, size, std::move(name), rank);
}

std::unique_ptr<Communicator> make_nccl_communicator() {
  (void)require_devices(0);  // before MPI: a machine without a GPU fails here, naming the cause
  if (!mpi_available()) {  // a world of one rank
    return make_nccl_communicator(0, 1, [](std::span<const std::byte> b) { return std::vector<std::byte>(b.begin(), b.end()); });
  }
  std::shared_ptr<Communicator> world = make_mpi_communicator();
  const int rank = world->rank(), size = world->size();
  const int devices = require_devices(rank);
  int local = rank;
  if (const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK"); env != nullptr && *env != '\0') local = std::atoi(env);
  const int device = local % devices;
  CommExchange exchange = [world](std::span<const std::byte> mine) {
    std::vector<std::byte> all(mine.size() * static_cast<size_t>(world->size()));
    world->all_gather(InBuffer(mine.data(), CommType::U8, mine.size()), OutBuffer(all.data(), CommType::U8, all.size()),
                      "nccl bootstrap")
        .wait();
    return all;
  };
  return make_nccl_communicator(rank, size, std::move(exchange), device, "world");
}

bool nccl_available() { return true; }

namespace detail {
void register_nccl_transport(TransportRegistry& r) {
  r.add("nccl", [] { return make_nccl_communicator(); });
}
}  // namespace detail

}  // namespace meshmuon
