// Internal, SHARED (backend/cuda/shared/, see device_guard.h): CUDA runtime results as the cuda
// backend and the nccl transport report them: errors as meshmuon::Error
// "[cuda] <what>: <runtime's text>", and the event queries whose "not ready" is no error.
#pragma once

#include <cuda_runtime_api.h>

#include "meshmuon/error.h"

namespace meshmuon::detail {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_error(concat("[cuda] ", what, ": ", cudaGetErrorString(e)));
}

// cudaEventQuery, with cudaErrorNotReady (not reached yet, not an error) cleared from the thread's
// last error, where CUDA runtimes have left it: the next launch would report it (PyTorch clears it
// after every query too). cudaEventElapsedTime likewise.
inline cudaError_t query_event(cudaEvent_t e) {
  const cudaError_t r = cudaEventQuery(e);
  if (r == cudaErrorNotReady) (void)cudaGetLastError();
  return r;
}
inline cudaError_t elapsed_ms(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const cudaError_t r = cudaEventElapsedTime(ms, start, end);
  if (r == cudaErrorNotReady) (void)cudaGetLastError();
  return r;
}

}  // namespace meshmuon::detail
