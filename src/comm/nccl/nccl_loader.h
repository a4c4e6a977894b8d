// Internal: libnccl loaded at run time (dlopen), so libmeshmuon never depends on it.
#pragma once

#include <nccl.h>

#include <string>

namespace meshmuon::detail {

struct NcclApi {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&ncclCommSplit) comm_split = nullptr;
  decltype(&ncclCommFinalize) comm_finalize = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGetLastError) get_last_error = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclReduce) reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  std::string library;  // what was loaded
  int version = 0;      // ncclGetVersion
};

// Loads libnccl and resolves every symbol above: `only` if not null (nothing else is tried), else
// libnccl.so.2 on the loader path, else the nvidia-nccl-cu13 wheel's copy found at configure time.
// Throws meshmuon::Error naming what was tried, nvidia-nccl-cu13 and MESHMUON_NCCL_LIBRARY. Not cached.
NcclApi load_nccl(const char* only);
// load_nccl(MESHMUON_NCCL_LIBRARY or null), once per process (a failure is retried on the next call).
const NcclApi& nccl_api();

}  // namespace meshmuon::detail
