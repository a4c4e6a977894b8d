#include "model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <stdexcept>

namespace train_cpp {

namespace {

// C[M,N] = alpha · op(A) · op(B) + beta · C, row-major.
void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
          float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
              b, ldb, beta, c, ldc);
}
void gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b, int ldb,
          double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
              b, ldb, beta, c, ldc);
}

// GELU, tanh approximation (GPT-2's), and its derivative.
constexpr double kGeluS = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC = 0.044715;
template <class T> T gelu(T x) {
  const T t = std::tanh(T(kGeluS) * (x + T(kGeluC) * x * x * x));
  return T(0.5) * x * (T(1) + t);
}
template <class T> T gelu_grad(T x) {
  const T t = std::tanh(T(kGeluS) * (x + T(kGeluC) * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * T(kGeluS) * (T(1) + T(3 * kGeluC) * x * x);
}

constexpr double kRmsEps = 1e-6;

double uniform01(uint64_t& s) { return (static_cast<double>(splitmix64(s) >> 11) + 0.5) * 0x1.0p-53; }

}  // namespace

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<ParamDef> param_defs(const ModelConfig& c) {
  const int64_t V = c.vocab, T = c.context, d = c.dim, h = c.hidden;
  return {
      {"embed", {V, d}, false},   {"w1", {h, T * d}, true}, {"b1", {h}, false}, {"w2", {h, h}, true},
      {"b2", {h}, false},         {"norm", {h}, false},     {"head", {V, h}, false},
  };
}

std::vector<std::vector<float>> init_params(const ModelConfig& cfg, uint64_t seed) {
  const auto defs = param_defs(cfg);
  std::vector<std::vector<float>> out(defs.size());
  for (size_t i = 0; i < defs.size(); ++i) {
    auto& p = out[i];
    p.assign(static_cast<size_t>(defs[i].numel()), 0.0f);
    // One stream per parameter: adding a parameter never shifts another's values.
    uint64_t s = seed * 0x100000001B3ull + 0x51ED2701ull * (i + 1);
    double stddev = 0;
    switch (static_cast<ParamIndex>(i)) {
      case kEmbed: stddev = 1.0; break;
      case kW1: stddev = 1.0 / std::sqrt(static_cast<double>(defs[i].shape[1])); break;
      case kW2: stddev = 1.0 / std::sqrt(static_cast<double>(defs[i].shape[1])); break;
      case kHead: stddev = 0.5 / std::sqrt(static_cast<double>(defs[i].shape[1])); break;
      case kNorm: std::fill(p.begin(), p.end(), 1.0f); break;
      default: break;  // biases: zero
    }
    if (stddev > 0) {
      for (size_t j = 0; j < p.size(); j += 2) {  // Box-Muller: two normals per pair of uniforms
        const double u1 = uniform01(s), u2 = uniform01(s);
        const double r = std::sqrt(-2.0 * std::log(u1));
        p[j] = static_cast<float>(stddev * r * std::cos(2 * std::numbers::pi * u2));
        if (j + 1 < p.size()) p[j + 1] = static_cast<float>(stddev * r * std::sin(2 * std::numbers::pi * u2));
      }
    }
  }
  return out;
}

template <class T>
double Mlp<T>::forward_backward(const T* const* params, T* const* grads, const int32_t* ctx, const int32_t* targets,
                                int B) {
  const int V = cfg_.vocab, Tc = cfg_.context, d = cfg_.dim, h = cfg_.hidden, K = Tc * d;
  if (B <= 0) throw std::invalid_argument("forward_backward: batch must be > 0");
  const T* E = params[kEmbed];
  const T* W1 = params[kW1];
  const T* b1 = params[kB1];
  const T* W2 = params[kW2];
  const T* b2 = params[kB2];
  const T* g = params[kNorm];
  const T* Hd = params[kHead];
  auto size = [](std::vector<T>& v, size_t n) { v.resize(n); };
  size(x_, size_t(B) * K);
  size(a1_, size_t(B) * h);
  size(h1_, size_t(B) * h);
  size(a2_, size_t(B) * h);
  size(h2_, size_t(B) * h);
  size(rinv_, size_t(B));
  size(n_, size_t(B) * h);
  size(z_, size_t(B) * V);

  // x = concatenated embeddings of the context.
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tc; ++t) {
      const int c = ctx[size_t(b) * Tc + t];
      if (c < 0 || c >= V) throw std::out_of_range("forward_backward: token id out of range");
      std::memcpy(&x_[size_t(b) * K + size_t(t) * d], E + size_t(c) * d, sizeof(T) * d);
    }
  // a1 = x·W1ᵀ + b1, h1 = gelu(a1)
  for (int b = 0; b < B; ++b) std::memcpy(&a1_[size_t(b) * h], b1, sizeof(T) * h);
  gemm(false, true, B, h, K, T(1), x_.data(), K, W1, K, T(1), a1_.data(), h);
  for (size_t i = 0; i < a1_.size(); ++i) h1_[i] = gelu(a1_[i]);
  // a2 = h1·W2ᵀ + b2, h2 = h1 + gelu(a2)
  for (int b = 0; b < B; ++b) std::memcpy(&a2_[size_t(b) * h], b2, sizeof(T) * h);
  gemm(false, true, B, h, h, T(1), h1_.data(), h, W2, h, T(1), a2_.data(), h);
  for (size_t i = 0; i < a2_.size(); ++i) h2_[i] = h1_[i] + gelu(a2_[i]);
  // n = rmsnorm(h2)·g
  for (int b = 0; b < B; ++b) {
    const T* row = &h2_[size_t(b) * h];
    T ss = 0;
    for (int j = 0; j < h; ++j) ss += row[j] * row[j];
    const T ri = T(1) / std::sqrt(ss / T(h) + T(kRmsEps));
    rinv_[b] = ri;
    for (int j = 0; j < h; ++j) n_[size_t(b) * h + j] = row[j] * ri * g[j];
  }
  // logits = n·headᵀ
  gemm(false, true, B, V, h, T(1), n_.data(), h, Hd, h, T(0), z_.data(), V);
  // Cross-entropy (log-sum-exp in double); dz = (softmax − onehot) / B in place of z when training.
  double loss = 0;
  const bool train = grads != nullptr;
  if (train) size(dz_, size_t(B) * V);
  for (int b = 0; b < B; ++b) {
    const T* zr = &z_[size_t(b) * V];
    const int y = targets[b];
    if (y < 0 || y >= V) throw std::out_of_range("forward_backward: target out of range");
    T m = zr[0];
    for (int v = 1; v < V; ++v) m = std::max(m, zr[v]);
    double se = 0;
    for (int v = 0; v < V; ++v) se += std::exp(static_cast<double>(zr[v] - m));
    const double lse = static_cast<double>(m) + std::log(se);
    loss += lse - static_cast<double>(zr[y]);
    if (train) {
      T* dzr = &dz_[size_t(b) * V];
      for (int v = 0; v < V; ++v) dzr[v] = static_cast<T>(std::exp(static_cast<double>(zr[v]) - lse) / B);
      dzr[y] -= T(1) / T(B);
    }
  }
  loss /= B;
  if (!train) return loss;

  T* dE = grads[kEmbed];
  T* dW1 = grads[kW1];
  T* db1 = grads[kB1];
  T* dW2 = grads[kW2];
  T* db2 = grads[kB2];
  T* dg = grads[kNorm];
  T* dHd = grads[kHead];
  size(dn_, size_t(B) * h);
  size(dh2_, size_t(B) * h);
  size(da2_, size_t(B) * h);
  size(dh1_, size_t(B) * h);
  size(da1_, size_t(B) * h);
  size(dx_, size_t(B) * K);

  // head: dHead = dzᵀ·n [V,h]; dn = dz·head [B,h]
  gemm(true, false, V, h, B, T(1), dz_.data(), V, n_.data(), h, T(0), dHd, h);
  gemm(false, false, B, h, V, T(1), dz_.data(), V, Hd, h, T(0), dn_.data(), h);
  // RMSNorm: u = h2·r, n = u·g; dg = Σ_b dn·u; du = dn·g; dh2 = r·(du − u·mean(du·u))
  std::fill(dg, dg + h, T(0));
  for (int b = 0; b < B; ++b) {
    const T ri = rinv_[b];
    const T* row = &h2_[size_t(b) * h];
    const T* dnr = &dn_[size_t(b) * h];
    T dot = 0;
    for (int j = 0; j < h; ++j) {
      const T u = row[j] * ri;
      dg[j] += dnr[j] * u;
      dot += dnr[j] * g[j] * u;
    }
    dot /= T(h);
    for (int j = 0; j < h; ++j) dh2_[size_t(b) * h + j] = ri * (dnr[j] * g[j] - row[j] * ri * dot);
  }
  // residual block: da2 = dh2·gelu'(a2); dh1 = dh2 + da2·W2; dW2 = da2ᵀ·h1; db2 = Σ_b da2
  for (size_t i = 0; i < da2_.size(); ++i) da2_[i] = dh2_[i] * gelu_grad(a2_[i]);
  std::memcpy(dh1_.data(), dh2_.data(), sizeof(T) * dh1_.size());
  gemm(false, false, B, h, h, T(1), da2_.data(), h, W2, h, T(1), dh1_.data(), h);
  gemm(true, false, h, h, B, T(1), da2_.data(), h, h1_.data(), h, T(0), dW2, h);
  std::fill(db2, db2 + h, T(0));
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < h; ++j) db2[j] += da2_[size_t(b) * h + j];
  // first layer: da1 = dh1·gelu'(a1); dW1 = da1ᵀ·x; db1 = Σ_b da1; dx = da1·W1
  for (size_t i = 0; i < da1_.size(); ++i) da1_[i] = dh1_[i] * gelu_grad(a1_[i]);
  gemm(true, false, h, K, B, T(1), da1_.data(), h, x_.data(), K, T(0), dW1, K);
  std::fill(db1, db1 + h, T(0));
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < h; ++j) db1[j] += da1_[size_t(b) * h + j];
  gemm(false, false, B, K, h, T(1), da1_.data(), h, W1, K, T(0), dx_.data(), K);
  // embedding: scatter-add dx rows (in batch order: deterministic)
  std::fill(dE, dE + size_t(V) * d, T(0));
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tc; ++t) {
      T* dst = dE + size_t(ctx[size_t(b) * Tc + t]) * d;
      const T* src = &dx_[size_t(b) * K + size_t(t) * d];
      for (int j = 0; j < d; ++j) dst[j] += src[j];
    }
  return loss;
}

template class Mlp<float>;
template class Mlp<double>;

}  // namespace train_cpp
