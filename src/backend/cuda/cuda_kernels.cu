// The cuda backend's kernels (cuda_kernels.h). Compiled with -fmad=false: every product and sum is
// rounded on its own, and __fmaf_rn stands exactly where the cpu kernels call std::fma, so each
// element gets the cpu kernel's bits. Grid-stride loops, one launch per call.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace dmuon::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(b, 1, 8192));
}

#define DMUON_GRID_LOOP(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

#include "backend/cuda/elementwise.cuh"  // element-wise device code and the multi-tensor kernels

__global__ void scale_rows_kernel(float* w, const float* factors, int64_t rows, int64_t cols) {
  DMUON_GRID_LOOP(i, rows * cols) {
    const float f = factors[i / cols];
    if (f != 1.0f) w[i] = __fmul_rn(w[i], f);
  }
}

__global__ void round_bf16_kernel(float* x, int64_t n) {
  DMUON_GRID_LOOP(i, n) x[i] = bf16_bits_to_float(float_to_bf16_bits(x[i]));
}

__global__ void to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  DMUON_GRID_LOOP(i, n) y[i] = float_to_bf16_bits(x[i]);
}

#include "backend/cuda/pack.cuh"  // the pack kernel


#include "backend/cuda/reductions.cuh"  // Σ x² and NorMuon's mean squares and ordered sums

// X₀ = in · fp32(1 / denom) with denom from the device's Σ x², as Orthogonalizer::run computes it;
// an all-zero input (norm or denom 0) gives +0 everywhere, which the iteration keeps exactly.
__global__ void normalize_kernel(const float* in, float* out, int64_t n, const double* norm2, double scale, double eps,
                                 bool add) {
  const double norm = __dsqrt_rn(*norm2);
  const double scaled = __dmul_rn(norm, scale);
  const double denom = add ? __dadd_rn(scaled, eps) : (scaled < eps ? eps : scaled);
  const bool zero = norm == 0 || denom == 0;
  const float inv = zero ? 0.0f : __double2float_rn(__ddiv_rn(1.0, denom));
  DMUON_GRID_LOOP(i, n) out[i] = zero ? 0.0f : __fmul_rn(in[i], inv);
}

// ---- NorMuon (src/kernels/cpu/normuon.cpp, the same operations in the same order) ----

// pass 2a: v ← lerp(v, v_mean, 1 − β₂); step = 1 / sqrt(max(v, 1e-10)).
__global__ void normuon_step_kernel(const float* v_mean, float* v, float* step, int64_t len, float w) {
  DMUON_GRID_LOOP(i, len) {
    const float vi = torch_lerp(v[i], v_mean[i], w);
    v[i] = vi;
    step[i] = __fdiv_rn(1.0f, __fsqrt_rn(vi < 1e-10f ? 1e-10f : vi));
  }
}

// pass 3: u[i, j] ← u[i, j] · fp32(step[t] · ratio), t the row (per row) or the column.
__global__ void normuon_scale_kernel(float* u, int64_t rows, int64_t cols, const float* step, const float* ratio,
                                     bool per_row) {
  const float r = *ratio;
  DMUON_GRID_LOOP(i, rows * cols) {
    const int64_t t = per_row ? i / cols : i % cols;
    u[i] = __fmul_rn(u[i], __fmul_rn(step[t], r));
  }
}

__global__ void scale_kernel(const float* in, float* out, int64_t n, float inv) {
  DMUON_GRID_LOOP(i, n) out[i] = __fmul_rn(in[i], inv);
}

// Batched s×s matrices `stride` elements apart: flat index k is matrix k / s², element k % s².
__global__ void polynomial_kernel(const float* g, const float* g2, float* z, int64_t side, int64_t stride, int64_t batch,
                                  float a, float b, float c) {
  const int64_t ss = side * side;
  DMUON_GRID_LOOP(k, batch * ss) {
    const int64_t r = k % ss, i = k / ss * stride + r;
    float v = __fadd_rn(__fmul_rn(b, g[i]), __fmul_rn(c, g2[i]));
    if (r / side == r % side) v = __fadd_rn(v, a);
    z[i] = v;
  }
}

__global__ void mirror_lower_kernel(float* a, int64_t side, int64_t stride, int64_t batch) {
  const int64_t ss = side * side;
  DMUON_GRID_LOOP(k, batch * ss) {
    const int64_t r = k % ss, i = r / side, j = r % side;
    float* m = a + k / ss * stride;
    if (j > i) m[r] = m[j * side + i];
  }
}

