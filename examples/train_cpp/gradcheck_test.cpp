// Gradient check of the hand-written backward pass (model.h): central finite differences on the
// double-precision model for EVERY parameter element of a small model, then the float model (the one
// that trains) against the double one. Exit 0 on success; prints the worst errors either way.
#include <cmath>
#include <cstdio>
#include <vector>

#include "model.h"

using namespace train_cpp;

int main() {
  const ModelConfig cfg{/*vocab=*/7, /*context=*/3, /*dim=*/4, /*hidden=*/5};
  const int B = 6;
  const auto defs = param_defs(cfg);
  auto init = init_params(cfg, 1234);
  // Non-trivial biases and gains (init leaves them 0 and 1), so their gradient paths are exercised.
  uint64_t s = 99;
  auto unif = [&] { return static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53 * 2 - 1; };
  for (int i : {kB1, kB2, kNorm})
    for (auto& v : init[i]) v += static_cast<float>(0.5 * unif());
  for (auto& v : init[kHead]) v *= 4;  // sharper softmax
  std::vector<int32_t> ctx(B * cfg.context), tgt(B);
  for (auto& c : ctx) c = static_cast<int32_t>(splitmix64(s) % cfg.vocab);
  for (auto& t : tgt) t = static_cast<int32_t>(splitmix64(s) % cfg.vocab);
  ctx[0] = ctx[1];  // a repeated token: embedding rows accumulate

  std::vector<std::vector<double>> pd(defs.size()), gd(defs.size());
  std::vector<std::vector<float>> pf(defs.size()), gf(defs.size());
  std::vector<const double*> pdp;
  std::vector<double*> gdp;
  std::vector<const float*> pfp;
  std::vector<float*> gfp;
  for (size_t i = 0; i < defs.size(); ++i) {
    pd[i].assign(init[i].begin(), init[i].end());
    pf[i] = init[i];
    gd[i].assign(pd[i].size(), 0.0);
    gf[i].assign(pf[i].size(), 0.0f);
  }
  for (size_t i = 0; i < defs.size(); ++i) {
    pdp.push_back(pd[i].data());
    gdp.push_back(gd[i].data());
    pfp.push_back(pf[i].data());
    gfp.push_back(gf[i].data());
  }
  Mlp<double> md(cfg);
  Mlp<float> mf(cfg);
  const double loss = md.forward_backward(pdp.data(), gdp.data(), ctx.data(), tgt.data(), B);
  const double lossf = mf.forward_backward(pfp.data(), gfp.data(), ctx.data(), tgt.data(), B);
  std::printf("loss (double) %.12f, (float) %.12f\n", loss, lossf);

  bool ok = std::isfinite(loss) && std::fabs(loss - lossf) < 1e-5;
  const double eps = 1e-5;
  int checked = 0;
  for (size_t i = 0; i < defs.size(); ++i) {
    double worst = 0, worst_f = 0;
    for (size_t j = 0; j < pd[i].size(); ++j) {
      const double orig = pd[i][j];
      pd[i][j] = orig + eps;
      const double lp = md.forward_backward(pdp.data(), nullptr, ctx.data(), tgt.data(), B);
      pd[i][j] = orig - eps;
      const double lm = md.forward_backward(pdp.data(), nullptr, ctx.data(), tgt.data(), B);
      pd[i][j] = orig;
      const double num = (lp - lm) / (2 * eps);
      const double ana = gd[i][j];
      const double err = std::fabs(num - ana) / std::max(1e-3, std::fabs(num) + std::fabs(ana));
      worst = std::max(worst, err);
      const double errf = std::fabs(gf[i][j] - ana) / std::max(1e-2, std::fabs(ana));
      worst_f = std::max(worst_f, errf);
      ++checked;
    }
    const bool pass = worst < 1e-6 && worst_f < 1e-3;
    ok = ok && pass;
    std::printf("%-6s %-10s finite-diff rel err %.2e   float-vs-double %.2e  %s\n", defs[i].name.c_str(),
                ("[" + std::to_string(pd[i].size()) + "]").c_str(), worst, worst_f, pass ? "ok" : "FAIL");
  }
  std::printf("%d elements checked: %s\n", checked, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
