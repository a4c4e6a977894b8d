// Internal: the update kernels over local fp32 buffers, the cpu backend's (src/backend/cpu/cpu_backend.cpp
// calls them behind Kernels; the fake device and tests call them too): momentum, decoupled and cautious
// weight decay, NorMuon variance reduction, fused AdamW (REFERENCE.md section 2), with the rules and
// options of include/meshmuon/update.h. Local, single-threaded kernels.
//
// Arithmetic contract (torch's CPU arithmetic, so the PyTorch adapter compares with torch within a
// few ulps: torch runs its vectorized kernel on the body of each thread's slice of a tensor and a
// scalar formula without fma on the tail, and where those slices fall depends on its thread count,
// so bitwise agreement with torch holds on the vectorized body only, and is not promised):
// - Hyperparameter scalars (1 − μ, 1 − lr·wd, −adjusted_lr, bias corrections) are computed in
//   double, as Python does, and rounded once to fp32; elementwise arithmetic is fp32.
// - lerp(a, b, w) is torch's vectorized CPU kernel: fma(w, b − a, a) when |w| < 0.5, else
//   fma(w − 1, b − a, b) — the same values as torch's scalar formula (a + w·(b − a), else
//   b − (b − a)·(1 − w)) up to the single rounding of the fused multiply-add. Likewise
//   `x.add_(y, alpha=s)` is fma(y, s, x). Other products and sums are rounded separately
//   (these files are compiled with -ffp-contract=off).
// - bf16 gradients are widened to fp32 on the fly (exact).
// Every function accepts n = 0. Null pointers with n > 0, negative counts and out-of-range
// hyperparameters throw std::invalid_argument; nothing is modified when a function throws.
#pragma once

#include <cstdint>

#include "meshmuon/dtype.h"
#include "meshmuon/tensor.h"
#include "meshmuon/update.h"

namespace meshmuon {

// ---- momentum --------------------------------------------------------------------------------

// One momentum step over n elements.
//   ema:        buf ← lerp(buf, g, 1 − μ);  update = nesterov ? lerp(g, buf, μ) : buf
//   heavy_ball: buf ← buf·μ + g (product rounded, then sum: torch mul_().add_());
//               update = nesterov ? fma(buf, μ, g) (torch g.add(buf, alpha=μ)) : buf
// `buf` is read and written; `grad` read; `update` written. `update` must not overlap `buf`; it may
// be the same pointer as an fp32 `grad` (each element is read before it is written).
void momentum_step(const MomentumOptions& options, float* buf, const float* grad,
                   float* update, int64_t n);
void momentum_step(const MomentumOptions& options, float* buf, const BFloat16* grad,
                   float* update, int64_t n);
// `grad` is a contiguous fp32 or bf16 view of n = grad.numel() elements.
void momentum_step(const MomentumOptions& options, float* buf, const TensorView& grad,
                   float* update);

// ---- weight decay + update -------------------------------------------------------------------

// Applies the orthogonalized update U to the parameter p (n elements, in place on `param`; `update`
// is only read and must not overlap `param`).
//   decoupled: p ← p·(1 − lr·wd);  p ← fma(U, −adjusted_lr, p)   (torch.optim.Muon)
//   cautious:  mask = (U·p ≥ 0) with the fp32 product and p before this step (so U = 0 or p = 0
//              keeps the decay, and a product that underflows to −0 counts as ≥ 0);
//              p ← p − (adjusted_lr·U + mask·(lr·wd)·p)  (nanochat's expression; nanochat uses the
//              adjusted lr in both terms, meshmuon by default the UNADJUSTED lr for the decay so that
//              cautious and plain decay agree where the mask is 1 and the LR rule never scales the
//              decay; decay_lr = Adjusted gives nanochat's convention, for plain decay too).
void apply_update(const ApplyOptions& options, float* param, const float* update, int64_t n);

// ---- NorMuon ---------------------------------------------------------------------------------

// Pass (a), over the FULL m×n row-major matrix U: v_mean[i] = mean over the reduced dim of U²
// (accumulated in double, rounded to fp32). `v_mean` has normuon_state_size(m, n) elements.
void normuon_mean_square(const float* update, int64_t rows, int64_t cols, float* v_mean);

// Pass (b): given v_mean of the full matrix, updates the state v and rescales U in place:
//   norm = sqrt(Σ v_mean · k)                    (double; needs v_mean of the WHOLE matrix)
//   v ← lerp(v, v_mean, 1 − β2)                  (fp32, torch lerp)
//   step = 1 / sqrt(max(v, 1e-10))               (fp32)
//   norm_new = sqrt(Σ v_mean · k · step²)        (double)
//   U ← U · (step · fp32(norm / max(norm_new, 1e-10)))
// `v` and `v_mean` have normuon_state_size(m, n) elements; `update` is m×n. No overlaps. β2 ≥ 0,
// finite (std::invalid_argument otherwise): β2 = 1 leaves v as it is, β2 > 1 extrapolates (nanochat's
// and Dion's NorMuon check no upper bound).
void normuon_finish(float* update, int64_t rows, int64_t cols, const float* v_mean,
                    float* v, double beta2);

// (a) then (b) with an internal scratch vector.
void normuon_apply(float* update, int64_t rows, int64_t cols, float* v, double beta2);

// ---- AdamW -----------------------------------------------------------------------------------

// Fused AdamW over n elements, one pass, torch.optim.AdamW's order (single-tensor CPU path):
//   p ← p·(1 − lr·wd);  m ← lerp(m, g, 1 − β1);  v ← v·β2;  v ← v + ((1 − β2)·g)·g
//   p ← p + ((−lr / (1 − β1^t))·m) / (sqrt(v) / sqrt(1 − β2^t) + ε)
// i.e. REFERENCE's v ← lerp(v, g², 1 − β2) written as torch computes it (mul_ then addcmul_).
// `param`, `exp_avg`, `exp_avg_sq` are read and written; `grad` read. No overlaps.
void adamw_step(const AdamWOptions& options, float* param, const float* grad,
                float* exp_avg, float* exp_avg_sq, int64_t n);
void adamw_step(const AdamWOptions& options, float* param, const BFloat16* grad,
                float* exp_avg, float* exp_avg_sq, int64_t n);
void adamw_step(const AdamWOptions& options, float* param, const TensorView& grad,
                float* exp_avg, float* exp_avg_sq);

}  // namespace meshmuon
