// Internal: the cuda backend's Newton–Schulz orchestration: muon_batch (the matrices of a batch of
// units orthogonalized together, one batched cuBLAS(Lt) call per product, then NorMuon and the comm
// rounding) and gram_newton_schulz (the gram_allreduce strategy's iteration). The products go
// through batched_gemm.h / cublas_loader.h, the element-wise passes through cuda_kernels.h, the
// work through the thread's NS scratch (thread_resources.h). CudaBackend (cuda_backend.cpp) calls them.
#pragma once

#include <cstdint>
#include <span>

#include "backend/backend.h"

namespace meshmuon::detail {

// Backend::muon_batch on `device`, for `backend` (its fence and comm rounding): the matrices of
// every unit, set_cuda_ns_batch_bytes (cuda_backend.h) of scratch at a time. A matrix's bits do not
// depend on its batch.
void cuda_muon_batch(Backend& backend, int device, Orthogonalizer& orth, std::span<const Backend::UnitRef> units,
                     int64_t rows, int64_t cols, float* v_mean, double beta2, DType comm);

// Backend::gram_newton_schulz on `device`, for `backend` (as cuda_muon_batch).
void cuda_gram_newton_schulz(Backend& backend, int device, const NsOptions& ns, float* x, int64_t m, int64_t n,
                             bool wide, int64_t sd, const GramReduce& reduce, DType comm);

}  // namespace meshmuon::detail
