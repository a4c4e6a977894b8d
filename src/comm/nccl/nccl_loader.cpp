// libnccl loaded at run time (nccl_loader.h): the candidates, the entry points the communicator
// calls, the process's one copy, and the probe of nccl_probe.h.
#include "comm/nccl/nccl_loader.h"

#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/nccl/nccl_probe.h"
#include "core/dl_symbol.h"
#include "core/library_loader.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {

NcclApi load_nccl(const char* only) {
  std::string wheel = MESHMUON_NCCL_WHEEL_DIR;
  if (!wheel.empty()) wheel += "/libnccl.so.2";
  // Installed from meshmuon's wheel: PyPI's nvidia-nccl-cu13 beside the package in site-packages.
  const std::string& site = install_location().site_packages;
  const std::string beside = site.empty() ? std::string() : site + "/nvidia/nccl/lib/libnccl.so.2";
  std::vector<const char*> candidates;
  if (only != nullptr) {
    candidates.push_back(only);
  } else {
    candidates = {"libnccl.so.2", beside.empty() ? nullptr : beside.c_str(), wheel.empty() ? nullptr : wheel.c_str(),
                  "libnccl.so"};
  }
  NcclApi api;
  const OpenedLibrary lib = open_first_library(candidates, RTLD_NOW | RTLD_LOCAL, [&api](void* h, const char*) {
    api = NcclApi{};
    std::string missing;
    auto sym = [&](auto& fn, const char* symbol) {
      if (!bind_symbol(h, symbol, fn)) missing += concat(missing.empty() ? "" : " ", symbol);
    };
    sym(api.get_version, "ncclGetVersion");
    sym(api.get_unique_id, "ncclGetUniqueId");
    sym(api.comm_init_rank_config, "ncclCommInitRankConfig");
    sym(api.comm_split, "ncclCommSplit");
    sym(api.comm_finalize, "ncclCommFinalize");
    sym(api.comm_destroy, "ncclCommDestroy");
    sym(api.comm_abort, "ncclCommAbort");
    sym(api.comm_get_async_error, "ncclCommGetAsyncError");
    sym(api.get_error_string, "ncclGetErrorString");
    sym(api.get_last_error, "ncclGetLastError");
    sym(api.group_start, "ncclGroupStart");
    sym(api.group_end, "ncclGroupEnd");
    sym(api.send, "ncclSend");
    sym(api.recv, "ncclRecv");
    sym(api.all_reduce, "ncclAllReduce");
    sym(api.broadcast, "ncclBroadcast");
    sym(api.reduce, "ncclReduce");
    sym(api.all_gather, "ncclAllGather");
    sym(api.reduce_scatter, "ncclReduceScatter");
    return missing.empty() ? std::string() : concat("lacks ", missing, "; NCCL 2.18 or newer is needed");
  });
  if (lib.handle == nullptr) {
    const std::string tried = lib.tried();
    throw_error(concat("[nccl] could not load libnccl; tried ", tried.empty() ? std::string("nothing") : tried,
                       ". pip install nvidia-nccl-cu13 (scripts/requirements.txt) or set MESHMUON_NCCL_LIBRARY to the "
                       "path of libnccl.so.2"));
  }
  if (api.get_version(&api.version) != ncclSuccess) api.version = 0;
  api.library = lib.name;
  return api;
}

const NcclApi& nccl_api() {
  static std::mutex mu;
  static std::optional<NcclApi> api;
  std::lock_guard<std::mutex> lock(mu);
  if (!api) {
    const char* user = std::getenv("MESHMUON_NCCL_LIBRARY");
    api = load_nccl(user != nullptr && *user != '\0' ? user : nullptr);
  }
  return *api;
}

std::string nccl_probe(const char* only) {
  const NcclApi api = load_nccl(only);
  return concat(api.library, " (NCCL ", api.version / 10000, ".", api.version / 100 % 100, ".", api.version % 100, ")");
}

}  // namespace meshmuon::detail
