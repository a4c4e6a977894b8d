// Internal: the cuda backend's kernels (cuda_kernels.cu, compiled by nvcc with -fmad=false), behind
// a plain launcher interface so that the host side (cuda_*.cpp) is ordinary C++. The launchers
// are defined in launchers.cuh, the kernels in the .cuh files device_code.cuh lists. Each launcher
// enqueues on `stream` and returns the launch's error; none synchronizes. Numerics are exactly those
// of the cpu kernels (src/backend/cpu/kernels, update.h): scalars arrive already rounded to fp32 as the cpu
// code rounds them, fma only where the cpu code calls std::fma.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/device_scratch.h"
#include "backend/cuda/multi_tensor.h"
#include "backend/pack.h"
#include "backend/cpu/kernels/adam_scalars.h"

namespace meshmuon::cuda {

using detail::PackConv;
using detail::PackRun;

using cpu::AdamScalars;  // backend/cpu/kernels/adam_scalars.h: the cpu kernel's scalars, derived once (update_args.h)

cudaError_t momentum_multi(const MomentumItem* items, int count, int64_t blocks, cudaStream_t s);
cudaError_t apply_multi(const ApplyItem* items, int count, int64_t blocks, cudaStream_t s);
// AdamW over `count` tensors of the table `items` (device memory) in one launch of `blocks` blocks
// (Σ multi_tensor_blocks): every element gets the arithmetic of adamw, so each tensor the bits it
// gets alone.
cudaError_t adamw_multi(const AdamWItem* items, int count, int64_t blocks, cudaStream_t s);
// rows × cols row-major, row r scaled by factors[r] (device) unless that factor is exactly 1.
cudaError_t scale_rows(float* w, const float* factors, int64_t rows, int64_t cols, cudaStream_t s);
// x ← fp32(bf16(x)) (round to nearest even, NaN → 0x7FC0, as meshmuon/bf16.h).
cudaError_t round_bf16(float* x, int64_t n, cudaStream_t s);
cudaError_t first_non_finite_multi(const NonFiniteItem* items, int count, int64_t blocks, unsigned long long* flags,
                                   cudaStream_t s);
// A pack table (device copies of the runs, their element prefix sums (nruns + 1), the bases).
cudaError_t pack(const PackRun* runs, const int64_t* prefix, int nruns, std::byte* const* bases, int64_t total,
                 cudaStream_t s);
// *out = Σ x² in double, deterministically (fixed grid and order; no atomics); `partials` is device
// scratch of kSumSquaresBlocks doubles (device_scratch.h).
cudaError_t sum_squares(const float* x, int64_t n, double* partials, double* out, cudaStream_t s);
// out = in · fp32(1 / denom), denom = sqrt(*norm2)·scale + eps (add) or max(sqrt(*norm2)·scale, eps),
// as Orthogonalizer::run; +0 everywhere when the norm or denom is 0. No host synchronization.
cudaError_t normalize(const float* in, float* out, int64_t n, const double* norm2, double scale, double eps, bool add,
                      cudaStream_t s);
// NorMuon on the orthogonalized rows × cols update u (normuon_mean_square then normuon_finish of
// update.h, bitwise): v_mean (normuon_state_size floats) receives the mean squares, v the EMA state,
// w = fp32(1 − β₂). Device scratch: NormuonScratch (device_scratch.h).
cudaError_t normuon(float* u, int64_t rows, int64_t cols, float* v_mean, float* v, float w, NormuonScratch sc,
                    cudaStream_t s);
// MuonEq row equilibration (NsOptions::muon_eq) of the row-major rows × cols matrix `in` into `out`
// (may equal `in`), bitwise cpu::muon_eq_rows: row_sq (rows doubles) and target (one double) are
// device scratch.
cudaError_t muon_eq(const float* in, float* out, int64_t rows, int64_t cols, double* row_sq, double* target,
                    double min_row_norm, cudaStream_t s);
// Muon+ renormalization (NsOptions::muon_plus) in place: x · fp32(sqrt(min(rows, cols)) /
// max(sqrt(Σ x²), min_norm)), Σ x² as sum_squares (its fixed tree, so not the cpu's bits; the same on
// every run and for every batch); partials / norm2 as sum_squares'.
cudaError_t muon_plus(float* x, int64_t rows, int64_t cols, double* partials, double* norm2, double min_norm,
                      cudaStream_t s);
// out = in · inv (each product rounded once).
cudaError_t scale(const float* in, float* out, int64_t n, float inv, cudaStream_t s);
// `batch` s×s matrices `stride` elements apart (g, g2, z alike): z = b·g + c·g2 (each product
// rounded, then the sum), then z_ii += a (as gram_polynomial).
cudaError_t ns_polynomial(const float* g, const float* g2, float* z, int64_t side, int64_t stride, int64_t batch,
                          float a, float b, float c, cudaStream_t s);
// Column blocks of a symmetric product's block triangle (the cuda backend's method symmetric): the
// side is cut into lower_blocks(side) near-equal blocks; block b spans [lower_bound(side, b),
// lower_bound(side, b + 1)): side·b/B rounded down to a multiple of 64, so every block's operands
// and output start 128-byte aligned past the matrix's own (cuBLASLt picks its aligned, TMA kernels;
// at side·b/B a bf16 block could start 2-byte aligned). One block (a full GEMM) up to 512, at most 8
// (≥ 512 columns each, so the rounding leaves none empty): big GEMMs that still skip (1 − 1/B)/2 of
// the product. The flops done for side s and inner size k: Σ_b 2·c1·(c1 − c0)·k.
inline int64_t lower_blocks(int64_t side) { return side <= 512 ? 1 : (side / 512 < 8 ? side / 512 : 8); }
inline int64_t lower_bound(int64_t side, int64_t b) {
  const int64_t blocks = lower_blocks(side);
  return b >= blocks ? side : side * b / blocks / 64 * 64;
}
inline double lower_product_flops(int64_t side, int64_t k) {
  const int64_t blocks = lower_blocks(side);
  double f = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = lower_bound(side, b), c1 = lower_bound(side, b + 1);
    f += 2.0 * static_cast<double>(c1) * static_cast<double>(c1 - c0) * static_cast<double>(k);
  }
  return f;
}
// `batch` side×side row-major matrices `stride` elements apart from a: the lower triangle copied onto
// the upper one (exactly symmetric).
cudaError_t mirror_lower(float* a, int64_t side, int64_t stride, int64_t batch, cudaStream_t s);
// x[i] = a bf16 value ±[2⁻¹², 2¹³) with a hashed exponent and 7-bit mantissa, a function of i mod
// period only (the batched GEMM probe's operands: every matrix of a batch the same; products over
// 50 binades, so sums in another order round differently).
cudaError_t probe_fill(uint16_t* x, int64_t n, int64_t period, cudaStream_t s);
// *flag = 1 when an element of the `batch` n-element blocks `stride` apart from d differs from ref
// in its bits (else *flag is left as the caller set it).
cudaError_t any_mismatch(const float* d, int64_t stride, int64_t batch, const float* ref, int64_t n, unsigned int* flag,
                         cudaStream_t s);
// *out = Σ a[i, i] in double, in index order (one thread; deterministic).
cudaError_t trace(const float* a, int64_t side, double* out, cudaStream_t s);
// y[i] = y[i] + fp32(b · x[i]) (the cpu gram path's `a2[i] += b * a[i]`).
cudaError_t add_scaled(float* y, const float* x, int64_t n, float b, cudaStream_t s);
// y = bf16(x) as raw bits.
cudaError_t to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t s);

// y = fp32(x) from raw bf16 bits (exact).
cudaError_t from_bf16(const uint16_t* x, float* y, int64_t n, cudaStream_t s);
// FSDP's fixed-order sum (Backend::ordered_sum): out[i] = b0[i], then out[i] += bj[i] for j = 1..blocks-1
// (blocks of n elements back to back, fp32 or bf16 widened), each sum rounded on its own.
cudaError_t ordered_sum(const void* blocks, bool bf16, int64_t n, int blocks_n, float* out, cudaStream_t s);
// x[i] = x[i] / d (IEEE division: -prec-div=true).
cudaError_t divide(float* x, int64_t n, float d, cudaStream_t s);

}  // namespace meshmuon::cuda
