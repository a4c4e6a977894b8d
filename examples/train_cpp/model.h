// A character-level MLP language model with a hand-written forward and backward pass (BLAS GEMMs),
// the model of examples/train_cpp. Templated on the scalar type: float trains, double lets the
// gradient-check test compare the backward pass with finite differences tightly.
//
//   x    = concat(embed[c_1], ..., embed[c_T])            [B, T·d]   (the T previous characters)
//   h1   = gelu(x·W1ᵀ + b1)                               [B, h]
//   h2   = h1 + gelu(h1·W2ᵀ + b2)                         [B, h]     (residual)
//   n    = h2 / sqrt(mean(h2²) + eps) · g                 [B, h]     (RMSNorm with a gain)
//   loss = mean_b cross_entropy(n·headᵀ, y_b)             logits [B, V]
//
// Parameters (in this order; Muon for the two hidden matrices, AdamW for everything else):
//   embed [V, d], w1 [h, T·d], b1 [h], w2 [h, h], b2 [h], norm [h], head [V, h]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace train_cpp {

struct ModelConfig {
  int vocab = 0;    // V
  int context = 0;  // T
  int dim = 0;      // d
  int hidden = 0;   // h
};

struct ParamDef {
  std::string name;
  std::vector<int64_t> shape;
  bool muon = false;  // true: orthogonalized (Muon); false: AdamW
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
};

enum ParamIndex : int { kEmbed = 0, kW1, kB1, kW2, kB2, kNorm, kHead, kNumParams };

std::vector<ParamDef> param_defs(const ModelConfig& cfg);

// Full tensors, deterministic from `seed` alone (splitmix64 + Box-Muller, no std:: distributions,
// so every rank, world size and standard library gets the same bits).
std::vector<std::vector<float>> init_params(const ModelConfig& cfg, uint64_t seed);

// splitmix64: the trainer's only random source (initialization and batch sampling).
uint64_t splitmix64(uint64_t& state);

template <class T>
class Mlp {
 public:
  explicit Mlp(const ModelConfig& cfg) : cfg_(cfg) {}
  const ModelConfig& config() const { return cfg_; }

  // Mean cross-entropy over the batch. ctx: [B, T] token ids, targets: [B]. params[i] points to
  // parameter i (param_defs order, row-major). When grads is non-null, grads[i] is OVERWRITTEN with
  // d(loss)/d(param i). Scratch is kept between calls (not thread-safe).
  double forward_backward(const T* const* params, T* const* grads, const int32_t* ctx, const int32_t* targets,
                          int batch);

 private:
  ModelConfig cfg_;
  std::vector<T> x_, a1_, h1_, a2_, h2_, rinv_, n_, z_, dz_, dn_, dh2_, da2_, dh1_, da1_, dx_;
};

extern template class Mlp<float>;
extern template class Mlp<double>;

}  // namespace train_cpp
