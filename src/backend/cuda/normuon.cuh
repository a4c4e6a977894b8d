// Internal: NorMuon on the device (device_code.cuh; src/backend/cpu/kernels/normuon.cpp, the same
// operations in the same order): the mean squares per row or column, the two ordered sums, the
// state's EMA and the scaling. The sums go through shared memory and barriers;
// tests/unit/cuda_kernels_host_test.cpp runs them on the host (tests/support/cuda_on_host.h),
// bitwise against the cpu kernels. The includer provides kThreads, MESHMUON_GRID_LOOP, torch_lerp
// (elementwise.cuh) and the CUDA intrinsics used here (__fmul_rn, __fdiv_rn, __fsqrt_rn, __dadd_rn,
// __dmul_rn, __ddiv_rn, __dsqrt_rn, __double2float_rn).
#pragma once

// v_mean: per row (rows ≥ cols) the mean over the columns, else per column over the rows; each a
// sequential double sum in the cpu order, one thread per row / column.
// Per column (rows < cols): thread t walks column t, so a warp reads 32 neighbouring floats of a
// row at a time (coalesced).
__global__ void normuon_column_mean_square_kernel(const float* u, int64_t rows, int64_t cols, float* v_mean) {
  MESHMUON_GRID_LOOP(t, cols) {
    double sum = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const double x = u[i * cols + t];
      sum = __dadd_rn(sum, __dmul_rn(x, x));
    }
    v_mean[t] = rows > 0 ? __double2float_rn(__ddiv_rn(sum, static_cast<double>(rows))) : 0.0f;
  }
}

// Per row (rows ≥ cols): a block of kRowTile × kRowWarps threads takes kRowTile rows and walks their
// columns kRowTile at a time; each tile goes through shared memory (read row by row, so a warp reads
// kRowTile neighbouring floats: coalesced), and thread (t, 0) adds row t's kRowTile values in
// column order: the cpu's sequential sum, read without a stride of `cols` between threads.
constexpr int kRowTile = 32, kRowWarps = 8;
// Stages the tile of rows [r0, r0 + kRowTile) × columns [c0, c0 + kRowTile) of the row-major
// rows × cols matrix x in shared memory (zeros outside it), row by row: thread (tx, ty) reads
// column c0 + tx of rows ty, ty + kRowWarps, ... (a warp reads kRowTile neighbouring floats). The
// caller synchronizes after it. Shared with MuonEq's row sums (scalings.cuh).
__device__ __forceinline__ void stage_row_tile(float (*tile)[kRowTile + 1], const float* x, int64_t rows, int64_t cols,
                                               int64_t r0, int64_t c0, int tx, int ty) {
  for (int j = ty; j < kRowTile; j += kRowWarps) {
    const int64_t r = r0 + j, c = c0 + tx;
    tile[j][tx] = r < rows && c < cols ? x[r * cols + c] : 0.0f;
  }
}
__global__ void normuon_row_mean_square_kernel(const float* u, int64_t rows, int64_t cols, float* v_mean) {
  __shared__ float tile[kRowTile][kRowTile + 1];  // +1: the column reads hit distinct banks
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for (int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRowTile; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.x) * kRowTile) {  // (uniform per block: no divergent __syncthreads)
    double sum = 0;
    for (int64_t c0 = 0; c0 < cols; c0 += kRowTile) {
      stage_row_tile(tile, u, rows, cols, r0, c0, tx, ty);
      __syncthreads();
      if (ty == 0) {
        const int64_t n = cols - c0 < kRowTile ? cols - c0 : kRowTile;
        for (int64_t j = 0; j < n; ++j) {
          const double x = tile[tx][j];
          sum = __dadd_rn(sum, __dmul_rn(x, x));
        }
      }
      __syncthreads();
    }
    if (ty == 0 && r0 + tx < rows)
      v_mean[r0 + tx] = cols > 0 ? __double2float_rn(__ddiv_rn(sum, static_cast<double>(cols))) : 0.0f;
  }
}

// The two ordered sums of normuon_finish run on one block: its threads stage kSumTile values at a
// time in shared memory (coalesced reads), thread 0 adds them in index order (the cpu's sequential
// sum; its loop reads shared memory, not global memory, each add).
constexpr int kSumTile = 4 * kThreads;

// pass 1: the incoming update's norm, sqrt(Σ v_mean · k), summed in order.
__global__ void normuon_norm_kernel(const float* v_mean, int64_t len, double k, double* norm) {
  __shared__ float tile[kSumTile];
  double sum = 0;
  for (int64_t base = 0; base < len; base += kSumTile) {
    const int n = static_cast<int>(len - base < kSumTile ? len - base : kSumTile);
    for (int t = static_cast<int>(threadIdx.x); t < n; t += blockDim.x) tile[t] = v_mean[base + t];
    __syncthreads();
    if (threadIdx.x == 0)
      for (int t = 0; t < n; ++t) sum = __dadd_rn(sum, static_cast<double>(tile[t]));
    __syncthreads();
  }
  if (threadIdx.x == 0) *norm = __dsqrt_rn(__dmul_rn(sum, k));
}

// pass 2b: the norm after scaling (in order, staged as normuon_norm_kernel) and the ratio that
// restores the norm.
__global__ void normuon_ratio_kernel(const float* v_mean, const float* step, int64_t len, double k, const double* norm,
                                     float* ratio) {
  __shared__ float tile_v[kSumTile / 2], tile_s[kSumTile / 2];
  double sum_new = 0;
  for (int64_t base = 0; base < len; base += kSumTile / 2) {
    const int n = static_cast<int>(len - base < kSumTile / 2 ? len - base : kSumTile / 2);
    for (int t = static_cast<int>(threadIdx.x); t < n; t += blockDim.x) tile_v[t] = v_mean[base + t], tile_s[t] = step[base + t];
    __syncthreads();
    if (threadIdx.x == 0)
      for (int t = 0; t < n; ++t) {
        const double s = tile_s[t];
        sum_new = __dadd_rn(sum_new, __dmul_rn(__dmul_rn(static_cast<double>(tile_v[t]), k), __dmul_rn(s, s)));
      }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double norm_new = __dsqrt_rn(sum_new);
    *ratio = __double2float_rn(__ddiv_rn(*norm, norm_new < 1e-10 ? 1e-10 : norm_new));
  }
}

// pass 2a: v ← lerp(v, v_mean, 1 − β₂); step = 1 / sqrt(max(v, 1e-10)).
__global__ void normuon_step_kernel(const float* v_mean, float* v, float* step, int64_t len, float w) {
  MESHMUON_GRID_LOOP(i, len) {
    const float vi = torch_lerp(v[i], v_mean[i], w);
    v[i] = vi;
    step[i] = __fdiv_rn(1.0f, __fsqrt_rn(vi < 1e-10f ? 1e-10f : vi));
  }
}

// pass 3: u[i, j] ← u[i, j] · fp32(step[t] · ratio), t the row (per row) or the column.
__global__ void normuon_scale_kernel(float* u, int64_t rows, int64_t cols, const float* step, const float* ratio,
                                     bool per_row) {
  const float r = *ratio;
  MESHMUON_GRID_LOOP(i, rows * cols) {
    const int64_t t = per_row ? i / cols : i % cols;
    u[i] = __fmul_rn(u[i], __fmul_rn(step[t], r));
  }
}
