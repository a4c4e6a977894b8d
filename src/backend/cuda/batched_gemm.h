// Internal: the products of a batch of same-shape matrices (the cuda backend's Newton–Schulz), one
// strided-batched cuBLASLt call per product where that keeps a matrix's bits independent of its
// batch (bitwise layout invariance: a matrix gets the same result whatever its batch, owner or
// strategy).
//
// cuBLAS's own GEMM heuristics may pick another kernel for another batch count, so bf16 products go
// through cuBLASLt with one algorithm per call shape (transposes, sizes, leading dimensions and the
// operands' alignments; never the batch count), chosen once per process and device by
// cublasLtMatmulAlgoGetHeuristic at batch 1 with no split-K reduction (CUBLASLT_REDUCTION_SCHEME_NONE)
// and a fixed workspace. Whether that algorithm computes each matrix of a batch of b exactly as it
// computes one alone is not documented, so it is checked before it is relied on: the first call of a
// (shape, b) runs a probe (b identical matrices of hashed bf16 values whose sums round differently
// in another order, batched, against the same product at batch 1) and the batched call is used only
// where every element of every matrix is bitwise equal; otherwise, and where cublasLtMatmulAlgoCheck
// refuses the batched layouts, the batch runs as b calls of the batch-1 algorithm; matrices whose
// strides are not whole 256-byte blocks (so that every one has the first one's alignment) each run
// alone with the algorithm of their own alignment. Where cuBLASLt has no algorithm for the shape,
// and for fp32 products (CUBLAS_COMPUTE_32F_PEDANTIC, cublas_loader.h), every matrix is one
// cublasGemmEx call. Each of these choices is a function of the shape, the strides and the device
// only, so every batch of a shape runs the same per-matrix arithmetic.
//
// libcublasLt is dlopen'd on first use, like cuBLAS, and required for bf16 products (a rank without
// it would compute other bits): $MESHMUON_CUBLASLT_LIBRARY, libcublasLt.so.13, the nvidia-cublas
// wheel's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

struct cublasContext;  // cublasHandle_t (cublas_api.h, which the tests built against this header lack)

namespace meshmuon::detail {

// Column-major D_i (m×n, fp32, ld ldd) = op(A_i)·op(B_i) for i < batch, A_i = a + i·stride_a elements
// (B, D alike); A and B bf16 (fp32 accumulation) or fp32 (true fp32 products).
struct GemmCall {
  bool ta = false, tb = false;
  int m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int lda = 0;
  int64_t stride_a = 0;
  const void* b = nullptr;
  int ldb = 0;
  int64_t stride_b = 0;
  float* d = nullptr;
  int ldd = 0;
  int64_t stride_d = 0;
  bool bf16 = false;
};

// Enqueues the batch on `stream` (the calling thread's current stream on `device`, which is
// current), through `blas` (the thread's cuBLAS handle on that stream) where a product is one
// cublasGemmEx per matrix. A probe takes stream-ordered memory of its own and synchronizes
// `stream` once. Throws meshmuon::Error when cuBLASLt cannot be loaded (bf16 products).
void batched_gemm(const GemmCall& c, int64_t batch, int device, cudaStream_t stream, cublasContext* blas);

// What batched_gemm did since the process started (tests and the bench read it).
struct BatchedGemmCounters {
  uint64_t batched = 0;         // strided-batched cuBLASLt calls (batch > 1)
  uint64_t single = 0;          // cuBLASLt calls at batch 1 (a batch of 1, or a batch run matrix by matrix)
  uint64_t gemm_ex = 0;         // cublasGemmEx calls (fp32, no cuBLASLt, or no algorithm)
  uint64_t probes = 0;          // probes run
  uint64_t probe_mismatch = 0;  // probes that found a batched result differing from batch 1
};
BatchedGemmCounters batched_gemm_counters();

// Tests only: with the probe off, a batched call is trusted without one (the negative control of
// the probe's tests). On by default.
void set_batched_gemm_probe(bool on);

}  // namespace meshmuon::detail
