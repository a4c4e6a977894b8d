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

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  // NaN
  const uint32_t rounding_bias = ((u >> 16) & 1u) + 0x7FFFu;
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

__device__ __forceinline__ float load_grad(const void* g, bool bf16, int64_t i) {
  return bf16 ? bf16_bits_to_float(static_cast<const uint16_t*>(g)[i]) : static_cast<const float*>(g)[i];
}

// torch_lerp of src/kernels/cpu/elementwise.h
__device__ __forceinline__ float torch_lerp(float a, float b, float w) {
  const float diff = __fsub_rn(b, a);
  return fabsf(w) < 0.5f ? __fmaf_rn(w, diff, a) : __fmaf_rn(__fsub_rn(w, 1.0f), diff, b);
}

#define DMUON_GRID_LOOP(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void ema_kernel(float* buf, const void* grad, bool bf16, float* update, int64_t n, float w_grad, float mu,
                           bool nesterov) {
  DMUON_GRID_LOOP(i, n) {
    const float g = load_grad(grad, bf16, i);
    const float b = torch_lerp(buf[i], g, w_grad);
    buf[i] = b;
    update[i] = nesterov ? torch_lerp(g, b, mu) : b;
  }
}

__global__ void heavy_ball_kernel(float* buf, const void* grad, bool bf16, float* update, int64_t n, float mu,
                                  bool nesterov) {
  DMUON_GRID_LOOP(i, n) {
    const float g = load_grad(grad, bf16, i);
    const float scaled = __fmul_rn(buf[i], mu);
    const float b = __fadd_rn(scaled, g);
    buf[i] = b;
    update[i] = nesterov ? __fmaf_rn(b, mu, g) : b;
  }
}

__global__ void decoupled_kernel(float* p, const float* u, int64_t n, float keep, float neg_lr) {
  DMUON_GRID_LOOP(i, n) {
    const float decayed = __fmul_rn(p[i], keep);
    p[i] = __fmaf_rn(u[i], neg_lr, decayed);
  }
}

__global__ void cautious_kernel(float* p, const float* u, int64_t n, float lr_adj, float lr_wd) {
  DMUON_GRID_LOOP(i, n) {
    const float x = p[i];
    const bool keep_decay = __fmul_rn(u[i], x) >= 0.0f;
    const float decay = keep_decay ? __fmul_rn(lr_wd, x) : 0.0f;
    const float step = __fmul_rn(lr_adj, u[i]);
    p[i] = __fsub_rn(x, __fadd_rn(step, decay));
  }
}

__global__ void adamw_kernel(AdamScalars s, float* p, const void* grad, bool bf16, float* m, float* v, int64_t n) {
  DMUON_GRID_LOOP(i, n) {
    const float g = load_grad(grad, bf16, i);
    const float x = __fmul_rn(p[i], s.keep);
    const float mi = torch_lerp(m[i], g, s.w1);
    const float vs = __fmul_rn(v[i], s.beta2);
    const float gg = __fmul_rn(__fmul_rn(s.one_m_b2, g), g);
    const float vi = __fadd_rn(vs, gg);
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
    const float num = __fmul_rn(s.neg_step, mi);
    p[i] = __fadd_rn(x, __fdiv_rn(num, denom));
    m[i] = mi;
    v[i] = vi;
  }
}

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

__global__ void non_finite_kernel(const void* g, bool bf16, int64_t n, unsigned long long* result) {
  DMUON_GRID_LOOP(i, n) {
    bool bad;
    if (bf16) bad = (static_cast<const uint16_t*>(g)[i] & 0x7F80u) == 0x7F80u;
    else bad = (__float_as_uint(static_cast<const float*>(g)[i]) & 0x7F800000u) == 0x7F800000u;
    if (bad) atomicMin(result, static_cast<unsigned long long>(i));
  }
}

__global__ void pack_kernel(const PackRun* runs, const int64_t* prefix, int nruns, std::byte* const* bases,
                            int64_t total) {
  DMUON_GRID_LOOP(e, total) {
    int lo = 0, hi = nruns - 1;  // the run holding element e: prefix[r] <= e < prefix[r + 1]
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (prefix[mid] <= e) lo = mid;
      else hi = mid - 1;
    }
    const PackRun& r = runs[lo];
    const int64_t local = e - prefix[lo], row = local / r.len, k = local % r.len;
    std::byte* d = bases[r.dst] + r.dst_off + row * r.dst_stride;
    switch (r.conv) {
      case PackConv::Copy32: {
        const std::byte* s = bases[r.src] + r.src_off + row * r.src_stride;
        reinterpret_cast<uint32_t*>(d)[k] = reinterpret_cast<const uint32_t*>(s)[k];
        break;
      }
      case PackConv::F32ToBF16: {
        const std::byte* s = bases[r.src] + r.src_off + row * r.src_stride;
        reinterpret_cast<uint16_t*>(d)[k] = float_to_bf16_bits(reinterpret_cast<const float*>(s)[k]);
        break;
      }
      case PackConv::BF16ToF32: {
        const std::byte* s = bases[r.src] + r.src_off + row * r.src_stride;
        reinterpret_cast<uint32_t*>(d)[k] = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(s)[k]) << 16;
        break;
      }
      case PackConv::FillNegZero32: reinterpret_cast<uint32_t*>(d)[k] = 0x80000000u; break;
      case PackConv::FillNegZeroBF16: reinterpret_cast<uint16_t*>(d)[k] = 0x8000u; break;
    }
  }
}

