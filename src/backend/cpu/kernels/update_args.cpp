// Internal: the update kernels' shared argument checks and scalars (update_args.h).
#include "backend/cpu/kernels/update_args.h"

#include <cmath>
#include <functional>

#include "backend/cpu/kernels/elementwise.h"

namespace meshmuon::cpu {
namespace {

bool disjoint(const float* a, const float* b, int64_t n) {
  const std::less<const float*> before;
  return !before(a, b + n) || !before(b, a + n);
}

}  // namespace

void check_momentum_args(const MomentumOptions& o, const float* buf, const void* grad, const float* update, int64_t n) {
  check_nonnegative_rate(o.momentum, "momentum", "momentum");
  check_buffer(buf, n, "momentum", "buf");
  check_buffer(grad, n, "momentum", "grad");
  check_buffer(update, n, "momentum", "update");
  MESHMUON_CHECK(n == 0 || disjoint(update, buf, n), "[momentum] update overlaps the momentum buffer; give a separate output");
}

void check_apply_args(const ApplyOptions& o, const float* param, const float* update, int64_t n) {
  MESHMUON_CHECK(std::isfinite(o.lr) && o.lr >= 0, "[update] lr ", o.lr, " must be finite and >= 0");
  MESHMUON_CHECK(std::isfinite(o.adjusted_lr) && o.adjusted_lr >= 0, "[update] adjusted_lr ", o.adjusted_lr,
              " must be finite and >= 0");
  MESHMUON_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "[update] weight_decay ", o.weight_decay,
              " must be finite and >= 0");
  MESHMUON_CHECK(o.decay_lr == DecayLr::Unadjusted || o.decay_lr == DecayLr::Adjusted, "[update] invalid decay_lr ",
              static_cast<int>(o.decay_lr), "; use unadjusted or adjusted");
  check_buffer(param, n, "update", "param");
  check_buffer(update, n, "update", "update");
  MESHMUON_CHECK(n == 0 || disjoint(update, param, n), "[update] update overlaps the parameter; give a separate buffer");
}

AdamScalars adamw_args(const AdamWOptions& o, const float* p, const void* grad, const float* m, const float* v, int64_t n) {
  MESHMUON_CHECK(std::isfinite(o.lr) && o.lr >= 0, "[adamw] lr ", o.lr, " must be finite and >= 0");
  MESHMUON_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "[adamw] weight_decay ", o.weight_decay,
              " must be finite and >= 0");
  check_unit_interval(o.beta1, "adamw", "beta1");
  check_unit_interval(o.beta2, "adamw", "beta2");
  MESHMUON_CHECK(std::isfinite(o.eps) && o.eps > 0, "[adamw] eps ", o.eps, " must be finite and > 0");
  MESHMUON_CHECK(o.step >= 1, "[adamw] step ", o.step, " must be >= 1 (the step being taken)");
  check_buffer(p, n, "adamw", "param");
  check_buffer(grad, n, "adamw", "grad");
  check_buffer(m, n, "adamw", "exp_avg");
  check_buffer(v, n, "adamw", "exp_avg_sq");
  MESHMUON_CHECK(n == 0 || (disjoint(p, m, n) && disjoint(p, v, n) && disjoint(m, v, n)),
              "[adamw] param, exp_avg and exp_avg_sq must not overlap");
  const double t = static_cast<double>(o.step);
  const double bc1 = 1.0 - std::pow(o.beta1, t);
  const double bc2 = 1.0 - std::pow(o.beta2, t);
  return {to_scalar(1.0 - o.lr * o.weight_decay), to_scalar(1.0 - o.beta1), to_scalar(o.beta2), to_scalar(1.0 - o.beta2),
          to_scalar(std::sqrt(bc2)),             to_scalar(o.eps),          to_scalar(-(o.lr / bc1))};
}

}  // namespace meshmuon::cpu
