// Internal: pack tables, the executor's precomputed data movement between its buffers. A table is a
// list of runs; each run copies `rows` rows of `len` elements from one buffer to another with a
// conversion (fp32 copy, fp32 -> bf16 wire format, bf16 -> fp32, or a fill of −0). Buffers are named
// by index into the base pointers given at pack time (the executor's transient arena, the state
// tensors of a chunk), so a table built once at construction serves every step. Backend::pack runs a
// table (cpu: memcpy and the bf16 conversion loops; a device backend: one kernel launch per table).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace meshmuon::detail {

enum class PackConv : uint8_t {
  Copy32,          // fp32 -> fp32 (4 bytes each side)
  F32ToBF16,       // fp32 -> bf16, round to nearest even (the wire format; bf16.h)
  BF16ToF32,       // bf16 -> fp32 (exact)
  FillNegZero32,   // dst = −0.0f (src unused): a contribution that adds nothing to a sum, signs kept
  FillNegZeroBF16, // dst = bf16 −0
};

// Bytes per element read / written by a conversion.
constexpr size_t pack_src_size(PackConv c) { return c == PackConv::BF16ToF32 ? 2 : c == PackConv::Copy32 || c == PackConv::F32ToBF16 ? 4 : 0; }
constexpr size_t pack_dst_size(PackConv c) { return c == PackConv::F32ToBF16 || c == PackConv::FillNegZeroBF16 ? 2 : 4; }

struct PackRun {
  uint32_t src = 0, dst = 0;  // buffer indices into the bases passed to Backend::pack
  PackConv conv = PackConv::Copy32;
  int64_t src_off = 0, dst_off = 0;        // bytes from the base to the first row
  int64_t len = 0, rows = 1;               // elements per row, rows
  int64_t src_stride = 0, dst_stride = 0;  // bytes from one row to the next
};

// Reference semantics, element by element (tests compare Backend::pack with it).
void pack_reference(std::span<const PackRun> runs, std::span<std::byte* const> bases);

}  // namespace meshmuon::detail
