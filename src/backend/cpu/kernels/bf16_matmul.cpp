// Bf16Matmul's parts common to both builds (bf16_matmul.h): the lower block triangle of a symmetric
// product through gemm(), which dnnl_matmul.cpp (oneDNN) or no_dnnl_matmul.cpp defines.
#include "backend/cpu/kernels/bf16_matmul.h"

namespace meshmuon::cpu {

namespace {

// Rows per block of a lower_product: big enough for oneDNN to run near its peak, small enough that
// the skipped upper blocks matter (s = 768: 6 blocks, 58% of the full product's flops; measured
// fastest of 64..384 on one thread for the GPT-2 shapes).
constexpr int64_t kLowerBlock = 128;

Bf16Operand rows_of(Bf16Operand a, int64_t first) {  // the view starting at row `first`
  a.data += a.trans ? first : first * a.ld;
  return a;
}

}  // namespace

void Bf16Matmul::lower_product(int64_t s, int64_t k, Bf16Operand a, Bf16Operand b, float* c,
                               bool full) {
  if (full || s <= kLowerBlock) return gemm(s, s, k, a, b, c, s);
  const int64_t blocks = (s + kLowerBlock - 1) / kLowerBlock;
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t r0 = s * i / blocks, r1 = s * (i + 1) / blocks;
    // rows [r0, r1) of C, columns [0, r1): A's rows [r0, r1) times B's first r1 columns.
    gemm(r1 - r0, r1, k, rows_of(a, r0), b, c + r0 * s, s);
  }
}

}  // namespace meshmuon::cpu
