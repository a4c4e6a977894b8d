// The nccl communicator: a meshmuon::Communicator whose operations run on NCCL (one GPU per rank).
// It is a Transport (meshmuon/comm_transport.h) under the Communicator, so validation,
// byte counters, groups, deadlines and error wording are those of every other backend.
// - Operations: all_to_all_v as grouped ncclSend / ncclRecv; all_gather_v as ncclAllGather (equal
//   packed blocks) or grouped ncclBroadcast per block; reduce_scatter_v as ncclReduceScatter (equal
//   blocks) or grouped ncclReduce per block; all_reduce, broadcast; barrier as a 1-element
//   all-reduce; send / recv batches grouped; split through ncclCommSplit.
// - Buffers: device memory is used in place; host memory (flags, split's (color, key)) goes through
//   device scratch and pinned bounce buffers. NCCL runs on the communicator's own stream, which
//   waits for no other stream unless told: device buffers must hold their data when the call is
//   made, or be ordered with Communicator::order_after(event) (the stream then waits for the event
//   on the device; the engines order their posts so).
// - Completion: a CUDA event recorded after the operation plus ncclCommGetAsyncError, polled by
//   Work::test / wait. A wait past its deadline aborts the NCCL communicators of the root and its
//   splits (ncclCommAbort) and throws meshmuon::Error naming rank, collective, label and communicator.
// - Reductions: NCCL's (bf16 sums accumulate as NCCL does); max / min and integer sums are exact.
// - Loading: libmeshmuon does not link NCCL. libnccl.so.2 is dlopen'd when the first nccl communicator
//   is made: MESHMUON_NCCL_LIBRARY if set (only that), else libnccl.so.2 on the loader path, else the
//   copy in the PyPI wheel nvidia-nccl-cu13 found at configure time.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "meshmuon/comm.h"
#include "meshmuon/export.h"

namespace meshmuon {

// All-gathers a byte blob among the ranks of the job: every rank passes its blob (all of the same
// length) and gets size * length bytes, rank order. Called once per make_nccl_communicator, from
// the calling thread. In Python: torch.distributed.all_gather_object, or an MPI all-gather.
using CommExchange = std::function<std::vector<std::byte>(std::span<const std::byte>)>;

// COLLECTIVE over the ranks `exchange` spans: rank `rank` of `size`, on CUDA device `device`
// (-1: the calling thread's current device), named `name`. Bounded by MESHMUON_TIMEOUT_S (a rank that
// never arrives makes the others throw meshmuon::Error, after ncclCommAbort). Throws meshmuon::Error when
// the build has no CUDA ("[nccl] meshmuon was built without CUDA ..."), the build has no NCCL headers,
// there is no CUDA device ("[nccl] no CUDA device: ..."), or libnccl cannot be loaded (the message
// names nvidia-nccl-cu13 and MESHMUON_NCCL_LIBRARY); std::invalid_argument for a bad rank / size or an
// exchange that returns the wrong number of bytes. A rank whose own preparation fails (device,
// libnccl, rank 0's unique id) still joins the one exchange and then throws its error; every other
// rank throws meshmuon::Error naming that rank and its reason, so no rank waits on a peer that left.
MESHMUON_API std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, CommExchange exchange,
                                                               int device = -1, std::string name = "world");

// The same, bootstrapped over MPI_COMM_WORLD (make_communicator("nccl")); in a build without MPI,
// a world of one rank. Device: local rank modulo the visible devices (OMPI_COMM_WORLD_LOCAL_RANK).
MESHMUON_API std::unique_ptr<Communicator> make_nccl_communicator();

// True when this build has the nccl communicator compiled in (CUDA and NCCL headers); whether it
// runs depends on a device and libnccl being present.
MESHMUON_API bool nccl_available();

}  // namespace meshmuon
