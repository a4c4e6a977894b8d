// Internal: the tables of the cuda backend's multi-tensor launches (one item per tensor) and how
// the grid's blocks are shared among them. Plain C++ (no CUDA types), so the host side, the
// emulation and the host run of the device code (tests/unit/cuda_kernels_host_test.cpp) all see the
// layout the kernels read.
#pragma once

#include <cstdint>

#include "backend/cpu/kernels/adam_scalars.h"

namespace meshmuon::cuda {

using cpu::AdamScalars;

// The scan over a table of tensors in one launch: flags[t] = min(flags[t], the first non-finite
// index of item t) (flags preset to UINT64_MAX), items' blocks as multi_tensor_blocks.
struct NonFiniteItem {
  const void* g;
  int64_t n;
  int64_t block0;
  int32_t bf16;
  int32_t flag;  // the index into flags
};

// Momentum over one tensor of a multi-tensor launch: EMA (w_grad = 1 − μ) or heavy ball, Nesterov or
// not, then the update rounded to bf16 and back where round_bf16 (the comm dtype's rounding).
struct MomentumItem {
  float* buf;
  const void* grad;
  float* update;
  int64_t n;
  int64_t block0;
  float w_grad, mu;
  int32_t grad_bf16;
  uint8_t heavy_ball, nesterov, round_bf16, pad;
};

// The update applied to one tensor of a multi-tensor launch: decoupled (a = keep, b = −lr) or
// cautious (a = adjusted lr, b = lr·wd), as the cpu apply_update computes them.
struct ApplyItem {
  float* p;
  const float* u;
  int64_t n;
  int64_t block0;
  float a, b;
  int32_t cautious, pad;
};

// The blocks a tensor of n elements gets in a multi-tensor launch (its own grid-stride loop over
// them): item t owns blocks [block0_t, block0_{t+1}), block0 rising by this from 0.
inline int64_t multi_tensor_blocks(int64_t n) {
  const int64_t b = (n + 4 * 256 - 1) / (4 * 256);
  return b < 1 ? 1 : (b > 1024 ? 1024 : b);
}

// One tensor of a multi-tensor AdamW launch (a table in device memory): its scalars, its buffers,
// its size and the first block of the grid that is its own (blocks [block0, next item's block0)).
struct AdamWItem {
  AdamScalars s;
  float* p;
  const void* grad;
  float* m;
  float* v;
  int64_t n;
  int64_t block0;
  int32_t grad_bf16;
  int32_t pad;
};

}  // namespace meshmuon::cuda
