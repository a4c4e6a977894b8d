// Scalar building blocks of the update kernels, written to round exactly as torch's CPU kernels do
// (see include/meshmuon/update.h), and the argument checks they share.
#pragma once

#include <cmath>
#include <cstdint>

#include "meshmuon/bf16.h"
#include "meshmuon/error.h"

// Hot loops get an AVX2+FMA clone chosen at load time; fma is exactly rounded, so every clone gives
// the same bits (the default clone calls libm's fmaf).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MESHMUON_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MESHMUON_SIMD_CLONES
#endif

namespace meshmuon::cpu {

// torch.lerp on the CPU (vectorized path): one fused multiply-add, base chosen by |w| < 0.5.
inline float torch_lerp(float a, float b, float w) {
  const float diff = b - a;
  return std::fabs(w) < 0.5f ? std::fma(w, diff, a) : std::fma(w - 1.0f, diff, b);
}

inline float to_f32(float x) { return x; }
inline float to_f32(BFloat16 x) { return bf16_to_float(x); }

// A Python float hyperparameter as torch passes it to an fp32 kernel.
inline float to_scalar(double x) { return static_cast<float>(x); }

inline void check_buffer(const void* p, int64_t n, const char* area, const char* what) {
  MESHMUON_CHECK(n >= 0, "[", area, "] element count ", n, " is negative");
  MESHMUON_CHECK(p != nullptr || n == 0, "[", area, "] ", what, " is null with ", n, " elements");
}

// A decay rate with no upper bound (momentum, NorMuon's beta2): torch.optim.Muon and Dion check only
// >= 0; 1 keeps the state where it is (EMA, NorMuon) or sums (heavy ball), > 1 extrapolates, as theirs.
inline void check_nonnegative_rate(double x, const char* area, const char* what) {
  MESHMUON_CHECK(std::isfinite(x) && x >= 0.0, "[", area, "] ", what, " ", x, " must be finite and >= 0");
}

inline void check_unit_interval(double x, const char* area, const char* what) {
  MESHMUON_CHECK(std::isfinite(x) && x >= 0.0 && x < 1.0, "[", area, "] ", what, " ", x,
              " is outside [0, 1)");
}

}  // namespace meshmuon::cpu
