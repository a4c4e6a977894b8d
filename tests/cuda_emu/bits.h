// Test infrastructure: the bit conversions the emulated GPU's kernels, cuBLAS and NCCL share
// (tests/cuda_emu, README.md there): fp32 <-> bits, and bf16 as the device code rounds it (to
// nearest even, NaN -> 0x7FC0; bf16 -> fp32 exact).
#pragma once

#include <cstdint>
#include <cstring>

namespace meshmuon::cuda_emu {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bf16_to_float(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((u + ((u >> 16) & 1u) + 0x7FFFu) >> 16);
}

}  // namespace meshmuon::cuda_emu
