// bf16 <-> fp32 conversion, bit-identical to PyTorch's c10::BFloat16.
//
// fp32 -> bf16 rounds to nearest, ties to even; every NaN becomes the quiet NaN 0x7FC0 (as PyTorch);
// infinities and signed zeros are kept; values that round past the largest finite bf16 become
// infinity. bf16 -> fp32 is exact (append 16 zero bits).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "meshmuon/dtype.h"
#include "meshmuon/export.h"

namespace meshmuon {

inline float bf16_to_float(BFloat16 x) {
  return std::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16);
}

inline BFloat16 float_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return BFloat16{0x7FC0};  // NaN
  const uint32_t rounding_bias = ((u >> 16) & 1u) + 0x7FFFu;     // ties to even
  return BFloat16{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

// Array forms (vectorized loops). Source and destination must not overlap.
MESHMUON_API void bf16_to_float(const BFloat16* src, float* dst, size_t n);
MESHMUON_API void float_to_bf16(const float* src, BFloat16* dst, size_t n);

}  // namespace meshmuon