// bf16 values ±[2⁻¹², 2¹³) with 7 random mantissa bits, a hash of i mod period: products exact in
// fp32 over 50 binades, so their sums round, and differently in another order (the batched GEMM
// probe, batched_gemm.h; values of one binade would sum exactly and pass any order).
__global__ void probe_fill_kernel(uint16_t* x, int64_t n, int64_t period) {
  DMUON_GRID_LOOP(i, n) {
    uint32_t h = static_cast<uint32_t>(i % period) * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = static_cast<uint16_t>(((h >> 31) << 15) | ((115u + (h >> 8) % 25u) << 7) | (h & 0x7Fu));
  }
}

// Every thread that finds a difference writes the same 1 (no atomics: only "any" is asked).
__global__ void any_mismatch_kernel(const float* d, int64_t stride, int64_t batch, const float* ref, int64_t n,
                                    unsigned int* flag) {
  DMUON_GRID_LOOP(k, batch * n) {
    if (__float_as_uint(d[k / n * stride + k % n]) != __float_as_uint(ref[k % n])) *flag = 1u;
  }
}

__global__ void trace_kernel(const float* a, int64_t side, double* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double sum = 0;
  for (int64_t i = 0; i < side; ++i) sum = __dadd_rn(sum, static_cast<double>(a[i * side + i]));
  *out = sum;
}

__global__ void add_scaled_kernel(float* y, const float* x, int64_t n, float b) {
  DMUON_GRID_LOOP(i, n) y[i] = __fadd_rn(y[i], __fmul_rn(b, x[i]));
}

cudaError_t done() { return cudaGetLastError(); }

__global__ void from_bf16_kernel(const uint16_t* x, float* y, int64_t n) {
  DMUON_GRID_LOOP(i, n) y[i] = bf16_bits_to_float(x[i]);
}

__global__ void ordered_sum_kernel(const void* blocks, bool bf16, int64_t n, int blocks_n, float* out) {
  DMUON_GRID_LOOP(i, n) {
    float acc = load_grad(blocks, bf16, i);
    for (int j = 1; j < blocks_n; ++j) acc = __fadd_rn(acc, load_grad(blocks, bf16, static_cast<int64_t>(j) * n + i));
    out[i] = acc;
  }
}

__global__ void divide_kernel(float* x, int64_t n, float d) {
  DMUON_GRID_LOOP(i, n) x[i] = __fdiv_rn(x[i], d);
}

}  // namespace

