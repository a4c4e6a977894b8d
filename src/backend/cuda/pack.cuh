// Internal: the pack kernel of the cuda backend (device_code.cuh, after elementwise.cuh for the bf16
// conversion): each element of a pack table (pack.h) finds its run by binary search over the runs'
// element prefix sums and moves 32 or 16 bits at the alignment its addresses have.
// tests/unit/cuda_kernels_host_test.cpp runs it on the host against pack_reference, misaligned
// items included. The includer provides MESHMUON_GRID_LOOP, PackRun / PackConv and __uint_as_float.
#pragma once

// A pack run's items sit back to back in a message (routes.cpp): an fp32 item after a bf16 item of
// odd length starts 2 bytes off a 4-byte boundary, where a 32-bit access would fault
// (cudaErrorMisalignedAddress). These move 32 / 16 bits at the alignment the address has.
__device__ __forceinline__ uint32_t load_u32(const std::byte* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if ((a & 3) == 0) return *reinterpret_cast<const uint32_t*>(p);
  if ((a & 1) == 0) {
    const auto* h = reinterpret_cast<const uint16_t*>(p);
    return static_cast<uint32_t>(h[0]) | static_cast<uint32_t>(h[1]) << 16;  // little-endian
  }
  const auto* b = reinterpret_cast<const uint8_t*>(p);
  return static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 | static_cast<uint32_t>(b[2]) << 16 |
         static_cast<uint32_t>(b[3]) << 24;
}
__device__ __forceinline__ void store_u32(std::byte* p, uint32_t v) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if ((a & 3) == 0) {
    *reinterpret_cast<uint32_t*>(p) = v;
  } else if ((a & 1) == 0) {
    auto* h = reinterpret_cast<uint16_t*>(p);
    h[0] = static_cast<uint16_t>(v), h[1] = static_cast<uint16_t>(v >> 16);
  } else {
    auto* b = reinterpret_cast<uint8_t*>(p);
    for (int i = 0; i < 4; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}
__device__ __forceinline__ uint16_t load_u16(const std::byte* p) {
  const auto* b = reinterpret_cast<const uint8_t*>(p);
  return (reinterpret_cast<uintptr_t>(p) & 1) == 0 ? *reinterpret_cast<const uint16_t*>(p)
                                                   : static_cast<uint16_t>(b[0] | b[1] << 8);
}
__device__ __forceinline__ void store_u16(std::byte* p, uint16_t v) {
  if ((reinterpret_cast<uintptr_t>(p) & 1) == 0) {
    *reinterpret_cast<uint16_t*>(p) = v;
  } else {
    auto* b = reinterpret_cast<uint8_t*>(p);
    b[0] = static_cast<uint8_t>(v), b[1] = static_cast<uint8_t>(v >> 8);
  }
}

__global__ void pack_kernel(const PackRun* runs, const int64_t* prefix, int nruns, std::byte* const* bases,
                            int64_t total) {
  MESHMUON_GRID_LOOP(e, total) {
    int lo = 0, hi = nruns - 1;  // the run holding element e: prefix[r] <= e < prefix[r + 1]
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (prefix[mid] <= e) lo = mid;
      else hi = mid - 1;
    }
    const PackRun& r = runs[lo];
    const int64_t local = e - prefix[lo], row = local / r.len, k = local % r.len;
    std::byte* d = bases[r.dst] + r.dst_off + row * r.dst_stride;
    const std::byte* s = bases[r.src] + r.src_off + row * r.src_stride;
    switch (r.conv) {
      case PackConv::Copy32: store_u32(d + 4 * k, load_u32(s + 4 * k)); break;
      case PackConv::F32ToBF16: store_u16(d + 2 * k, float_to_bf16_bits(__uint_as_float(load_u32(s + 4 * k)))); break;
      case PackConv::BF16ToF32: store_u32(d + 4 * k, static_cast<uint32_t>(load_u16(s + 2 * k)) << 16); break;
      case PackConv::FillNegZero32: store_u32(d + 4 * k, 0x80000000u); break;
      case PackConv::FillNegZeroBF16: store_u16(d + 2 * k, 0x8000u); break;
    }
  }
}
