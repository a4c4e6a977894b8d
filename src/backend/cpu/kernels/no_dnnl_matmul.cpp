// Bf16Matmul without oneDNN (bf16_matmul.h): built instead of dnnl_matmul.cpp when CMake finds no
// oneDNN 3.x headers. bf16_matmul_info() says why; constructing a Bf16Matmul throws it (the widened
// products of bf16_products.h serve bf16 products then).
#include "backend/cpu/kernels/bf16_matmul.h"

#include "meshmuon/error.h"

namespace meshmuon::cpu {

struct Bf16Matmul::Impl {
  void run(int64_t, int64_t, int64_t, Bf16Operand, Bf16Operand, void*, int64_t, bool) {}
};

Bf16MatmulInfo bf16_matmul_info() {
  Bf16MatmulInfo info;
  info.error = "meshmuon was built without the oneDNN 3.x headers (pip install onednn-devel-cpu-iomp==2023.2.0, then rebuild)";
  return info;
}

void require_bf16_matmul(const char* who) {
  detail::throw_error(detail::concat("[orth] ", who, ": oneDNN cannot form bf16 products here: ",
                                     bf16_matmul_info().error));
}

Bf16Matmul::Bf16Matmul() { require_bf16_matmul("bf16 matmul"); }
Bf16Matmul::~Bf16Matmul() = default;
int Bf16Matmul::set_threads(int n) { return n; }

void Bf16Matmul::gemm(int64_t m, int64_t n, int64_t k, Bf16Operand a, Bf16Operand b, float* c,
                      int64_t ldc) {
  impl_->run(m, n, k, a, b, c, ldc, false);
}

void Bf16Matmul::gemm(int64_t m, int64_t n, int64_t k, Bf16Operand a, Bf16Operand b, BFloat16* c,
                      int64_t ldc) {
  impl_->run(m, n, k, a, b, c, ldc, true);
}

}  // namespace meshmuon::cpu
