// Internal: the launchers of cuda_kernels.h (device_code.cuh includes this file after the kernels):
// each picks its grid, guards empty work and enqueues through MESHMUON_LAUNCH on `s`; none
// synchronizes. Written once for nvcc and for the host run of tests/support/cuda_on_host.h, so the
// grids and the order of a multi-kernel launcher (normuon, sum_squares) are what the host tests run.
#pragma once

namespace {
// One block per kThreads elements, at most 8192 (the kernels loop over the rest).
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 8192 ? 8192 : b));
}
}  // namespace

cudaError_t first_non_finite_multi(const NonFiniteItem* items, int count, int64_t blocks, unsigned long long* flags,
                                   cudaStream_t s) {
  if (count > 0 && blocks > 0) MESHMUON_LAUNCH(non_finite_multi_kernel, static_cast<unsigned>(blocks), kThreads, s)(items, count, flags);
  return done();
}
cudaError_t momentum_multi(const MomentumItem* items, int count, int64_t blocks, cudaStream_t s) {
  if (count > 0 && blocks > 0) MESHMUON_LAUNCH(momentum_multi_kernel, static_cast<unsigned>(blocks), kThreads, s)(items, count);
  return done();
}
cudaError_t apply_multi(const ApplyItem* items, int count, int64_t blocks, cudaStream_t s) {
  if (count > 0 && blocks > 0) MESHMUON_LAUNCH(apply_multi_kernel, static_cast<unsigned>(blocks), kThreads, s)(items, count);
  return done();
}
cudaError_t adamw_multi(const AdamWItem* items, int count, int64_t blocks, cudaStream_t s) {
  if (count > 0 && blocks > 0) MESHMUON_LAUNCH(adamw_multi_kernel, static_cast<unsigned>(blocks), kThreads, s)(items, count);
  return done();
}
cudaError_t scale_rows(float* w, const float* factors, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols > 0) MESHMUON_LAUNCH(scale_rows_kernel, blocks_for(rows * cols), kThreads, s)(w, factors, rows, cols);
  return done();
}
cudaError_t from_bf16(const uint16_t* x, float* y, int64_t n, cudaStream_t s) {
  if (n > 0) MESHMUON_LAUNCH(from_bf16_kernel, blocks_for(n), kThreads, s)(x, y, n);
  return done();
}
cudaError_t ordered_sum(const void* blocks, bool bf16, int64_t n, int blocks_n, float* out, cudaStream_t s) {
  if (n > 0) MESHMUON_LAUNCH(ordered_sum_kernel, blocks_for(n), kThreads, s)(blocks, bf16, n, blocks_n, out);
  return done();
}
cudaError_t divide(float* x, int64_t n, float d, cudaStream_t s) {
  if (n > 0) MESHMUON_LAUNCH(divide_kernel, blocks_for(n), kThreads, s)(x, n, d);
  return done();
}
cudaError_t round_bf16(float* x, int64_t n, cudaStream_t s) {
  if (n > 0) MESHMUON_LAUNCH(round_bf16_kernel, blocks_for(n), kThreads, s)(x, n);
  return done();
}
cudaError_t pack(const PackRun* runs, const int64_t* prefix, int nruns, std::byte* const* bases, int64_t total,
                 cudaStream_t s) {
  if (total > 0 && nruns > 0) MESHMUON_LAUNCH(pack_kernel, blocks_for(total), kThreads, s)(runs, prefix, nruns, bases, total);
  return done();
}
cudaError_t sum_squares(const float* x, int64_t n, double* partials, double* out, cudaStream_t s) {
  const unsigned blocks = blocks_for(n) < static_cast<unsigned>(kSumSquaresBlocks) ? blocks_for(n)
                                                                                   : static_cast<unsigned>(kSumSquaresBlocks);
  MESHMUON_LAUNCH(sum_squares_partial_kernel, blocks, kThreads, s)(x, n, partials);
  MESHMUON_LAUNCH(sum_partials_kernel, 1u, kThreads, s)(partials, static_cast<int>(blocks), out);
  return done();
}
cudaError_t normalize(const float* in, float* out, int64_t n, const double* norm2, double scale, double eps, bool add,
                      cudaStream_t s) {
  if (n > 0) MESHMUON_LAUNCH(normalize_kernel, blocks_for(n), kThreads, s)(in, out, n, norm2, scale, eps, add);
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
    MESHMUON_LAUNCH(normuon_row_mean_square_kernel, grid, dim3(kRowTile, kRowWarps), s)(u, rows, cols, v_mean);
  } else {
    MESHMUON_LAUNCH(normuon_column_mean_square_kernel, blocks_for(cols), kThreads, s)(u, rows, cols, v_mean);
  }
  if (k == 0) return done();
  MESHMUON_LAUNCH(normuon_norm_kernel, 1u, kThreads, s)(v_mean, len, k, sc.norm);
  MESHMUON_LAUNCH(normuon_step_kernel, blocks_for(len), kThreads, s)(v_mean, v, sc.step, len, w);
  MESHMUON_LAUNCH(normuon_ratio_kernel, 1u, kThreads, s)(v_mean, sc.step, len, k, sc.norm, sc.ratio);
  MESHMUON_LAUNCH(normuon_scale_kernel, blocks_for(rows * cols), kThreads, s)(u, rows, cols, sc.step, sc.ratio, per_row);
  return done();
}
cudaError_t muon_eq(const float* in, float* out, int64_t rows, int64_t cols, double* row_sq, double* target,
                    double min_row_norm, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return done();
  const int64_t tiles = (rows + kRowTile - 1) / kRowTile;
  const unsigned grid = static_cast<unsigned>(tiles < 8192 ? tiles : 8192);
  MESHMUON_LAUNCH(muon_eq_row_sq_kernel, grid, dim3(kRowTile, kRowWarps), s)(in, rows, cols, row_sq);
  MESHMUON_LAUNCH(muon_eq_target_kernel, 1u, kThreads, s)(row_sq, rows, target);
  MESHMUON_LAUNCH(muon_eq_scale_kernel, blocks_for(rows * cols), kThreads, s)(in, out, rows, cols, row_sq, target,
                                                                             min_row_norm);
  return done();
}
cudaError_t muon_plus(float* x, int64_t rows, int64_t cols, double* partials, double* norm2, double min_norm,
                      cudaStream_t s) {
  const int64_t n = rows * cols;
  if (n <= 0) return done();
  sum_squares(x, n, partials, norm2, s);
  MESHMUON_LAUNCH(muon_plus_kernel, blocks_for(n), kThreads, s)(x, n, norm2, rows < cols ? rows : cols, min_norm);
  return done();
}
cudaError_t scale(const float* in, float* out, int64_t n, float inv, cudaStream_t s) {
  if (n > 0) MESHMUON_LAUNCH(scale_kernel, blocks_for(n), kThreads, s)(in, out, n, inv);
  return done();
}
cudaError_t ns_polynomial(const float* g, const float* g2, float* z, int64_t side, int64_t stride, int64_t batch,
                          float a, float b, float c, cudaStream_t s) {
  if (side > 0 && batch > 0)
    MESHMUON_LAUNCH(polynomial_kernel, blocks_for(batch * side * side), kThreads, s)(g, g2, z, side, stride, batch, a, b, c);
  return done();
}
cudaError_t mirror_lower(float* a, int64_t side, int64_t stride, int64_t batch, cudaStream_t s) {
  if (side > 1 && batch > 0) MESHMUON_LAUNCH(mirror_lower_kernel, blocks_for(batch * side * side), kThreads, s)(a, side, stride, batch);
  return done();
}
cudaError_t probe_fill(uint16_t* x, int64_t n, int64_t period, cudaStream_t s) {
  if (n > 0 && period > 0) MESHMUON_LAUNCH(probe_fill_kernel, blocks_for(n), kThreads, s)(x, n, period);
  return done();
}
cudaError_t any_mismatch(const float* d, int64_t stride, int64_t batch, const float* ref, int64_t n, unsigned int* flag,
                         cudaStream_t s) {
  if (n > 0 && batch > 0) MESHMUON_LAUNCH(any_mismatch_kernel, blocks_for(batch * n), kThreads, s)(d, stride, batch, ref, n, flag);
  return done();
}
cudaError_t trace(const float* a, int64_t side, double* out, cudaStream_t s) {
  MESHMUON_LAUNCH(trace_kernel, 1u, 1u, s)(a, side, out);
  return done();
}
cudaError_t add_scaled(float* y, const float* x, int64_t n, float b, cudaStream_t s) {
  if (n > 0) MESHMUON_LAUNCH(add_scaled_kernel, blocks_for(n), kThreads, s)(y, x, n, b);
  return done();
}
cudaError_t to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t s) {
  if (n > 0) MESHMUON_LAUNCH(to_bf16_kernel, blocks_for(n), kThreads, s)(x, y, n);
  return done();
}