cudaError_t first_non_finite_multi(const NonFiniteItem* items, int count, int64_t blocks, unsigned long long* flags,
                                   cudaStream_t s) {
  if (count > 0 && blocks > 0)
    non_finite_multi_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(items, count, flags);
  return done();
}
cudaError_t momentum_multi(const MomentumItem* items, int count, int64_t blocks, cudaStream_t s) {
  if (count > 0 && blocks > 0) momentum_multi_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(items, count);
  return done();
}
cudaError_t apply_multi(const ApplyItem* items, int count, int64_t blocks, cudaStream_t s) {
  if (count > 0 && blocks > 0) apply_multi_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(items, count);
  return done();
}
cudaError_t adamw_multi(const AdamWItem* items, int count, int64_t blocks, cudaStream_t s) {
  if (count > 0 && blocks > 0) adamw_multi_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(items, count);
  return done();
}
cudaError_t scale_rows(float* w, const float* factors, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols > 0) scale_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, s>>>(w, factors, rows, cols);
  return done();
}
cudaError_t from_bf16(const uint16_t* x, float* y, int64_t n, cudaStream_t s) {
  if (n > 0) from_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  return done();
}
cudaError_t ordered_sum(const void* blocks, bool bf16, int64_t n, int blocks_n, float* out, cudaStream_t s) {
  if (n > 0) ordered_sum_kernel<<<blocks_for(n), kThreads, 0, s>>>(blocks, bf16, n, blocks_n, out);
  return done();
}
cudaError_t divide(float* x, int64_t n, float d, cudaStream_t s) {
  if (n > 0) divide_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, d);
  return done();
}
cudaError_t round_bf16(float* x, int64_t n, cudaStream_t s) {
  if (n > 0) round_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n);
  return done();
}
cudaError_t pack(const PackRun* runs, const int64_t* prefix, int nruns, std::byte* const* bases, int64_t total,
                 cudaStream_t s) {
  if (total > 0 && nruns > 0) pack_kernel<<<blocks_for(total), kThreads, 0, s>>>(runs, prefix, nruns, bases, total);
  return done();
}
cudaError_t sum_squares(const float* x, int64_t n, double* partials, double* out, cudaStream_t s) {
  const unsigned blocks = std::min(blocks_for(n), static_cast<unsigned>(kSumSquaresBlocks));
  sum_squares_partial_kernel<<<blocks, kThreads, 0, s>>>(x, n, partials);
  sum_partials_kernel<<<1, kThreads, 0, s>>>(partials, static_cast<int>(blocks), out);
  return done();
}
cudaError_t normalize(const float* in, float* out, int64_t n, const double* norm2, double scale, double eps, bool add,
                      cudaStream_t s) {
  if (n > 0) normalize_kernel<<<blocks_for(n), kThreads, 0, s>>>(in, out, n, norm2, scale, eps, add);
  return done();
}
cudaError_t normuon(float* u, int64_t rows, int64_t cols, float* v_mean, float* v, float w, NormuonScratch sc,
                    cudaStream_t s) {
  const bool per_row = rows >= cols;
  const int64_t len = per_row ? rows : cols;
  const double k = static_cast<double>(per_row ? cols : rows);
  if (len <= 0) return done();
  if (per_row) {
    const int64_t tiles = (rows + kRowTile - 1) / kRowTile;
    const unsigned grid = static_cast<unsigned>(tiles < 8192 ? tiles : 8192);
    normuon_row_mean_square_kernel<<<grid, dim3(kRowTile, kRowWarps), 0, s>>>(u, rows, cols, v_mean);
  } else {
    normuon_column_mean_square_kernel<<<blocks_for(cols), kThreads, 0, s>>>(u, rows, cols, v_mean);
  }
  if (k == 0) return done();
  normuon_norm_kernel<<<1, kThreads, 0, s>>>(v_mean, len, k, sc.norm);
  normuon_step_kernel<<<blocks_for(len), kThreads, 0, s>>>(v_mean, v, sc.step, len, w);
  normuon_ratio_kernel<<<1, kThreads, 0, s>>>(v_mean, sc.step, len, k, sc.norm, sc.ratio);
  normuon_scale_kernel<<<blocks_for(rows * cols), kThreads, 0, s>>>(u, rows, cols, sc.step, sc.ratio, per_row);
  return done();
}
cudaError_t scale(const float* in, float* out, int64_t n, float inv, cudaStream_t s) {
  if (n > 0) scale_kernel<<<blocks_for(n), kThreads, 0, s>>>(in, out, n, inv);
  return done();
}
cudaError_t ns_polynomial(const float* g, const float* g2, float* z, int64_t side, int64_t stride, int64_t batch,
                          float a, float b, float c, cudaStream_t s) {
  if (side > 0 && batch > 0)
    polynomial_kernel<<<blocks_for(batch * side * side), kThreads, 0, s>>>(g, g2, z, side, stride, batch, a, b, c);
  return done();
}
cudaError_t mirror_lower(float* a, int64_t side, int64_t stride, int64_t batch, cudaStream_t s) {
  if (side > 1 && batch > 0) mirror_lower_kernel<<<blocks_for(batch * side * side), kThreads, 0, s>>>(a, side, stride, batch);
  return done();
}
cudaError_t probe_fill(uint16_t* x, int64_t n, int64_t period, cudaStream_t s) {
  if (n > 0 && period > 0) probe_fill_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, period);
  return done();
}
cudaError_t any_mismatch(const float* d, int64_t stride, int64_t batch, const float* ref, int64_t n, unsigned int* flag,
                         cudaStream_t s) {
  if (n > 0 && batch > 0) any_mismatch_kernel<<<blocks_for(batch * n), kThreads, 0, s>>>(d, stride, batch, ref, n, flag);
  return done();
}
cudaError_t trace(const float* a, int64_t side, double* out, cudaStream_t s) {
  trace_kernel<<<1, 1, 0, s>>>(a, side, out);
  return done();
}
cudaError_t add_scaled(float* y, const float* x, int64_t n, float b, cudaStream_t s) {
  if (n > 0) add_scaled_kernel<<<blocks_for(n), kThreads, 0, s>>>(y, x, n, b);
  return done();
}
cudaError_t to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t s) {
  if (n > 0) to_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  return done();
}

}  // namespace dmuon::cuda
