// Update rules over local fp32 buffers: momentum, LR rules, decoupled and cautious weight decay,
// NorMuon variance reduction, fused AdamW (REFERENCE.md section 2). Local, single-threaded kernels;
// the single-process optimizer and the distributed executor both call exactly these.
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
#include <string_view>

#include "meshmuon/dtype.h"
#include "meshmuon/export.h"
#include "meshmuon/tensor.h"

namespace meshmuon {

// "muon" (orthogonalized momentum, matrices and expert stacks only) or "adamw" (any shape).
enum class Algorithm { Muon, AdamW };
MESHMUON_API std::string_view to_string(Algorithm a);
MESHMUON_API Algorithm parse_algorithm(std::string_view name);  // throws std::invalid_argument

// "ema": buf ← lerp(buf, g, 1 − μ) (torch.optim.Muon, nanochat);
// "heavy_ball": buf ← μ·buf + g (Motif, Dion).
enum class MomentumKind { Ema, HeavyBall };
MESHMUON_API std::string_view to_string(MomentumKind k);
MESHMUON_API MomentumKind parse_momentum_kind(std::string_view name);  // throws std::invalid_argument

// LR adjustment from the GLOBAL matrix shape A×B (rows × cols; one expert's matrix for a stack):
// "original" lr·sqrt(max(1, A/B)); "match_rms_adamw" lr·0.2·sqrt(max(A, B)); "none" lr.
enum class LrRule { Original, MatchRmsAdamw, None };
MESHMUON_API std::string_view to_string(LrRule r);
MESHMUON_API LrRule parse_lr_rule(std::string_view name);  // throws std::invalid_argument

// Which lr the weight decay uses: "unadjusted" (meshmuon's default: the group's lr, so the LR rule
// never scales the decay and cautious and plain decay agree where the mask is 1) or "adjusted" (the
// lr after the LR rule, as nanochat's muon_step_fused does: p ← p − lr_adj·U − lr_adj·wd·p·mask).
enum class DecayLr { Unadjusted, Adjusted };
MESHMUON_API std::string_view to_string(DecayLr d);
MESHMUON_API DecayLr parse_decay_lr(std::string_view name);  // throws std::invalid_argument

// ---- momentum --------------------------------------------------------------------------------

struct MomentumOptions {
  MomentumKind kind = MomentumKind::Ema;
  double momentum = 0.95;  // μ ≥ 0, finite (μ = 1: EMA keeps buf; heavy ball sums g)
  bool nesterov = true;
};

// One momentum step over n elements.
//   ema:        buf ← lerp(buf, g, 1 − μ);  update = nesterov ? lerp(g, buf, μ) : buf
//   heavy_ball: buf ← buf·μ + g (product rounded, then sum: torch mul_().add_());
//               update = nesterov ? fma(buf, μ, g) (torch g.add(buf, alpha=μ)) : buf
// `buf` is read and written; `grad` read; `update` written. `update` must not overlap `buf`; it may
// be the same pointer as an fp32 `grad` (each element is read before it is written).
MESHMUON_API void momentum_step(const MomentumOptions& options, float* buf, const float* grad,
                             float* update, int64_t n);
MESHMUON_API void momentum_step(const MomentumOptions& options, float* buf, const BFloat16* grad,
                             float* update, int64_t n);
// `grad` is a contiguous fp32 or bf16 view of n = grad.numel() elements.
MESHMUON_API void momentum_step(const MomentumOptions& options, float* buf, const TensorView& grad,
                             float* update);

// ---- LR rules --------------------------------------------------------------------------------

// lr adjusted for a GLOBAL matrix of `rows` × `cols` (see LrRule). Computed in double.
MESHMUON_API double adjusted_lr(double lr, LrRule rule, int64_t rows, int64_t cols);
// The matrix dims an LR rule reads: [A, B] → (A, B); an expert stack [E, A, B] → (A, B).
// Throws std::invalid_argument for any other rank (or 3-D without expert_stack).
struct MatrixDims {
  int64_t rows = 0, cols = 0, batch = 1;  // batch = E for an expert stack
};
MESHMUON_API MatrixDims matrix_dims(const Shape& global_shape, bool expert_stack);

// ---- weight decay + update -------------------------------------------------------------------

struct ApplyOptions {
  double lr = 0;           // UNADJUSTED lr: used for the decay unless decay_lr is Adjusted
  double adjusted_lr = 0;  // lr after the LR rule: used for the update U
  double weight_decay = 0;
  bool cautious = false;
  DecayLr decay_lr = DecayLr::Unadjusted;  // which of the two lrs the decay uses
};

// The lr the decay uses: `lr` (Unadjusted) or `adjusted_lr` (Adjusted). Below, "lr·wd" is
// decay_lr_value(o)·wd (every backend computes its scalars through this).
MESHMUON_API double decay_lr_value(const ApplyOptions& options);

// Applies the orthogonalized update U to the parameter p (n elements, in place on `param`; `update`
// is only read and must not overlap `param`).
//   decoupled: p ← p·(1 − lr·wd);  p ← fma(U, −adjusted_lr, p)   (torch.optim.Muon)
//   cautious:  mask = (U·p ≥ 0) with the fp32 product and p before this step (so U = 0 or p = 0
//              keeps the decay, and a product that underflows to −0 counts as ≥ 0);
//              p ← p − (adjusted_lr·U + mask·(lr·wd)·p)  (nanochat's expression; nanochat uses the
//              adjusted lr in both terms, meshmuon by default the UNADJUSTED lr for the decay so that
//              cautious and plain decay agree where the mask is 1 and the LR rule never scales the
//              decay; decay_lr = Adjusted gives nanochat's convention, for plain decay too).
MESHMUON_API void apply_update(const ApplyOptions& options, float* param, const float* update, int64_t n);

// ---- NorMuon ---------------------------------------------------------------------------------

// NorMuon keeps a factored second moment per matrix: per row (length m) when m ≥ n, else per column
// (length n). k is the size of the reduced dim (n per row, m per column).
MESHMUON_API int64_t normuon_state_size(int64_t rows, int64_t cols);

// The NorMuon state's global tensor shape for a parameter of `global_shape`: the matrix shape with
// the reduced dim set to 1 ([A,1] per row or [1,B] per column; [E,A,1] / [E,1,B] for an expert
// stack). The state is stored with the parameter's placements, so this shape gives its local boxes.
MESHMUON_API Shape normuon_state_shape(const Shape& global_shape, bool expert_stack);

// Pass (a), over the FULL m×n row-major matrix U: v_mean[i] = mean over the reduced dim of U²
// (accumulated in double, rounded to fp32). `v_mean` has normuon_state_size(m, n) elements.
MESHMUON_API void normuon_mean_square(const float* update, int64_t rows, int64_t cols, float* v_mean);

// Pass (b): given v_mean of the full matrix, updates the state v and rescales U in place:
//   norm = sqrt(Σ v_mean · k)                    (double; needs v_mean of the WHOLE matrix)
//   v ← lerp(v, v_mean, 1 − β2)                  (fp32, torch lerp)
//   step = 1 / sqrt(max(v, 1e-10))               (fp32)
//   norm_new = sqrt(Σ v_mean · k · step²)        (double)
//   U ← U · (step · fp32(norm / max(norm_new, 1e-10)))
// `v` and `v_mean` have normuon_state_size(m, n) elements; `update` is m×n. No overlaps. β2 ≥ 0,
// finite (std::invalid_argument otherwise): β2 = 1 leaves v as it is, β2 > 1 extrapolates (nanochat's
// and Dion's NorMuon check no upper bound).
MESHMUON_API void normuon_finish(float* update, int64_t rows, int64_t cols, const float* v_mean,
                              float* v, double beta2);

// (a) then (b) with an internal scratch vector.
MESHMUON_API void normuon_apply(float* update, int64_t rows, int64_t cols, float* v, double beta2);

// ---- AdamW -----------------------------------------------------------------------------------

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;  // t ≥ 1: the step being taken (bias corrections 1 − β^t)
};

// Fused AdamW over n elements, one pass, torch.optim.AdamW's order (single-tensor CPU path):
//   p ← p·(1 − lr·wd);  m ← lerp(m, g, 1 − β1);  v ← v·β2;  v ← v + ((1 − β2)·g)·g
//   p ← p + ((−lr / (1 − β1^t))·m) / (sqrt(v) / sqrt(1 − β2^t) + ε)
// i.e. REFERENCE's v ← lerp(v, g², 1 − β2) written as torch computes it (mul_ then addcmul_).
// `param`, `exp_avg`, `exp_avg_sq` are read and written; `grad` read. No overlaps.
MESHMUON_API void adamw_step(const AdamWOptions& options, float* param, const float* grad,
                          float* exp_avg, float* exp_avg_sq, int64_t n);
MESHMUON_API void adamw_step(const AdamWOptions& options, float* param, const BFloat16* grad,
                          float* exp_avg, float* exp_avg_sq, int64_t n);
MESHMUON_API void adamw_step(const AdamWOptions& options, float* param, const TensorView& grad,
                          float* exp_avg, float* exp_avg_sq);

}  // namespace meshmuon
