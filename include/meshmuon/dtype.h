// Element types meshmuon handles: fp32 (master parameters, state, orthogonalization) and bf16
// (gradients and communication).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "meshmuon/export.h"

namespace meshmuon {

// Brain floating point: the upper 16 bits of an IEEE fp32. Stored as raw bits; see bf16.h.
struct BFloat16 {
  uint16_t bits = 0;
  friend bool operator==(BFloat16 a, BFloat16 b) { return a.bits == b.bits; }
};
static_assert(sizeof(BFloat16) == 2);

enum class DType : uint8_t { F32, BF16 };

constexpr size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

// "fp32" / "bf16": the names used in the CLI, JSON, Python and logs.
MESHMUON_API std::string_view to_string(DType t);

// Parses "fp32" | "float32" | "bf16" | "bfloat16"; throws std::invalid_argument naming `what`.
MESHMUON_API DType parse_dtype(std::string_view name, std::string_view what = "dtype");

}  // namespace meshmuon
