// Internal: Newton–Schulz's element-wise device code (device_code.cuh) around the GEMMs of
// cuda_ns.cpp: X₀'s normalization from the device's Σ x², the polynomial of the Gram form, the
// mirror of a symmetric product's lower block triangle, and the Gram path's trace and scaled add.
// The includer provides MESHMUON_GRID_LOOP and the CUDA intrinsics used here (__fmul_rn, __fadd_rn,
// __dadd_rn, __dmul_rn, __ddiv_rn, __dsqrt_rn, __double2float_rn).
#pragma once

// X₀ = in · fp32(1 / denom) with denom from the device's Σ x², as Orthogonalizer::run computes it;
// an all-zero input (norm or denom 0) gives +0 everywhere, which the iteration keeps exactly.
__global__ void normalize_kernel(const float* in, float* out, int64_t n, const double* norm2, double scale, double eps,
                                 bool add) {
  const double norm = __dsqrt_rn(*norm2);
  const double scaled = __dmul_rn(norm, scale);
  const double denom = add ? __dadd_rn(scaled, eps) : (scaled < eps ? eps : scaled);
  const bool zero = norm == 0 || denom == 0;
  const float inv = zero ? 0.0f : __double2float_rn(__ddiv_rn(1.0, denom));
  MESHMUON_GRID_LOOP(i, n) out[i] = zero ? 0.0f : __fmul_rn(in[i], inv);
}

__global__ void scale_kernel(const float* in, float* out, int64_t n, float inv) {
  MESHMUON_GRID_LOOP(i, n) out[i] = __fmul_rn(in[i], inv);
}

// Batched s×s matrices `stride` elements apart: flat index k is matrix k / s², element k % s².
__global__ void polynomial_kernel(const float* g, const float* g2, float* z, int64_t side, int64_t stride, int64_t batch,
                                  float a, float b, float c) {
  const int64_t ss = side * side;
  MESHMUON_GRID_LOOP(k, batch * ss) {
    const int64_t r = k % ss, i = k / ss * stride + r;
    float v = __fadd_rn(__fmul_rn(b, g[i]), __fmul_rn(c, g2[i]));
    if (r / side == r % side) v = __fadd_rn(v, a);
    z[i] = v;
  }
}

__global__ void mirror_lower_kernel(float* a, int64_t side, int64_t stride, int64_t batch) {
  const int64_t ss = side * side;
  MESHMUON_GRID_LOOP(k, batch * ss) {
    const int64_t r = k % ss, i = r / side, j = r % side;
    float* m = a + k / ss * stride;
    if (j > i) m[r] = m[j * side + i];
  }
}

__global__ void trace_kernel(const float* a, int64_t side, double* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double sum = 0;
  for (int64_t i = 0; i < side; ++i) sum = __dadd_rn(sum, static_cast<double>(a[i * side + i]));
  *out = sum;
}

__global__ void add_scaled_kernel(float* y, const float* x, int64_t n, float b) {
  MESHMUON_GRID_LOOP(i, n) y[i] = __fadd_rn(y[i], __fmul_rn(b, x[i]));
}
