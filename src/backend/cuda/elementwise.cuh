// Internal: the element-wise device code of the cuda backend (device_code.cuh): bf16 conversion,
// each update kernel's arithmetic on one element (the cpu kernels' operations in their order), the
// multi-tensor kernels, whose blocks find their tensor in a table (multi_tensor.h), and the
// element-wise kernels of one tensor (conversions, QK-clip's row scaling). The includer provides
// MESHMUON_GRID_LOOP and the CUDA intrinsics used here (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn,
// __fsqrt_rn, __fmaf_rn, __uint_as_float, __float_as_uint, fabsf, atomicMin).
#pragma once

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

// torch_lerp of src/backend/cpu/kernels/elementwise.h
__device__ __forceinline__ float torch_lerp(float a, float b, float w) {
  const float diff = __fsub_rn(b, a);
  return fabsf(w) < 0.5f ? __fmaf_rn(w, diff, a) : __fmaf_rn(__fsub_rn(w, 1.0f), diff, b);
}

// Element i of the momentum and apply kernels (the cpu kernels' operations in their order); the
// kernels below run them over one tensor, the multi-tensor kernels over a table of them.
__device__ __forceinline__ float ema_at(float* buf, const void* grad, bool bf16, float* update, int64_t i, float w_grad,
                                        float mu, bool nesterov) {
  const float g = load_grad(grad, bf16, i);
  const float b = torch_lerp(buf[i], g, w_grad);
  buf[i] = b;
  return update[i] = nesterov ? torch_lerp(g, b, mu) : b;
}
__device__ __forceinline__ float heavy_ball_at(float* buf, const void* grad, bool bf16, float* update, int64_t i, float mu,
                                               bool nesterov) {
  const float g = load_grad(grad, bf16, i);
  const float scaled = __fmul_rn(buf[i], mu);
  const float b = __fadd_rn(scaled, g);
  buf[i] = b;
  return update[i] = nesterov ? __fmaf_rn(b, mu, g) : b;
}
__device__ __forceinline__ void decoupled_at(float* p, const float* u, int64_t i, float keep, float neg_lr) {
  const float decayed = __fmul_rn(p[i], keep);
  p[i] = __fmaf_rn(u[i], neg_lr, decayed);
}
__device__ __forceinline__ void cautious_at(float* p, const float* u, int64_t i, float lr_adj, float lr_wd) {
  const float x = p[i];
  const bool keep_decay = __fmul_rn(u[i], x) >= 0.0f;
  const float decay = keep_decay ? __fmul_rn(lr_wd, x) : 0.0f;
  const float step = __fmul_rn(lr_adj, u[i]);
  p[i] = __fsub_rn(x, __fadd_rn(step, decay));
}

// AdamW on element i (the cpu kernel's operations in its order).
__device__ __forceinline__ void adamw_at(const AdamScalars& s, float* p, const void* grad, bool bf16, float* m, float* v,
                                         int64_t i) {
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

__device__ __forceinline__ bool non_finite_at(const void* g, bool bf16, int64_t i) {
  if (bf16) return (static_cast<const uint16_t*>(g)[i] & 0x7F80u) == 0x7F80u;
  return (__float_as_uint(static_cast<const float*>(g)[i]) & 0x7F800000u) == 0x7F800000u;
}

// A multi-tensor kernel's block: the last item whose block0 ≤ blockIdx.x (binary search over the
// table), and how many blocks that item has (its grid-stride loop's stride in blocks).
template <class Item>
__device__ __forceinline__ int item_of(const Item* items, int count, int64_t* blocks) {
  const int64_t b = blockIdx.x;
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (items[mid].block0 <= b) lo = mid;
    else hi = mid - 1;
  }
  *blocks = (lo + 1 < count ? items[lo + 1].block0 : static_cast<int64_t>(gridDim.x)) - items[lo].block0;
  return lo;
}

__global__ void non_finite_multi_kernel(const NonFiniteItem* items, int count, unsigned long long* flags) {
  int64_t blocks = 0;
  const NonFiniteItem it = items[item_of(items, count, &blocks)];
  for (int64_t i = (blockIdx.x - it.block0) * blockDim.x + threadIdx.x; i < it.n; i += blocks * blockDim.x)
    if (non_finite_at(it.g, it.bf16 != 0, i)) {  // a thread's first hit is its least (its indices rise)
      atomicMin(flags + it.flag, static_cast<unsigned long long>(i));
      break;
    }
}

__global__ void momentum_multi_kernel(const MomentumItem* items, int count) {
  int64_t blocks = 0;
  const MomentumItem it = items[item_of(items, count, &blocks)];
  for (int64_t i = (blockIdx.x - it.block0) * blockDim.x + threadIdx.x; i < it.n; i += blocks * blockDim.x) {
    const float u = it.heavy_ball ? heavy_ball_at(it.buf, it.grad, it.grad_bf16 != 0, it.update, i, it.mu, it.nesterov != 0)
                                  : ema_at(it.buf, it.grad, it.grad_bf16 != 0, it.update, i, it.w_grad, it.mu, it.nesterov != 0);
    if (it.round_bf16) it.update[i] = bf16_bits_to_float(float_to_bf16_bits(u));
  }
}

__global__ void apply_multi_kernel(const ApplyItem* items, int count) {
  int64_t blocks = 0;
  const ApplyItem it = items[item_of(items, count, &blocks)];
  for (int64_t i = (blockIdx.x - it.block0) * blockDim.x + threadIdx.x; i < it.n; i += blocks * blockDim.x) {
    if (it.cautious) cautious_at(it.p, it.u, i, it.a, it.b);
    else decoupled_at(it.p, it.u, i, it.a, it.b);
  }
}

// Multi-tensor AdamW: each block on its item's elements (item_of).
__global__ void adamw_multi_kernel(const AdamWItem* items, int count) {
  int64_t blocks = 0;
  const AdamWItem it = items[item_of(items, count, &blocks)];
  for (int64_t i = (blockIdx.x - it.block0) * blockDim.x + threadIdx.x; i < it.n; i += blocks * blockDim.x)
    adamw_at(it.s, it.p, it.grad, it.grad_bf16 != 0, it.m, it.v, i);
}

// x ← fp32(bf16(x)) (the comm dtype's rounding of a whole buffer).
__global__ void round_bf16_kernel(float* x, int64_t n) {
  MESHMUON_GRID_LOOP(i, n) x[i] = bf16_bits_to_float(float_to_bf16_bits(x[i]));
}

__global__ void to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  MESHMUON_GRID_LOOP(i, n) y[i] = float_to_bf16_bits(x[i]);
}

__global__ void from_bf16_kernel(const uint16_t* x, float* y, int64_t n) {
  MESHMUON_GRID_LOOP(i, n) y[i] = bf16_bits_to_float(x[i]);
}

// QK-clip: row r of a rows × cols matrix scaled by factors[r], rows whose factor is exactly 1 left
// untouched (as the cpu scale_rows).
__global__ void scale_rows_kernel(float* w, const float* factors, int64_t rows, int64_t cols) {
  MESHMUON_GRID_LOOP(i, rows * cols) {
    const float f = factors[i / cols];
    if (f != 1.0f) w[i] = __fmul_rn(w[i], f);
  }
}
