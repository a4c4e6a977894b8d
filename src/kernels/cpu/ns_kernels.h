// Internal building blocks of the CPU Newton–Schulz kernels (orthogonalize.cpp, gram_ns.cpp).
// All matrices are row-major fp32. "Gram side" s = min(m, n); wide (m ≤ n) iterates on X·Xᵀ,
// tall on Xᵀ·X, through BLAS transpose flags.
#pragma once

#include <cstdint>
#include <vector>

#include "dmuon/orthogonalize.h"

namespace dmuon::cpu {

// Scratch owned by an Orthogonalizer; vectors grow to the largest matrix seen and are reused.
struct NsScratch {
  std::vector<float> x;                            // m×n ping-pong buffer
  std::vector<float> r, s, z, q, t;                // s×s Gram-side buffers
  float* ensure(std::vector<float>& v, int64_t count) {
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

// Gram Newton–Schulz (restart after kGramRestartStep). x0 (normalized) is overwritten.
void gram_newton_schulz(float* x0, float* out, int64_t m, int64_t n,
                        const std::vector<Coefficients>& coefficients, NsScratch& scratch);

}  // namespace dmuon::cpu
