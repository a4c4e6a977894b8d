// Internal: Σ x² for Newton–Schulz's norm on the device (device_code.cuh): a fixed tree through
// shared memory, the same bits on every run. tests/unit/cuda_kernels_host_test.cpp runs it on the
// host (tests/support/cuda_on_host.h: one fiber per CUDA thread, __syncthreads a switch) against the
// tree it promises. The includer provides kThreads, MESHMUON_GRID_LOOP, __dadd_rn and __dmul_rn.
#pragma once

// Σ x² in double, deterministic: a grid fixed by n (kSumSquaresBlocks at most), one partial per block
// from a fixed tree, then one block sums the partials in a fixed order. No atomics: the same input
// gives the same bits on every run (the norm feeds every element of Newton–Schulz's X₀).
__global__ void sum_squares_partial_kernel(const float* x, int64_t n, double* partials) {
  __shared__ double partial[kThreads];
  double acc = 0;
  MESHMUON_GRID_LOOP(i, n) {
    const double v = x[i];
    acc = __dadd_rn(acc, __dmul_rn(v, v));
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) partial[threadIdx.x] = __dadd_rn(partial[threadIdx.x], partial[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = partial[0];
}

__global__ void sum_partials_kernel(const double* partials, int count, double* out) {
  __shared__ double partial[kThreads];
  double acc = 0;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += kThreads) acc = __dadd_rn(acc, partials[i]);
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) partial[threadIdx.x] = __dadd_rn(partial[threadIdx.x], partial[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = partial[0];
}
