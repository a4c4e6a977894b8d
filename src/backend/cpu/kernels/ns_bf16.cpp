// Newton–Schulz with torch.optim.Muon's bf16 rounding emulated in fp32 (NsOptions::bf16_rounding):
// for parity tests against torch, which casts to bf16 and runs bf16 matmuls (fp32 accumulation,
// outputs rounded to bf16). Products are plain SGEMMs on bf16-valued fp32 inputs.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "meshmuon/bf16.h"
#include "backend/cpu/kernels/products.h"
#include "backend/cpu/kernels/ns_kernels.h"

namespace meshmuon::cpu {
namespace {

inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace

void newton_schulz_bf16(const float* in, float* out, int64_t m, int64_t n, const NsOptions& options,
                        const std::vector<Coefficients>& coefficients, NsScratch& scratch) {
  const int64_t count = m * n;
  const bool wide = m <= n;
  const int s = static_cast<int>(wide ? m : n);
  const int mi = static_cast<int>(m), ni = static_cast<int>(n);
  float* x = scratch.ensure(scratch.x, count);
  float* g = scratch.ensure(scratch.r, int64_t(s) * s);
  float* g2 = scratch.ensure(scratch.s, int64_t(s) * s);
  float* z = scratch.ensure(scratch.z, int64_t(s) * s);

  // pass 1: X = bf16(G); ‖X‖ accumulated wide and rounded to bf16, as torch's bf16 norm() returns.
  double sum = 0;
  for (int64_t i = 0; i < count; ++i) {
    x[i] = round_bf16(in[i]);
    sum += double(x[i]) * x[i];
  }
  const float norm = round_bf16(round_bf16(static_cast<float>(std::sqrt(sum))) * options.scale);
  const float denom = options.eps_mode == EpsMode::Add ? round_bf16(norm + options.eps)
                                                       : round_bf16(std::max(norm, options.eps));
  if (sum == 0 || denom == 0) {  // all zeros: exact zeros, as the fp32 path
    std::memset(out, 0, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < count; ++i) x[i] = round_bf16(x[i] / denom);  // torch div_ on bf16

  // pass 2: per step A = bf16(X·Xᵀ), Z = bf16(b·A + c·A·A), X ← bf16(a·X + Z·X) (torch's addmm
  // pair); tall matrices use XᵀX and X·Z, the transpose of torch's X.T form.
  float* y = out;  // `in` has been fully read, so `out` is free as the product buffer
  for (const Coefficients& k : coefficients) {
    const float a = static_cast<float>(k.a), b = static_cast<float>(k.b), c = static_cast<float>(k.c);
    if (wide)
      sgemm(false, true, s, s, ni, 1.0f, x, ni, x, ni, 0.0f, g, s);
    else
      sgemm(true, false, s, s, mi, 1.0f, x, ni, x, ni, 0.0f, g, s);
    for (int64_t i = 0; i < int64_t(s) * s; ++i) g[i] = round_bf16(g[i]);
    sgemm(false, false, s, s, s, 1.0f, g, s, g, s, 0.0f, g2, s);
    for (int64_t i = 0; i < int64_t(s) * s; ++i) z[i] = round_bf16(c * g2[i] + b * g[i]);
    if (wide)
      sgemm(false, false, mi, ni, mi, 1.0f, z, mi, x, ni, 0.0f, y, ni);
    else
      sgemm(false, false, mi, ni, ni, 1.0f, x, ni, z, ni, 0.0f, y, ni);
    for (int64_t i = 0; i < count; ++i) x[i] = round_bf16(a * x[i] + y[i]);
  }
  std::memcpy(out, x, static_cast<size_t>(count) * sizeof(float));
}

}  // namespace meshmuon::cpu
