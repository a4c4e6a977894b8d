// Internal: finding a CUDA device (cuda_device_available: the runtime's device count) and the cuda
// backend's entry in the registry (registry.h: factory, "cuda:N" names, the memory-space probe).
#include <cuda_runtime_api.h>

#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/memory_space.h"
#include "backend/registry.h"

namespace meshmuon::detail {

bool cuda_device_available(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    if (why) *why = cudaGetErrorString(e);
    return false;
  }
  if (count == 0) {
    if (why) *why = "cudaGetDeviceCount found 0 devices";
    return false;
  }
  return true;
}

void register_cuda_backend(BackendRegistry& r) {
  r.add("cuda", [](int index) { return EngineDevice{make_cuda_backend(index), default_memory_space()}; },
        /*indexed=*/true, [] { return cuda_memory_space(); }, "CUDA");
}

}  // namespace meshmuon::detail
