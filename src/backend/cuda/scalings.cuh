// Internal: nanochat's two scalings around the polar iteration on the device (device_code.cuh;
// src/backend/cpu/kernels/equilibrate.cpp): MuonEq's row equilibration before the normalization, bitwise the
// cpu's (its row sums in the cpu's order: 8 interleaved partial sums per row, combined pairwise, rows
// added in order), and Muon+'s renormalization after the last step, from the device's Σ x² (the fixed
// tree of reductions.cuh: deterministic, not the cpu's order). tests/unit/cuda_kernels_host_test.cpp
// runs them on the host. The includer provides kThreads, kRowTile / kRowWarps / stage_row_tile (normuon.cuh),
// MESHMUON_GRID_LOOP and the CUDA intrinsics used here (__fmul_rn, __dadd_rn, __dmul_rn, __ddiv_rn,
// __dsqrt_rn, __double2float_rn).
#pragma once

// MuonEq pass 1: row r's Σ x² in double, in the cpu's order: column c goes to partial sum c % 8 while
// c < cols − cols % 8, the rest to partial sum 0, the eight combined ((0+1)+(2+3))+((4+5)+(6+7)).
// Tiled through shared memory (stage_row_tile) as NorMuon's row kernel: thread (t, 0) walks row t's columns
// in order (x² of a float is exact in double, so a fused multiply-add would give the same bits).
__global__ void muon_eq_row_sq_kernel(const float* x, int64_t rows, int64_t cols, double* row_sq) {
  __shared__ float tile[kRowTile][kRowTile + 1];  // +1: the column reads hit distinct banks
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t whole = cols - cols % 8;  // columns summed in 8 interleaved partial sums
  for (int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRowTile; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.x) * kRowTile) {  // (uniform per block: no divergent __syncthreads)
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t c0 = 0; c0 < cols; c0 += kRowTile) {
      stage_row_tile(tile, x, rows, cols, r0, c0, tx, ty);
      __syncthreads();
      if (ty == 0) {
        const int64_t n = cols - c0 < kRowTile ? cols - c0 : kRowTile;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t c = c0 + j;
          const double v = tile[tx][j];
          const int lane = c < whole ? static_cast<int>(c % 8) : 0;
          acc[lane] = __dadd_rn(acc[lane], __dmul_rn(v, v));
        }
      }
      __syncthreads();
    }
    if (ty == 0 && r0 + tx < rows)
      row_sq[r0 + tx] = __dadd_rn(__dadd_rn(__dadd_rn(acc[0], acc[1]), __dadd_rn(acc[2], acc[3])),
                                  __dadd_rn(__dadd_rn(acc[4], acc[5]), __dadd_rn(acc[6], acc[7])));
  }
}

// MuonEq pass 2 (one block): the target row norm sqrt(Σ row_sq) / sqrt(rows), the rows added in
// order (staged through shared memory, thread 0 adds; as normuon_norm_kernel).
constexpr int kEqSumTile = 2 * kThreads;
__global__ void muon_eq_target_kernel(const double* row_sq, int64_t rows, double* target) {
  __shared__ double tile[kEqSumTile];
  double sum = 0;
  for (int64_t base = 0; base < rows; base += kEqSumTile) {
    const int n = static_cast<int>(rows - base < kEqSumTile ? rows - base : kEqSumTile);
    for (int t = static_cast<int>(threadIdx.x); t < n; t += blockDim.x) tile[t] = row_sq[base + t];
    __syncthreads();
    if (threadIdx.x == 0)
      for (int t = 0; t < n; ++t) sum = __dadd_rn(sum, tile[t]);
    __syncthreads();
  }
  if (threadIdx.x == 0) *target = __ddiv_rn(__dsqrt_rn(sum), __dsqrt_rn(static_cast<double>(rows)));
}

// MuonEq pass 3: out = in · fp32(target / max(sqrt(row_sq[r]), min_row_norm)), one fp32 product per
// element (in and out may be the same matrix).
__global__ void muon_eq_scale_kernel(const float* in, float* out, int64_t rows, int64_t cols, const double* row_sq,
                                     const double* target, double min_row_norm) {
  MESHMUON_GRID_LOOP(k, rows * cols) {
    const double norm = __dsqrt_rn(row_sq[k / cols]);
    const float s = __double2float_rn(__ddiv_rn(*target, norm > min_row_norm ? norm : min_row_norm));
    out[k] = __fmul_rn(in[k], s);
  }
}

// Muon+ (side = min(m, n)): x ← x · fp32(sqrt(side) / max(sqrt(Σ x²), min_norm)) with Σ x² from the device.
__global__ void muon_plus_kernel(float* x, int64_t n, const double* norm2, int64_t side, double min_norm) {
  const double norm = __dsqrt_rn(*norm2);
  const float s = __double2float_rn(__ddiv_rn(__dsqrt_rn(static_cast<double>(side)), norm > min_norm ? norm : min_norm));
  MESHMUON_GRID_LOOP(i, n) x[i] = __fmul_rn(x[i], s);
}
