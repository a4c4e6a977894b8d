// Internal: FSDP's fixed-order gradient reduction on the device (device_code.cuh): the blocks a
// reduce-scatter delivered, summed in rank order, then the mean's division. The includer provides
// MESHMUON_GRID_LOOP, load_grad (elementwise.cuh), __fadd_rn and __fdiv_rn.
#pragma once

// out[i] = b0[i] + b1[i] + … in block order, each sum rounded on its own (Backend::ordered_sum).
__global__ void ordered_sum_kernel(const void* blocks, bool bf16, int64_t n, int blocks_n, float* out) {
  MESHMUON_GRID_LOOP(i, n) {
    float acc = load_grad(blocks, bf16, i);
    for (int j = 1; j < blocks_n; ++j) acc = __fadd_rn(acc, load_grad(blocks, bf16, static_cast<int64_t>(j) * n + i));
    out[i] = acc;
  }
}

__global__ void divide_kernel(float* x, int64_t n, float d) {
  MESHMUON_GRID_LOOP(i, n) x[i] = __fdiv_rn(x[i], d);
}
