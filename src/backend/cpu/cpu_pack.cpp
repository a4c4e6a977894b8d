// Internal: the cpu backend's pack-table kernel (backend/pack.h) and the per-element reference.
#include <cstring>

#include "backend/cpu/shared/cpu_backend.h"
#include "backend/pack.h"
#include "meshmuon/bf16.h"

namespace meshmuon::detail {

void cpu_pack(std::span<const PackRun> runs, std::span<std::byte* const> bases) {
  static constexpr float kNegZero = -0.0f;
  static constexpr uint16_t kNegZeroBf16 = 0x8000;
  for (const PackRun& r : runs) {
    if (r.len == 0 || r.rows == 0) continue;
    const std::byte* src = r.conv == PackConv::FillNegZero32 || r.conv == PackConv::FillNegZeroBF16 ? nullptr : bases[r.src] + r.src_off;
    std::byte* dst = bases[r.dst] + r.dst_off;
    const size_t n = static_cast<size_t>(r.len);
    for (int64_t i = 0; i < r.rows; ++i, dst += r.dst_stride, src = src ? src + r.src_stride : nullptr) {
      switch (r.conv) {
        case PackConv::Copy32: std::memcpy(dst, src, n * 4); break;
        case PackConv::F32ToBF16:
          float_to_bf16(reinterpret_cast<const float*>(src), reinterpret_cast<BFloat16*>(dst), n);
          break;
        case PackConv::BF16ToF32:
          bf16_to_float(reinterpret_cast<const BFloat16*>(src), reinterpret_cast<float*>(dst), n);
          break;
        case PackConv::FillNegZero32:
          for (size_t k = 0; k < n; ++k) std::memcpy(dst + k * 4, &kNegZero, 4);
          break;
        case PackConv::FillNegZeroBF16:
          for (size_t k = 0; k < n; ++k) std::memcpy(dst + k * 2, &kNegZeroBf16, 2);
          break;
      }
    }
  }
}

void pack_reference(std::span<const PackRun> runs, std::span<std::byte* const> bases) {
  for (const PackRun& r : runs)
    for (int64_t i = 0; i < r.rows; ++i)
      for (int64_t k = 0; k < r.len; ++k) {
        std::byte* d = bases[r.dst] + r.dst_off + i * r.dst_stride + k * static_cast<int64_t>(pack_dst_size(r.conv));
        const std::byte* s = r.conv == PackConv::FillNegZero32 || r.conv == PackConv::FillNegZeroBF16
                                 ? nullptr
                                 : bases[r.src] + r.src_off + i * r.src_stride + k * static_cast<int64_t>(pack_src_size(r.conv));
        float f;
        switch (r.conv) {
          case PackConv::Copy32: std::memcpy(d, s, 4); break;
          case PackConv::F32ToBF16: {
            std::memcpy(&f, s, 4);
            const BFloat16 b = float_to_bf16(f);
            std::memcpy(d, &b, 2);
            break;
          }
          case PackConv::BF16ToF32: {
            BFloat16 b;
            std::memcpy(&b, s, 2);
            f = bf16_to_float(b);
            std::memcpy(d, &f, 4);
            break;
          }
          case PackConv::FillNegZero32: f = -0.0f, std::memcpy(d, &f, 4); break;
          case PackConv::FillNegZeroBF16: {
            const uint16_t z = 0x8000;
            std::memcpy(d, &z, 2);
            break;
          }
        }
      }
}

}  // namespace meshmuon::detail
