// Array bf16 <-> fp32 conversion; the scalar forms in bf16.h define the numerics, these loops let
// the compiler vectorize them.
#include "meshmuon/bf16.h"

namespace meshmuon {

void bf16_to_float(const BFloat16* __restrict src, float* __restrict dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

void float_to_bf16(const float* __restrict src, BFloat16* __restrict dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

}  // namespace meshmuon
