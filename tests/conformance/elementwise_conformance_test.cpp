// The element-wise update kernels of every backend, bitwise the cpu backend's on random inputs:
// momentum (every kind, Nesterov or not, fp32 and bf16 gradients), apply_update (decoupled and
// cautious decay, both decay_lr), adamw (fp32 / bf16 gradients, first and later step), the
// multi-tensor forms (empty, one-element and multi-block tensors in one call; the comm rounding),
// qk_clip_rows, round_to_comm, first_non_finite and first_non_finite_of. Negative controls: each
// reference moved from its input (a kernel that does nothing cannot match it), and a perturbed input
// gives other bits.
#include <limits>

#include "conformance.h"
#include "meshmuon/qk_clip.h"
#include "meshmuon/update.h"

namespace meshmuon::conformance {
namespace {

using detail::Backend;

class Elementwise : public Conformance {};

TEST_P(Elementwise, Momentum) {
  const int64_t n = 100003;
  for (MomentumKind kind : {MomentumKind::Ema, MomentumKind::HeavyBall})
    for (bool nesterov : {true, false})
      for (bool bf16 : {false, true}) {
        const MomentumOptions o{kind, 0.95, nesterov};
        const std::vector<float> buf0 = randn(n, 2), g = randn(n, 3);
        const std::vector<BFloat16> gb = to_bf16(g);
        std::vector<float> buf = buf0, upd(n);
        const DType dt = bf16 ? DType::BF16 : DType::F32;
        float* dbuf = put(buf);
        float* dupd = put(upd);
        void* dg = bf16 ? static_cast<void*>(put(gb)) : static_cast<void*>(put(g));
        cpu().momentum(o, buf.data(), TensorView(bf16 ? static_cast<void*>(const_cast<BFloat16*>(gb.data()))
                                                      : const_cast<float*>(g.data()), dt, Shape{n}), upd.data());
        be().momentum(o, dbuf, view(dg, dt, n), dupd);
        const std::string what = "kind " + std::to_string(int(kind)) + " nesterov " + std::to_string(nesterov) +
                                 " bf16 " + std::to_string(bf16);
        EXPECT_BITWISE(get(dbuf, n), buf, what + " buf");
        EXPECT_BITWISE(get(dupd, n), upd, what + " update");
        EXPECT_NE(first_difference(buf, buf0), -1) << what << ": negative control, the buffer did not move";
      }
}

TEST_P(Elementwise, ApplyUpdate) {
  const int64_t n = 65537;
  for (DecayLr decay_lr : {DecayLr::Unadjusted, DecayLr::Adjusted})
    for (bool cautious : {false, true}) {
      std::vector<float> p = randn(n, 4), u = randn(n, 5);
      for (int64_t i = 0; i < n - 1; i += 97) u[static_cast<size_t>(i)] = 0.0f, p[static_cast<size_t>(i + 1)] = -0.0f;
      const std::vector<float> p0 = p;
      const ApplyOptions o{0.02, 0.02 * 3.3, 0.1, cautious, decay_lr};
      float* dp = put(p);
      const float* du = put(u);
      cpu().apply_update(o, p.data(), u.data(), n);
      be().apply_update(o, dp, du, n);
      const std::string what = std::string(cautious ? "cautious" : "decoupled") + ", decay_lr " + std::string(to_string(decay_lr));
      EXPECT_BITWISE(get(dp, n), p, what);
      EXPECT_NE(first_difference(p, p0), -1) << what << ": negative control";
    }
}

TEST_P(Elementwise, AdamW) {
  const int64_t n = 65537;
  for (bool bf16 : {false, true})
    for (int64_t step : {1, 7}) {
      AdamWOptions o;
      o.lr = 3e-4, o.weight_decay = 0.01, o.step = step;
      std::vector<float> p = randn(n, 6), g = randn(n, 7), m = randn(n, 8, 0.1f), v = randn(n, 9, 0.01f);
      for (float& x : v) x = x * x;
      const std::vector<float> p0 = p;
      std::vector<BFloat16> gb = to_bf16(g);
      float *dp = put(p), *dm = put(m), *dv = put(v);
      void* dg = bf16 ? static_cast<void*>(put(gb)) : static_cast<void*>(put(g));
      const DType dt = bf16 ? DType::BF16 : DType::F32;
      cpu().adamw(o, p.data(), TensorView(bf16 ? static_cast<void*>(gb.data()) : g.data(), dt, Shape{n}), m.data(), v.data());
      be().adamw(o, dp, view(dg, dt, n), dm, dv);
      const std::string what = "bf16 " + std::to_string(bf16) + " step " + std::to_string(step);
      EXPECT_BITWISE(get(dp, n), p, what + " param");
      EXPECT_BITWISE(get(dm, n), m, what + " exp_avg");
      EXPECT_BITWISE(get(dv, n), v, what + " exp_avg_sq");
      EXPECT_NE(first_difference(p, p0), -1) << what << ": negative control";
    }
}

// momentum_multi (+ the comm rounding of each update) then apply_multi on that update, against the
// cpu's single calls in the same order, tensor by tensor.
TEST_P(Elementwise, MomentumMultiAndApplyMulti) {
  const std::vector<int64_t> sizes = {777, 0, 1, 300001, 4096, 33, 1025, 64};
  for (DType comm : {DType::F32, DType::BF16}) {
    std::vector<std::vector<float>> buf, upd, par, gf;
    std::vector<std::vector<BFloat16>> gb;
    std::vector<float*> dbuf, dupd, dpar;
    std::vector<Backend::MomentumTensor> mt;
    std::vector<Backend::ApplyTensor> at;
    for (size_t t = 0; t < sizes.size(); ++t) {
      const int64_t n = sizes[t];
      const bool bf16 = t % 3 == 1;
      buf.push_back(randn(static_cast<size_t>(n), 100 + t, 0.1f)), gf.push_back(randn(static_cast<size_t>(n), 200 + t));
      gb.push_back(to_bf16(gf.back())), upd.emplace_back(static_cast<size_t>(n), 0.0f), par.push_back(randn(static_cast<size_t>(n), 300 + t));
      dbuf.push_back(put(buf.back())), dupd.push_back(put(upd.back())), dpar.push_back(put(par.back()));
      void* dg = bf16 ? static_cast<void*>(put(gb.back())) : static_cast<void*>(put(gf.back()));
      const MomentumOptions mo{t % 2 == 0 ? MomentumKind::Ema : MomentumKind::HeavyBall, 0.9 + 0.01 * double(t % 5), t % 4 < 2};
      mt.push_back({mo, dbuf.back(), view(dg, bf16 ? DType::BF16 : DType::F32, n), dupd.back()});
      const ApplyOptions ao{0.02, 0.02 * (1 + double(t)), t % 3 == 0 ? 0.0 : 0.1, t % 2 == 1};
      at.push_back({ao, dpar.back(), dupd.back(), n});
      TensorView hg(bf16 ? static_cast<void*>(gb.back().data()) : gf.back().data(), bf16 ? DType::BF16 : DType::F32, Shape{n});
      cpu().momentum(mo, buf.back().data(), hg, upd.back().data());
      cpu().round_to_comm(upd.back().data(), n, comm);
      cpu().apply_update(ao, par.back().data(), upd.back().data(), n);
    }
    be().momentum_multi(mt, comm);
    be().apply_multi(at);
    EXPECT_NE(first_difference(par[3], randn(static_cast<size_t>(sizes[3]), 303)), -1) << "negative control: the reference moved";
    for (size_t t = 0; t < sizes.size(); ++t) {
      const std::string what = std::string(to_string(comm)) + " tensor " + std::to_string(t);
      EXPECT_BITWISE(get(dbuf[t], buf[t].size()), buf[t], what + " momentum buffer");
      EXPECT_BITWISE(get(dupd[t], upd[t].size()), upd[t], what + " update");
      EXPECT_BITWISE(get(dpar[t], par[t].size()), par[t], what + " parameter");
    }
  }
}

TEST_P(Elementwise, AdamWMulti) {
  const std::vector<int64_t> sizes = {1000, 0, 1, 2 * 1024 * 1024 + 3, 4097, 300};
  struct Host {
    std::vector<float> p, g, m, v;
    std::vector<BFloat16> gb;
    AdamWOptions o;
    float *dp, *dm, *dv;
  };
  std::vector<Host> host;
  std::vector<Backend::AdamWTensor> list;
  for (size_t t = 0; t < sizes.size(); ++t) {
    const int64_t n = sizes[t];
    const bool bf16 = t % 2 == 1;
    Host h{randn(static_cast<size_t>(n), 20 + t), randn(static_cast<size_t>(n), 40 + t), randn(static_cast<size_t>(n), 60 + t, 0.1f), randn(static_cast<size_t>(n), 80 + t, 0.01f),
           {}, {}, nullptr, nullptr, nullptr};
    for (float& x : h.v) x = x * x;
    h.gb = to_bf16(h.g);
    h.o.lr = 1e-3 * double(t + 1), h.o.beta1 = 0.9 - 0.01 * double(t);
    h.o.weight_decay = t % 3 == 0 ? 0.0 : 0.05, h.o.step = int64_t(t) + 1;
    h.dp = put(h.p), h.dm = put(h.m), h.dv = put(h.v);
    void* dg = bf16 ? static_cast<void*>(put(h.gb)) : static_cast<void*>(put(h.g));
    list.push_back({h.o, h.dp, view(dg, bf16 ? DType::BF16 : DType::F32, n), h.dm, h.dv});
    cpu().adamw(h.o, h.p.data(), TensorView(bf16 ? static_cast<void*>(h.gb.data()) : h.g.data(), bf16 ? DType::BF16 : DType::F32, Shape{n}),
                h.m.data(), h.v.data());
    host.push_back(std::move(h));
  }
  be().adamw_multi(list);
  EXPECT_NE(first_difference(host[3].p, randn(static_cast<size_t>(sizes[3]), 23)), -1) << "negative control: the reference moved";
  for (size_t t = 0; t < host.size(); ++t) {
    const std::string what = "tensor " + std::to_string(t) + " (" + std::to_string(sizes[t]) + ")";
    EXPECT_BITWISE(get(host[t].dp, host[t].p.size()), host[t].p, what + " param");
    EXPECT_BITWISE(get(host[t].dm, host[t].m.size()), host[t].m, what + " exp_avg");
    EXPECT_BITWISE(get(host[t].dv, host[t].v.size()), host[t].v, what + " exp_avg_sq");
  }
}

TEST_P(Elementwise, QkClipRows) {
  const QkTag tag{0, QkKind::Q, 4, 8, 2, 0};
  const std::vector<float> logits{120.0f, 50.0f, 300.0f, 99.0f};
  const int64_t cols = 33;
  std::vector<float> w = randn(static_cast<size_t>(24 * cols), 10);
  const std::vector<float> w0 = w;
  float* dw = put(w);
  cpu().qk_clip_rows(tag, logits, 100.0, w.data(), 4, 28, cols);
  be().qk_clip_rows(tag, logits, 100.0, dw, 4, 28, cols);
  EXPECT_BITWISE(get(dw, w.size()), w, "qk_clip_rows");
  EXPECT_NE(first_difference(w, w0), -1) << "negative control: heads over the threshold were scaled";
}

TEST_P(Elementwise, RoundToComm) {
  std::vector<float> x = randn(50001, 11, 100.0f);
  x[5] = std::numeric_limits<float>::quiet_NaN(), x[6] = std::numeric_limits<float>::infinity(), x[7] = 3.0e38f;
  x[8] = -0.0f, x[9] = 1e-40f;  // a subnormal
  for (DType comm : {DType::BF16, DType::F32}) {
    std::vector<float> h = x;
    float* dx = put(h);
    cpu().round_to_comm(h.data(), int64_t(h.size()), comm);
    be().round_to_comm(dx, int64_t(h.size()), comm);
    EXPECT_BITWISE(get(dx, h.size()), h, "round_to_comm " + std::string(to_string(comm)));
    if (comm == DType::BF16) EXPECT_NE(first_difference(h, x), -1) << "negative control: bf16 rounding changed bits";
    else EXPECT_EQ(first_difference(h, x), -1) << "fp32 is a no-op";
  }
}

TEST_P(Elementwise, FirstNonFinite) {
  for (bool bf16 : {false, true})
    for (int64_t bad : {int64_t{-1}, int64_t{0}, int64_t{4097}, int64_t{99999}}) {
      std::vector<float> g = randn(100000, 12);
      if (bad >= 0) g[static_cast<size_t>(bad)] = std::numeric_limits<float>::infinity(), g[99999] = NAN;
      std::vector<BFloat16> gb = to_bf16(g);
      void* dg = bf16 ? static_cast<void*>(put(gb)) : static_cast<void*>(put(g));
      const TensorView hv(bf16 ? static_cast<void*>(gb.data()) : g.data(), bf16 ? DType::BF16 : DType::F32, Shape{100000});
      const int64_t want = cpu().first_non_finite(hv);
      EXPECT_EQ(want, bad) << "the reference";
      EXPECT_EQ(be().first_non_finite(view(dg, hv.dtype, 100000)), want) << "bad " << bad << " bf16 " << bf16;
    }
  // first_non_finite_of: fp32 and bf16 views, an empty one, a missing one
  std::vector<std::vector<float>> hs;
  for (size_t k = 0; k < 5; ++k) hs.push_back(randn(3000 + 1000 * k, 20 + uint32_t(k)));
  hs[2].clear();
  for (int first_bad : {-1, 0, 3, 4}) {
    std::vector<std::vector<float>> h = hs;
    if (first_bad >= 0) h[static_cast<size_t>(first_bad)].back() = NAN;
    std::vector<std::vector<BFloat16>> hb(h.size());
    std::vector<TensorView> dvs, hvs;
    for (size_t k = 0; k < h.size(); ++k) {
      const int64_t n = int64_t(h[k].size());
      if (k == 1) {  // no gradient
        dvs.emplace_back(), hvs.emplace_back();
      } else if (k == 3) {
        hb[k] = to_bf16(h[k]);
        dvs.push_back(view(put(hb[k]), DType::BF16, n)), hvs.emplace_back(hb[k].data(), DType::BF16, Shape{n});
      } else {
        dvs.push_back(view(put(h[k]), DType::F32, n)), hvs.emplace_back(h[k].data(), DType::F32, Shape{n});
      }
    }
    EXPECT_EQ(cpu().first_non_finite_of(hvs), first_bad);  // tensors 1 (none) and 2 (empty) never count
    EXPECT_EQ(be().first_non_finite_of(dvs), first_bad);
  }
}

INSTANTIATE_TEST_SUITE_P(Conformance, Elementwise, ::testing::ValuesIn(conformance_backend_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace meshmuon::conformance