__global__ void sum_squares_kernel(const float* x, int64_t n, double* out) {
  __shared__ double partial[kThreads];
  double acc = 0;
  DMUON_GRID_LOOP(i, n) {
    const double v = x[i];
    acc = __dadd_rn(acc, __dmul_rn(v, v));
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) partial[threadIdx.x] += partial[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, partial[0]);
}

__global__ void scale_kernel(const float* in, float* out, int64_t n, float inv) {
  DMUON_GRID_LOOP(i, n) out[i] = __fmul_rn(in[i], inv);
}

__global__ void polynomial_kernel(const float* g, const float* g2, float* z, int64_t side, float a, float b, float c) {
  DMUON_GRID_LOOP(i, side * side) {
    float v = __fadd_rn(__fmul_rn(b, g[i]), __fmul_rn(c, g2[i]));
    if (i / side == i % side) v = __fadd_rn(v, a);
    z[i] = v;
  }
}

cudaError_t done() { return cudaGetLastError(); }

}  // namespace

cudaError_t momentum_ema(float* buf, const void* grad, bool bf16, float* update, int64_t n, float w_grad, float mu,
                         bool nesterov, cudaStream_t s) {
  if (n > 0) ema_kernel<<<blocks_for(n), kThreads, 0, s>>>(buf, grad, bf16, update, n, w_grad, mu, nesterov);
  return done();
}
cudaError_t momentum_heavy_ball(float* buf, const void* grad, bool bf16, float* update, int64_t n, float mu,
                                bool nesterov, cudaStream_t s) {
  if (n > 0) heavy_ball_kernel<<<blocks_for(n), kThreads, 0, s>>>(buf, grad, bf16, update, n, mu, nesterov);
  return done();
}
cudaError_t apply_decoupled(float* p, const float* u, int64_t n, float keep, float neg_lr, cudaStream_t s) {
  if (n > 0) decoupled_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, u, n, keep, neg_lr);
  return done();
}
cudaError_t apply_cautious(float* p, const float* u, int64_t n, float lr_adj, float lr_wd, cudaStream_t s) {
  if (n > 0) cautious_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, u, n, lr_adj, lr_wd);
  return done();
}
cudaError_t adamw(const AdamScalars& k, float* p, const void* grad, bool bf16, float* m, float* v, int64_t n,
                  cudaStream_t s) {
  if (n > 0) adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(k, p, grad, bf16, m, v, n);
  return done();
}
cudaError_t scale_rows(float* w, const float* factors, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols > 0) scale_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, s>>>(w, factors, rows, cols);
  return done();
}
cudaError_t round_bf16(float* x, int64_t n, cudaStream_t s) {
  if (n > 0) round_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n);
  return done();
}
cudaError_t first_non_finite(const void* g, bool bf16, int64_t n, unsigned long long* result, cudaStream_t s) {
  if (n > 0) non_finite_kernel<<<blocks_for(n), kThreads, 0, s>>>(g, bf16, n, result);
  return done();
}
cudaError_t pack(const PackRun* runs, const int64_t* prefix, int nruns, std::byte* const* bases, int64_t total,
                 cudaStream_t s) {
  if (total > 0 && nruns > 0) pack_kernel<<<blocks_for(total), kThreads, 0, s>>>(runs, prefix, nruns, bases, total);
  return done();
}
cudaError_t sum_squares(const float* x, int64_t n, double* out, cudaStream_t s) {
  if (n > 0) sum_squares_kernel<<<std::min(blocks_for(n), 1024u), kThreads, 0, s>>>(x, n, out);
  return done();
}
cudaError_t scale(const float* in, float* out, int64_t n, float inv, cudaStream_t s) {
  if (n > 0) scale_kernel<<<blocks_for(n), kThreads, 0, s>>>(in, out, n, inv);
  return done();
}
cudaError_t ns_polynomial(const float* g, const float* g2, float* z, int64_t side, float a, float b, float c,
                          cudaStream_t s) {
  if (side > 0) polynomial_kernel<<<blocks_for(side * side), kThreads, 0, s>>>(g, g2, z, side, a, b, c);
  return done();
}
cudaError_t to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t s) {
  if (n > 0) to_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  return done();
}

}  // namespace dmuon::cuda
