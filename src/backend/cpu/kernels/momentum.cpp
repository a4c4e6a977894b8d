// Momentum kernels (EMA as torch.optim.Muon, heavy ball as Motif / Dion), fp32 or bf16 gradients.
#include <functional>

#include "backend/cpu/kernels/update_steps.h"
#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/update_args.h"

namespace meshmuon {
namespace {

template <class G>
MESHMUON_SIMD_CLONES void ema_loop(float* buf, const G* grad, float* update, int64_t n, float w_grad,
                                float mu, bool nesterov) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = cpu::to_f32(grad[i]);
    const float b = cpu::torch_lerp(buf[i], g, w_grad);  // buf.lerp_(g, 1 - mu)
    buf[i] = b;
    update[i] = nesterov ? cpu::torch_lerp(g, b, mu) : b;  // g.lerp(buf, mu)
  }
}

template <class G>
MESHMUON_SIMD_CLONES void heavy_ball_loop(float* buf, const G* grad, float* update, int64_t n, float mu,
                                       bool nesterov) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = cpu::to_f32(grad[i]);
    const float scaled = buf[i] * mu;  // buf.mul_(mu).add_(g): two roundings
    const float b = scaled + g;
    buf[i] = b;
    update[i] = nesterov ? std::fma(b, mu, g) : b;  // g.add(buf, alpha=mu)
  }
}

template <class G>
void momentum_impl(const MomentumOptions& o, float* buf, const G* grad, float* update, int64_t n) {
  cpu::check_momentum_args(o, buf, grad, update, n);
  if (n == 0) return;
  const float mu = cpu::to_scalar(o.momentum);
  if (o.kind == MomentumKind::Ema) {
    ema_loop(buf, grad, update, n, cpu::to_scalar(1.0 - o.momentum), mu, o.nesterov);
  } else {
    heavy_ball_loop(buf, grad, update, n, mu, o.nesterov);
  }
}

}  // namespace

void momentum_step(const MomentumOptions& o, float* buf, const float* grad, float* update, int64_t n) {
  momentum_impl(o, buf, grad, update, n);
}

void momentum_step(const MomentumOptions& o, float* buf, const BFloat16* grad, float* update,
                   int64_t n) {
  momentum_impl(o, buf, grad, update, n);
}

void momentum_step(const MomentumOptions& o, float* buf, const TensorView& grad, float* update) {
  MESHMUON_CHECK(grad.is_contiguous(), "[momentum] gradient view is not contiguous");
  if (grad.dtype == DType::BF16) {
    momentum_impl(o, buf, static_cast<const BFloat16*>(grad.data), update, grad.numel());
  } else {
    momentum_impl(o, buf, static_cast<const float*>(grad.data), update, grad.numel());
  }
}

}  // namespace meshmuon
