// Internal: the nccl transport, a Transport (meshmuon/comm_transport.h) over one NCCL communicator,
// and NcclShared, what the NCCL communicators of one root and its splits share (the loaded library,
// the device, the timeout, the abort of them all). nccl_transport.cpp runs the operations;
// comm_nccl.cpp makes the root. libnccl is dlopen'd (nccl_loader.h); cudart is the static one
// libmeshmuon already links.
//
// Every NCCL communicator is non-blocking (config.blocking = 0): init, split and group ends may
// return ncclInProgress and are polled with ncclCommGetAsyncError under a deadline
// (NcclShared::settle), so a missing rank is a timeout error and never a hang inside NCCL.
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl/nccl_loader.h"
#include "meshmuon/comm_transport.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {

// The NCCL communicators of one root and its splits: aborted together on a timeout.
struct NcclShared {
  const NcclApi* api = nullptr;
  int device = 0;
  int world_rank = 0;
  std::chrono::milliseconds timeout{0};
  std::mutex mu;
  std::vector<ncclComm_t> comms;
  std::atomic<bool> aborted{false};  // written under mu, read without it by the waits

  void abort_all() {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted) return;
    aborted = true;
    for (ncclComm_t c : comms) (void)api->comm_abort(c);
  }
  void forget(ncclComm_t c) {
    std::lock_guard<std::mutex> lock(mu);
    std::erase(comms, c);
  }

  std::string error_text(ncclComm_t comm, ncclResult_t r) const {
    const char* last = comm != nullptr ? api->get_last_error(comm) : nullptr;
    return concat(api->get_error_string(r), last != nullptr && *last != '\0' ? concat(" (", last, ")") : std::string());
  }
  void check(ncclComm_t comm, ncclResult_t r, const char* what) const {
    if (r != ncclSuccess && r != ncclInProgress) throw std::runtime_error(concat(what, ": ", error_text(comm, r)));
  }
  // Polls a non-blocking communicator until its pending call finished; false on timeout.
  bool settle(ncclComm_t comm, const char* what, std::chrono::milliseconds budget) const {
    const auto deadline = std::chrono::steady_clock::now() + budget;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check(comm, api->comm_get_async_error(comm, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return true;
      if (state != ncclInProgress) throw std::runtime_error(concat(what, ": ", error_text(comm, state)));
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
};

// The transport of `comm` (rank `rank` of `size`; the caller has put it in shared->comms) on
// shared->device, connected eagerly (its connect_eagerly: a warm-up under the default timeout that
// aborts every communicator of the root and throws when a peer does not connect) unless
// MESHMUON_NCCL_CONNECT=lazy. `name` names the communicator in that error.
std::shared_ptr<Transport> make_nccl_transport(std::shared_ptr<NcclShared> shared, ncclComm_t comm, int rank, int size,
                                               const std::string& name);

}  // namespace meshmuon::detail
