// Internal, SHARED (backend/cuda/shared/: the CUDA helpers both the cuda backend and the nccl transport
// include; tools/lint/check_layers.py lets src/comm/ include this folder only, not the rest of
// backend/cuda/): DeviceGuard, the one scope that makes a CUDA device current (the cuda backend's
// calls and streams, the nccl communicator's transport and bootstrap).
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/shared/cuda_error.h"

namespace meshmuon::detail {

// Makes `device` current until the end of the scope; then the device that was current before is
// current again (torch's current device on the caller's thread is left as it was). Throws
// meshmuon::Error "[cuda] cudaGetDevice / cudaSetDevice: ..." when the runtime refuses.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) != cudaSuccess || now != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // the caller's device
};

}  // namespace meshmuon::detail
