// oneDNN's bf16 matrix products, one of the two paths of the CPU's bf16 Newton–Schulz products
// (bf16_products.h): inputs bf16, accumulation fp32 (AVX512-BF16 / AMX kernels where the CPU has
// them, emulation on other AVX-512 CPUs, none on AVX2-only ones). oneDNN 3.x (libdnnl.so.3: PyPI's
// onednn-cpu-iomp, on Intel's OpenMP runtime) is loaded at run time, like the BLAS, so libmeshmuon
// does not depend on it.
//
// Determinism: oneDNN's matmul does not split the reduction dimension across threads, so a product
// is bitwise the same for any thread count (tested); every product of a given shape runs the same
// kernel in every process of one machine type.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "meshmuon/dtype.h"

namespace meshmuon::cpu {

// What oneDNN offers for bf16 products here: library and version, and the kernel it picks for a
// probe product (256×256×256, bf16 in, fp32 out).
struct Bf16MatmulInfo {
  bool available = false;  // oneDNN loaded AND it has a bf16 matmul for this CPU
  bool native = false;     // that kernel uses bf16 instructions (AVX512-BF16 / AMX), not emulation
  std::string library;     // soname loaded
  std::string version;     // "3.2.0"
  std::string kernel;      // implementation of the probe product, e.g. "brg:avx512_core_bf16"
  std::string error;       // why it is unavailable
};
// Loads oneDNN and probes it on first use (cached; never throws).
Bf16MatmulInfo bf16_matmul_info();
// Throws meshmuon::Error naming what is missing when oneDNN cannot form bf16 products.
void require_bf16_matmul(const char* who);

// Row-major views: element (i, j) of a matrix view is data[i * ld + j]; with `trans`, the view is
// the transpose of the stored matrix (element (i, j) at data[j * ld + i]).
struct Bf16Operand {
  const BFloat16* data;
  int64_t ld;
  bool trans = false;
};

// Products of one thread (not thread-safe; one per Orthogonalizer). Primitives are cached per shape.
class Bf16Matmul {
 public:
  Bf16Matmul();
  ~Bf16Matmul();
  Bf16Matmul(const Bf16Matmul&) = delete;
  Bf16Matmul& operator=(const Bf16Matmul&) = delete;

  // C (m×n, row stride ldc) = A (m×k) · B (k×n); C is fp32 or bf16 (rounded to nearest even once,
  // from the fp32 accumulator).
  void gemm(int64_t m, int64_t n, int64_t k, Bf16Operand a, Bf16Operand b, float* c, int64_t ldc);
  void gemm(int64_t m, int64_t n, int64_t k, Bf16Operand a, Bf16Operand b, BFloat16* c, int64_t ldc);

  // Lower block triangle of C (s×s fp32, row stride s) = A (s×k) · B (k×s), for products known to
  // be symmetric (X·Xᵀ, or two commuting symmetric matrices): rows are taken in blocks and each block
  // multiplies only the columns up to its diagonal, so about (1 + 1/blocks)/2 of the full product's
  // flops. Entries above the diagonal inside the diagonal blocks are written too; callers mirror the
  // lower triangle. `full` computes the whole product in one call (the "plain" method).
  void lower_product(int64_t s, int64_t k, Bf16Operand a, Bf16Operand b, float* c, bool full);

  // Number of OpenMP threads the products use (oneDNN's OpenMP runtime, set on the calling thread).
  // Returns the previous value, to be restored with set_threads when done: the runtime may be the
  // same libgomp the caller's other libraries use (PyTorch's CPU wheel does), and meshmuon must not
  // change their thread count.
  int set_threads(int n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshmuon::cpu
