// Fused AdamW: one pass over parameter, gradient and both moments, rounding as torch.optim.AdamW's
// single-tensor CPU path does.
#include <functional>

#include "dmuon/update.h"
#include "kernels/cpu/elementwise.h"

namespace dmuon {
namespace {

struct AdamScalars {
  float keep;        // 1 - lr*wd
  float w1;          // 1 - beta1 (lerp weight)
  float beta2;       // exp_avg_sq.mul_(beta2)
  float one_m_b2;    // addcmul_ value 1 - beta2
  float bc2_sqrt;    // sqrt(1 - beta2^t)
  float eps;
  float neg_step;    // -lr / (1 - beta1^t)
};

template <class G>
DMUON_SIMD_CLONES void adamw_loop(const AdamScalars s, float* p, const G* grad, float* m, float* v,
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
  DMUON_CHECK(std::isfinite(o.lr) && o.lr >= 0, "[adamw] lr ", o.lr, " must be finite and >= 0");
  DMUON_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "[adamw] weight_decay ",
              o.weight_decay, " must be finite and >= 0");
  cpu::check_unit_interval(o.beta1, "adamw", "beta1");
  cpu::check_unit_interval(o.beta2, "adamw", "beta2");
  DMUON_CHECK(std::isfinite(o.eps) && o.eps > 0, "[adamw] eps ", o.eps, " must be finite and > 0");
  DMUON_CHECK(o.step >= 1, "[adamw] step ", o.step, " must be >= 1 (the step being taken)");
  cpu::check_buffer(p, n, "adamw", "param");
  cpu::check_buffer(g, n, "adamw", "grad");
  cpu::check_buffer(m, n, "adamw", "exp_avg");
  cpu::check_buffer(v, n, "adamw", "exp_avg_sq");
  if (n == 0) return;
  const std::less<const float*> before;
  auto disjoint = [&](const float* a, const float* b) { return !before(a, b + n) || !before(b, a + n); };
  DMUON_CHECK(disjoint(p, m) && disjoint(p, v) && disjoint(m, v),
              "[adamw] param, exp_avg and exp_avg_sq must not overlap");
  // Bias corrections in double, as Python computes them from the step count.
  const double t = static_cast<double>(o.step);
  const double bc1 = 1.0 - std::pow(o.beta1, t);
  const double bc2 = 1.0 - std::pow(o.beta2, t);
  const AdamScalars s{cpu::to_scalar(1.0 - o.lr * o.weight_decay), cpu::to_scalar(1.0 - o.beta1),
                      cpu::to_scalar(o.beta2), cpu::to_scalar(1.0 - o.beta2),
                      cpu::to_scalar(std::sqrt(bc2)), cpu::to_scalar(o.eps),
                      cpu::to_scalar(-(o.lr / bc1))};
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
  DMUON_CHECK(grad.is_contiguous(), "[adamw] gradient view is not contiguous");
  if (grad.dtype == DType::BF16) {
    adamw_impl(o, p, static_cast<const BFloat16*>(grad.data), m, v, grad.numel());
  } else {
    adamw_impl(o, p, static_cast<const float*>(grad.data), m, v, grad.numel());
  }
}

}  // namespace dmuon
