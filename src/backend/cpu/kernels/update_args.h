// Internal: the update kernels' argument checks and the fp32 scalars they derive from the options,
// shared by every backend (cpu loops in this folder, the cuda kernels), so a device kernel validates
// and rounds its hyperparameters exactly as the cpu one does.
#pragma once

#include <cstdint>

#include "meshmuon/update.h"
#include "backend/cpu/kernels/adam_scalars.h"

namespace meshmuon::cpu {

// Throws std::invalid_argument "[momentum] ...": momentum negative or non-finite, negative count, a null
// buffer with elements, update overlapping buf.
void check_momentum_args(const MomentumOptions& o, const float* buf, const void* grad, const float* update, int64_t n);
// "[update] ...": lr, adjusted_lr, weight_decay finite and >= 0; buffers; update overlapping param.
void check_apply_args(const ApplyOptions& o, const float* param, const float* update, int64_t n);
// "[adamw] ...": every option's range and the buffers; then the per-step scalars (bias corrections
// in double from the step count, as Python computes them, each rounded once to fp32).
AdamScalars adamw_args(const AdamWOptions& o, const float* p, const void* grad, const float* m, const float* v, int64_t n);

}  // namespace meshmuon::cpu
