// Fused AdamW: one pass over parameter, gradient and both moments, rounding as torch.optim.AdamW's
// single-tensor CPU path does.
#include <functional>

#include "backend/cpu/kernels/update_steps.h"
#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/update_args.h"

namespace meshmuon {
namespace {

using cpu::AdamScalars;

template <class G>
MESHMUON_SIMD_CLONES void adamw_loop(const AdamScalars s, float* p, const G* grad, float* m, float* v,
                                  int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = cpu::to_f32(grad[i]);
    const float x = p[i] * s.keep;
    const float mi = cpu::torch_lerp(m[i], g, s.w1);
    const float vs = v[i] * s.beta2;
    const float gg = (s.one_m_b2 * g) * g;  // addcmul: value * t1 * t2, left to right
    const float vi = vs + gg;
    const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    const float num = s.neg_step * mi;      // addcdiv: value * t1 / t2, left to right
    p[i] = x + num / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

template <class G>
void adamw_impl(const AdamWOptions& o, float* p, const G* g, float* m, float* v, int64_t n) {
  const AdamScalars s = cpu::adamw_args(o, p, g, m, v, n);
  if (n == 0) return;
  adamw_loop(s, p, g, m, v, n);
}

}  // namespace

void adamw_step(const AdamWOptions& o, float* p, const float* g, float* m, float* v, int64_t n) {
  adamw_impl(o, p, g, m, v, n);
}

void adamw_step(const AdamWOptions& o, float* p, const BFloat16* g, float* m, float* v, int64_t n) {
  adamw_impl(o, p, g, m, v, n);
}

void adamw_step(const AdamWOptions& o, float* p, const TensorView& grad, float* m, float* v) {
  MESHMUON_CHECK(grad.is_contiguous(), "[adamw] gradient view is not contiguous");
  if (grad.dtype == DType::BF16) {
    adamw_impl(o, p, static_cast<const BFloat16*>(grad.data), m, v, grad.numel());
  } else {
    adamw_impl(o, p, static_cast<const float*>(grad.data), m, v, grad.numel());
  }
}

}  // namespace meshmuon
