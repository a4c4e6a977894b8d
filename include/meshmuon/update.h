// Update rules: the algorithms and their options (momentum, LR rules, decoupled and cautious weight
// decay, NorMuon, AdamW; REFERENCE.md section 2), the LR adjustment from a matrix's global shape and
// the shape of NorMuon's state. What a C++ user sets in OptimizerOptions / ParamGroup; the kernels that
// apply them are internal (src/backend/cpu/kernels/update_steps.h, behind the backend's Kernels).
// Names parse with std::invalid_argument on an unknown one.
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

// The lr the decay uses: `lr` (Unadjusted) or `adjusted_lr` (Adjusted); the kernels' "lr·wd" is
// decay_lr_value(o)·wd (every backend computes its scalars through this). Decoupled:
// p ← p·(1 − lr·wd) − adjusted_lr·U; cautious: the decay only where U·p ≥ 0 (update_steps.h).
MESHMUON_API double decay_lr_value(const ApplyOptions& options);

// ---- NorMuon ---------------------------------------------------------------------------------

// NorMuon keeps a factored second moment per matrix: per row (length m) when m ≥ n, else per column
// (length n). k is the size of the reduced dim (n per row, m per column).
MESHMUON_API int64_t normuon_state_size(int64_t rows, int64_t cols);

// The NorMuon state's global tensor shape for a parameter of `global_shape`: the matrix shape with
// the reduced dim set to 1 ([A,1] per row or [1,B] per column; [E,A,1] / [E,1,B] for an expert
// stack). The state is stored with the parameter's placements, so this shape gives its local boxes.
MESHMUON_API Shape normuon_state_shape(const Shape& global_shape, bool expert_stack);

// ---- AdamW -----------------------------------------------------------------------------------

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;  // t ≥ 1: the step being taken (bias corrections 1 − β^t)
};

}  // namespace meshmuon
