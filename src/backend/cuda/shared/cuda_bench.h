// Internal: `meshmuon bench ns --device cuda`: the cuda backend's Newton–Schulz timed next to a cuBLAS
// GEMM of the same sizes in the same run (src/backend/cuda/cuda_bench.cpp; without CUDA, no_cuda.cpp
// throws meshmuon::Error "[cuda] meshmuon was built without CUDA").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshmuon/orthogonalize.h"

namespace meshmuon::detail {

struct CudaNsTiming {
  std::string device;               // the GPU's name (cudaGetDeviceProperties)
  std::vector<double> ns_seconds;   // one orthogonalization per timed repeat (device synchronized)
  // One GEMM each per timed repeat (cudaEvent times), operands in the Newton–Schulz products' dtype
  // (fp32 with TF32 off, or bf16), fp32 accumulation and output, as the backend calls them: the Gram
  // product s×l·l×s (NT) and the update s×s·s×l (NN), s = min(m, n), l = max(m, n).
  std::vector<double> gram_gemm_seconds, apply_gemm_seconds;
  std::vector<float> result;        // the orthogonalized matrix, row-major m×n (host copy)
  // batch > 1: `batch` copies of the matrix orthogonalized by one muon_units call (the products
  // batched, batched_gemm.h) and one matrix at a time (batch calls), one each per timed repeat, and
  // whether every copy came out bitwise equal to the matrix alone.
  int64_t batch = 1;
  std::vector<double> batched_seconds, one_at_a_time_seconds;
  bool batch_bitwise = true;
};

// The flops the cuda backend's Newton–Schulz does for an m×n matrix (2 per multiply-add, every
// product it issues: plain GEMMs, or the block-triangle ones of method symmetric / gram).
double cuda_ns_flops_done(int64_t m, int64_t n, const NsOptions& options);

// Device 0. `g` is a row-major m×n host matrix; `options` as for Orthogonalizer (gram runs as symmetric on
// the cuda backend). Warm-up runs are untimed; repeats ≥ 1; batch ≥ 1 (see CudaNsTiming).
CudaNsTiming time_ns_cuda(const NsOptions& options, const float* g, int64_t m, int64_t n, int warmup, int repeats,
                          int64_t batch = 1);

}  // namespace meshmuon::detail
