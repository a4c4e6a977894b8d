// Which implementation forms the bf16 Newton–Schulz products (NsOptions::matmul_dtype = BF16) on
// this CPU. Both keep one contract: operands rounded to bf16, products accumulated in fp32, bitwise
// the same on every thread count.
// - onednn: oneDNN's matmul on bf16 operands. With AVX512-BF16 or AMX ("native") it runs ~2.4x the
//   fp32 GEMM rate; on AVX-512 CPUs without them oneDNN emulates bf16 ("onednn_emulated", slower
//   than fp32); on AVX2-only CPUs oneDNN (3.2) has no bf16 matmul at all.
// - widened: meshmuon's own. The operands stay bf16 values but are stored as fp32 and multiplied by the
//   fp32 products (products.h): a product of two bf16 values is exact in fp32, so this is the same
//   arithmetic at the fp32 GEMM rate, on every CPU.
// The choice (once per process): MESHMUON_BF16_PRODUCTS=onednn | widened forces one; unset or `auto`
// takes oneDNN where it runs bf16 natively and widened everywhere else (faster than oneDNN's
// emulation, and the only way where oneDNN has none).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace meshmuon::cpu {

enum class Bf16ProductPath { OneDnn, Widened };

struct Bf16Products {
  Bf16ProductPath path = Bf16ProductPath::Widened;
  std::string kind;    // "native", "onednn_emulated" or "widened": what runs
  std::string kernel;  // oneDNN's implementation (e.g. "brg:avx512_core_bf16"), or the fp32 GEMM's
  std::string reason;  // why this path, for `meshmuon info` and the warnings
  bool forced = false; // by MESHMUON_BF16_PRODUCTS (or the test override)
  std::string error;   // non-empty: the forced path cannot run here (the message to raise)
};

// The path for Orthogonalizers made from now on (cached; never throws).
Bf16Products bf16_products();

// Throws (meshmuon::Error, or std::invalid_argument for a bad MESHMUON_BF16_PRODUCTS value) when the
// chosen path cannot run; `who` prefixes the message.
Bf16Products require_bf16_products(const char* who);

// Tests: forces a path for Orthogonalizers made afterwards (nullopt: back to the environment's).
void set_bf16_product_path_for_tests(std::optional<Bf16ProductPath> path);

// Newton–Schulz runs each path has executed in this process: which path really ran, observed
// rather than inferred from bits (two paths may round alike). Counted by ns_bf16_products.cpp.
uint64_t bf16_product_runs(Bf16ProductPath path);
void note_bf16_product_run(Bf16ProductPath path);

}  // namespace meshmuon::cpu
