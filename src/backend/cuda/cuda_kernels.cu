// The cuda backend's kernels and launchers (cuda_kernels.h), compiled by nvcc with -fmad=false: every
// product and sum is rounded on its own, and __fmaf_rn stands exactly where the cpu kernels call
// std::fma, so each element gets the cpu kernel's bits. The code itself is in device_code.cuh and
// the files it lists, which tests/support/cuda_on_host.h also compiles for the host; this file gives
// it CUDA's launch syntax and runtime.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace meshmuon::cuda {
namespace {

constexpr int kThreads = 256;

cudaError_t done() { return cudaGetLastError(); }

}  // namespace

#define MESHMUON_GRID_LOOP(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)
#define MESHMUON_LAUNCH(kernel, grid, block, stream) kernel<<<(grid), (block), 0, (stream)>>>

#include "backend/cuda/device_code.cuh"

}  // namespace meshmuon::cuda
