// Internal building blocks of the CPU Newton–Schulz kernels (orthogonalize.cpp, gram_ns.cpp).
// All matrices are row-major fp32. "Gram side" s = min(m, n); wide (m ≤ n) iterates on X·Xᵀ,
// tall on Xᵀ·X, through BLAS transpose flags.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshmuon/dtype.h"
#include "meshmuon/orthogonalize.h"
#include "backend/cpu/kernels/bf16_matmul.h"
#include "backend/cpu/kernels/bf16_products.h"

namespace meshmuon::cpu {

// Scratch owned by an Orthogonalizer; vectors grow to the largest matrix seen and are reused.
struct NsScratch {
  std::vector<float> x, x2;                        // m×n ping-pong buffers (x2: widened bf16 products)
  std::vector<float> r, s, z, q, t;                // s×s Gram-side buffers
  std::vector<double> row_sq;                      // MuonEq: m row sums of squares
  std::vector<BFloat16> xb, xb2;                   // oneDNN bf16 products: m×n operands
  std::vector<BFloat16> rb, zb;                    // oneDNN bf16 products: s×s operands
  std::unique_ptr<Bf16Matmul> matmul;              // created on first oneDNN use
  Bf16ProductPath bf16_path = Bf16ProductPath::Widened;  // chosen when the Orthogonalizer is made
  template <class T>
  T* ensure(std::vector<T>& v, int64_t count) {
    if (static_cast<int64_t>(v.size()) < count) v.resize(static_cast<size_t>(count));
    return v.data();
  }
};

// Copies the lower triangle of the s×s matrix `a` onto its upper triangle.
void symmetrize_lower(float* a, int s);

// z = a·I + b·g + c·g2 for symmetric g (full) and g2 (lower triangle read); z is written in full.
void gram_polynomial(const Coefficients& k, const float* g, const float* g2, float* z, int s);

// g = alpha·X·Xᵀ (wide) or alpha·Xᵀ·X (tall) in full (SYRK when `symmetric`, else SGEMM).
void gram(const float* x, int64_t m, int64_t n, bool symmetric, float alpha, float* g);

// dst = Z·src (wide) or src·Z (tall); Z is the s×s left/right factor.
void apply_left_factor(const float* z, const float* src, float* dst, int64_t m, int64_t n);

// Standard Newton–Schulz (plain or symmetric products) from the normalized x0 into out. x0 may
// equal out; scratch.x is used as the second buffer.
void newton_schulz(const float* x0, float* out, int64_t m, int64_t n,
                   const std::vector<Coefficients>& coefficients, bool symmetric, NsScratch& scratch);

// torch.optim.Muon's bf16 Newton–Schulz emulated in fp32 (NsOptions::bf16_rounding): reads `in`
// (may equal `out`), normalizes and iterates with every product rounded to bf16 (ns_bf16.cpp).
void newton_schulz_bf16(const float* in, float* out, int64_t m, int64_t n, const NsOptions& options,
                        const std::vector<Coefficients>& coefficients, NsScratch& scratch);

// Newton–Schulz with bf16 products (NsOptions::matmul_dtype = BF16) on scratch.bf16_path
// (bf16_products.h): X₀ = bf16(in · inv); every product's inputs are bf16, accumulation fp32, the
// polynomial Z = aI + bA + cA² is formed in fp32 and rounded to bf16 as a product input; the last
// product writes fp32 into `out`. Symmetric results (X·Xᵀ and A²) are computed on their lower block
// triangle unless `plain`. `in` may equal `out`. oneDNN uses `threads` OpenMP threads (the caller's
// count is restored); the widened path uses the products' threads (products.h).
void newton_schulz_bf16_products(const float* in, float inv, float* out, int64_t m, int64_t n,
                                 const std::vector<Coefficients>& coefficients, bool plain,
                                 int threads, NsScratch& scratch);

// ‖x‖_F over `count` values, summed in double in a fixed order (reproducible on every thread count).
double frobenius_norm(const float* x, int64_t count);

// The clamps of nanochat's MuonEq and Muon+ (a row, or a matrix, with a smaller norm is scaled as if
// its norm were this; an all-zero one stays zero).
inline constexpr double kMuonEqMinRowNorm = 1e-6;
inline constexpr double kMuonPlusMinNorm = 1e-6;

// MuonEq row equilibration (NsOptions::muon_eq) of the m×n matrix `in` into `out` (may equal `in`):
// target = ‖X‖_F / sqrt(m), row i scaled by fp32(target / max(‖X_i‖₂, 1e-6)); norms in double.
// `row_sq` is scratch (m values).
void muon_eq_rows(const float* in, float* out, int64_t m, int64_t n, std::vector<double>& row_sq);

// Muon+ renormalization (NsOptions::muon_plus), in place: X scaled by
// fp32(sqrt(min(m, n)) / max(‖X‖_F, 1e-6)), so ‖X‖_F = sqrt(min(m, n)) up to fp32 rounding.
void muon_plus(float* x, int64_t m, int64_t n);

// Gram Newton–Schulz (restart after kGramRestartStep). x0 (normalized) is overwritten.
void gram_newton_schulz(float* x0, float* out, int64_t m, int64_t n,
                        const std::vector<Coefficients>& coefficients, NsScratch& scratch);

}  // namespace meshmuon::cpu
