// Internal: AdamW's per-step fp32 scalars (plain data; included by host and device code).
#pragma once

namespace meshmuon::cpu {

struct AdamScalars {
  float keep;      // 1 - lr*wd
  float w1;        // 1 - beta1 (lerp weight)
  float beta2;     // exp_avg_sq.mul_(beta2)
  float one_m_b2;  // addcmul_ value 1 - beta2
  float bc2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float neg_step;  // -lr / (1 - beta1^t)
};

}  // namespace meshmuon::cpu
