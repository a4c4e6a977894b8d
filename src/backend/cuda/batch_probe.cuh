// Internal: the device side of the batched GEMM probe (batched_gemm.h, device_code.cuh): its
// operands and its bitwise comparison. The includer provides MESHMUON_GRID_LOOP and __float_as_uint.
#pragma once

// bf16 values ±[2⁻¹², 2¹³) with 7 random mantissa bits, a hash of i mod period: products exact in
// fp32 over 50 binades, so their sums round, and differently in another order (values of one binade
// would sum exactly and pass any order).
__global__ void probe_fill_kernel(uint16_t* x, int64_t n, int64_t period) {
  MESHMUON_GRID_LOOP(i, n) {
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
  MESHMUON_GRID_LOOP(k, batch * n) {
    if (__float_as_uint(d[k / n * stride + k % n]) != __float_as_uint(ref[k % n])) *flag = 1u;
  }
}
