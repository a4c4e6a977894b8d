// Orthogonalization: replace a matrix by (an approximation of) its polar factor U·Vᵀ with a few
// Newton–Schulz steps, as Muon does (REFERENCE.md section 1).
//
// Numerics: X = G / (‖G‖_F · scale + eps) (or / max(‖G‖_F · scale, eps) with EpsMode::Clamp, as
// torch.optim.Muon does), ‖G‖_F summed in double; an all-zero matrix gives exact zeros (also with
// eps = 0), never NaN. With m ≤ n each step computes A = X·Xᵀ, X ← (a·I + b·A + c·A·A)·X; tall
// matrices (m > n) use the right form on XᵀX through BLAS transpose flags, without copies. By default
// all matrix arithmetic is fp32 (BLAS); NsOptions::matmul_dtype = BF16 forms the products from bf16
// operands (bf16_products_info()). Non-finite inputs give non-finite outputs (not checked here).
// Determinism: for the same input and options the result is bitwise reproducible on every thread
// count (the products are split into tiles whose shapes depend only on the sizes: products.h);
// a batch gives bitwise the results of its matrices run one by one; in place equals out of place.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/dtype.h"
#include "meshmuon/export.h"
#include "meshmuon/tensor.h"

namespace meshmuon {

// Coefficient schedules (names as used in CLI, JSON, Python): "jordan", "you", "polar_express",
// "custom", and NVIDIA-NeMo/Emerging-Optimizers' fixed tables (their names and iteration rules):
// "cans" (CANS, arXiv 2506.10935: 5 triples, the last repeated past them), "aol" (4 triples of
// Turbo-Muon's, arXiv 2512.04632, cycled), "deepseekv4" (DeepSeek-V4: 8 x Jordan's then
// 2 x (2, -1.5, 0.5), the last repeated), "cubic5" (arXiv 2606.00371: 5 cubic steps, c = 0;
// exactly 5 steps). A shorter run takes a prefix of a table.
enum class Schedule { Jordan, You, PolarExpress, Custom, Cans, Aol, DeepSeekV4, Cubic5 };
MESHMUON_API std::string_view to_string(Schedule s);
MESHMUON_API Schedule parse_schedule(std::string_view name);  // throws std::invalid_argument

// How the products are formed: "plain" (three GEMMs per step), "symmetric" (SYRK for X·Xᵀ and for
// A·A), "gram" (Gram Newton–Schulz: iterate on the small Gram matrix, restart after step 2; fp32 only,
// used only when the aspect ratio max(m,n)/min(m,n) ≥ 2, otherwise falls back to symmetric).
enum class NsMethod { Plain, Symmetric, Gram };
// Gram Newton–Schulz re-forms X = Q·X₀ and R = X·Xᵀ after this step (0-based: after the second
// step), which bounds the fp32 error that accumulates in the Gram products.
inline constexpr int kGramRestartStep = 1;
MESHMUON_API std::string_view to_string(NsMethod m);
MESHMUON_API NsMethod parse_ns_method(std::string_view name);  // throws std::invalid_argument

// Normalization: Add divides by (‖G‖·scale + eps); Clamp divides by max(‖G‖·scale, eps).
enum class EpsMode { Add, Clamp };

// One step's odd quintic p(σ) = a·σ + b·σ³ + c·σ⁵.
struct Coefficients {
  double a = 0, b = 0, c = 0;
  friend bool operator==(const Coefficients&, const Coefficients&) = default;
};

struct NsOptions {
  Schedule schedule = Schedule::Jordan;
  int steps = 5;                        // ≥ 1 (the "you" schedule has exactly 5)
  NsMethod method = NsMethod::Symmetric;
  float scale = 1.0f;                   // s in ‖G‖_F·s; nanochat uses 1.02 with polar_express
  float eps = 1e-7f;
  EpsMode eps_mode = EpsMode::Add;
  // Polar Express schedule construction (used when schedule == PolarExpress).
  double pe_l0 = 1e-3, pe_safety = 0.02, pe_cushion = 0.02;
  std::vector<Coefficients> custom;     // used when schedule == Custom; size must equal steps
  // Emulate torch.optim.Muon's bf16 arithmetic (for parity tests; slower, less accurate): the input
  // and the normalized X are rounded to bf16 (norm rounded to bf16 first, then X / norm), and each
  // step, with fp32 accumulation and every product's output rounded to bf16, computes
  // A = bf16(X·Xᵀ), Z = bf16(b·A + c·A·A), X ← bf16(a·X + Z·X) (torch's two addmm), tall matrices
  // on XᵀX. Plain products only: `method` is ignored. Outputs are bf16 values held in fp32.
  bool bf16_rounding = false;
  // The dtype of the products' operands. F32 (default): fp32 BLAS throughout. BF16: every product
  // reads bf16 operands and accumulates in fp32 (bf16_products_info() says how on this CPU: about
  // 2.4x the fp32 GEMM rate where native, the fp32 rate elsewhere); what is not a product (normalization, the polynomial aI + bA + cA², Gram NS's
  // bookkeeping) stays fp32, and the result is fp32. X is rounded to bf16 once before each product
  // that reads it, so the error is that of torch.optim.Muon's bf16 iteration at most (which also
  // rounds every product's output): about 2⁻⁸ relative per step. Symmetric results are formed on
  // their lower block triangle (method symmetric). Runs on every CPU; the constructor throws
  // meshmuon::Error only where MESHMUON_BF16_PRODUCTS forces an implementation this CPU lacks.
  // Not combinable with bf16_rounding, nor with method gram (std::invalid_argument): Gram NS
  // iterates on X·Xᵀ, which squares the condition number, and bf16 operands then lose the small
  // singular values (measured: σ off by 0.5 on a rank-20 200×500 input, 0.015 with symmetric).
  DType matmul_dtype = DType::F32;
  // nanochat's two scalings around the polar iteration (off by default), per matrix (each matrix of a
  // batch on its own):
  // - muon_eq, MuonEq row equilibration before the normalization: target = ‖X‖_F / sqrt(m), row i
  //   scaled by target / max(‖X_i‖₂, 1e-6) (the rows get the RMS row norm; better conditioned input);
  // - muon_plus, Muon+ renormalization after the last step: X scaled by sqrt(min(m, n)) /
  //   max(‖X‖_F, 1e-6) (the norm of an exactly semi-orthogonal matrix, whatever NS converged to).
  // Norms are summed in double in a fixed order, each scale rounded once to fp32 and applied as one
  // fp32 product per element, so the determinism contract above holds with them. Not combinable with
  // bf16_rounding (std::invalid_argument). An all-zero matrix still gives zeros.
  bool muon_eq = false;
  bool muon_plus = false;
  // Every field compared (an Orthogonalizer is rebuilt when its options differ from a group's).
  friend bool operator==(const NsOptions&, const NsOptions&) = default;
};

// The per-step coefficients that `options` describe (length options.steps). Polar Express is
// computed by the greedy minimax construction of arXiv 2505.16932. Throws std::invalid_argument on
// invalid options (steps < 1, "you" with steps != 5, custom of the wrong length, non-finite values).
MESHMUON_API std::vector<Coefficients> make_schedule(const NsOptions& options);

// Polar Express coefficients for any step count (greedy minimax by Remez exchange).
MESHMUON_API std::vector<Coefficients> polar_express_coefficients(int steps, double l0, double safety,
                                                               double cushion);

// Floating-point operations of one orthogonalization of an m×n matrix with these options (the
// multiply-adds of the GEMM / SYRK calls, 2 flops each; SYRK counted at its useful half). With
// s = min(m, n), l = max(m, n) and T steps: plain T·(4s²l + 2s³), symmetric T·(3s²l + s³), gram (when
// l ≥ 2s, else as symmetric) 6s²l + 20s³ for T = 5: s²l for R = X·Xᵀ, 3s²l at the restart, 2s²l for
// the final X = Q·X₀; per step s³ for R², 2s³ for Q ← Z·Q (free while Q = I) and 3s³ for R ← Z²·R.
MESHMUON_API double ns_flops(int64_t m, int64_t n, const NsOptions& options);

// bf16 products on this machine (NsOptions::matmul_dtype = BF16). Every x86-64 CPU runs them, with
// one contract (operands rounded to bf16, fp32 accumulation, bitwise the same on every thread
// count); the implementation differs by CPU:
//   "native"           oneDNN with bf16 instructions (AVX512-BF16 / AMX-BF16): ~2.4x the fp32 rate;
//   "widened"          meshmuon's own: the bf16 values held in fp32 and multiplied by the fp32 products
//                      (exact: the product of two bf16 values fits fp32), at the fp32 rate;
//   "onednn_emulated"  oneDNN emulating bf16 on AVX-512 CPUs without it (slower than fp32: only
//                      when forced).
// Chosen once per process: MESHMUON_BF16_PRODUCTS=onednn | widened forces one; unset or "auto" takes
// native where oneDNN has it, widened elsewhere.
struct Bf16ProductsInfo {
  std::string kind;     // "native", "widened" or "onednn_emulated"
  std::string kernel;   // e.g. "oneDNN 3.2.0 brg:avx512_core_bf16", "OpenBLAS Zen SGEMM on bf16-valued operands"
  std::string reason;   // why this implementation
  bool forced = false;  // by MESHMUON_BF16_PRODUCTS
  std::string error;    // non-empty: bf16 products cannot run here (a forced path this CPU lacks)
};
MESHMUON_API Bf16ProductsInfo bf16_products_info();

// The product dtype Muon runs fastest with on this CPU at its accuracy (what "auto" means for
// NsOptions::matmul_dtype in the frontends): BF16 where bf16 products are native, F32 elsewhere
// (there bf16 products are no faster: widened ones run at the fp32 rate, with bf16's error).
MESHMUON_API DType auto_matmul_dtype();

// The measured cost of bf16 products here: one size×size orthogonalization (5 steps, plain products)
// with fp32 and with bf16 products, on the calling thread alone, timed by its CPU time (so other
// load on the machine does not distort the ratio); best of `repeats`. A few ms; not cached.
struct Bf16Cost {
  int size = 0;
  double fp32_seconds = 0, bf16_seconds = 0;
  double bf16_over_fp32 = 0;  // < 1: bf16 products are faster
};
MESHMUON_API Bf16Cost measure_bf16_cost(int size = 192, int repeats = 3);

// Orthogonalizes matrices. Holds the schedule (computed once at construction) and a scratch
// workspace that grows to the largest matrix seen. Not thread-safe: use one per thread.
class MESHMUON_API Orthogonalizer {
 public:
  explicit Orthogonalizer(NsOptions options);  // validates; throws std::invalid_argument
  ~Orthogonalizer();
  Orthogonalizer(Orthogonalizer&&) noexcept;
  Orthogonalizer& operator=(Orthogonalizer&&) noexcept;

  const NsOptions& options() const { return options_; }
  const std::vector<Coefficients>& coefficients() const { return coefficients_; }

  // One row-major m×n fp32 matrix. `out` may equal `in` (in place); otherwise they must not overlap.
  // m or n = 0 is a no-op. Throws std::invalid_argument (before writing anything) for negative or
  // > INT_MAX sizes, null pointers and partially overlapping buffers.
  void run(const float* in, float* out, int64_t m, int64_t n);

  // `in`/`out`: contiguous fp32 [m, n], or [B, m, n] for a batch of same-shape matrices (an expert
  // stack; each matrix is normalized and orthogonalized on its own). Same shapes; may alias.
  // Throws std::invalid_argument for another dtype, non-contiguous views, other ranks or mismatched
  // shapes.
  void run(const TensorView& in, const TensorView& out);

 private:
  // Normalization and Newton–Schulz of one non-empty matrix (`in` may equal `out`).
  void polar(const float* in, float* out, int64_t m, int64_t n);
  struct Workspace;
  NsOptions options_;
  std::vector<Coefficients> coefficients_;
  Workspace* ws_ = nullptr;
};

}  // namespace meshmuon
