// Orthogonalization on every backend against the cpu backend: make_orthogonalizer + muon_units
// (every method, fp32 and bf16 products, wide / tall / square, a batch; MuonEq and Muon+; NorMuon
// and bf16 comm rounding), muon_batch (each matrix bitwise what muon_units gives it on the same
// backend), gram_newton_schulz over 1 and 3 shards, determinism and exact zeros, and the test-only
// method (test_method.h) through the same path. Bitwise where the backend's products are the cpu's,
// else within its stated bound (backends.h); singular values against LAPACK's SVD as the oracle.
// A method the backend lacks (backends.h `lacks`, which must agree with the methods its KernelCaps
// declare) must be refused by name at make_orthogonalizer: a backend that runs it anyway fails.
#include <lapacke.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "conformance.h"
#include "backend/cpu/kernels/ns_methods.h"
#include "meshmuon/error.h"
#include "meshmuon/orthogonalize.h"
#include "meshmuon/update.h"
#include "test_method.h"

namespace meshmuon::conformance {
namespace {

using detail::Backend;

std::vector<double> singular_values(const std::vector<float>& x, int m, int n) {
  std::vector<double> a(x.begin(), x.end()), s(static_cast<size_t>(std::min(m, n))), superb(s.size() + 2);
  EXPECT_EQ(LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'N', 'N', m, n, a.data(), n, s.data(), nullptr, 1, nullptr, 1, superb.data()), 0);
  return s;
}

class Orthogonalize : public Conformance {
 protected:
  // True when the backend lacks o.method and refused it by name (the case ends there).
  bool refused(const NsOptions& o) {
    const std::string name(to_string(o.method));
    if (!spec().lacks.count(name)) return false;
    try {
      (void)be().make_orthogonalizer(o);
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << "the refusal names the method: " << e.what();
      RecordProperty("refused_" + name, GetParam());
      std::printf("[ conformance ] %s refuses method %s: %s\n", GetParam().c_str(), name.c_str(), e.what());
      return true;
    }
    ADD_FAILURE() << GetParam() << " lacks method " << name << " but make_orthogonalizer ran it: a lacked method "
                  << "must be refused by name at construction, never substituted";
    return true;
  }
  // got vs the cpu's want: bitwise on a backend with the cpu's products, else within its bound.
  void expect_matches_cpu(const std::vector<float>& got, const std::vector<float>& want, bool bf16, const std::string& what) {
    if (bitwise_products()) {
      EXPECT_BITWISE(got, want, what);
    } else {
      EXPECT_LE(relative_distance(got, want), bf16 ? spec().ns_bf16 : spec().ns_fp32) << what << ": distance to the cpu result";
    }
  }
  // muon_units on the backend and on the cpu; returns {backend result, cpu result}.
  std::pair<std::vector<float>, std::vector<float>> units(const NsOptions& o, const std::vector<float>& u, int64_t batch,
                                                          int m, int n, std::vector<float>* v, double beta2, DType comm,
                                                          std::vector<float>* v_got = nullptr) {
    const int64_t len = normuon_state_size(m, n);
    std::vector<float> want = u, vm(static_cast<size_t>(len));
    float* du = put(u);
    float* dv = v ? put(*v) : nullptr;
    float* dvm = put(vm);
    auto co = cpu().make_orthogonalizer(o);
    auto go = be().make_orthogonalizer(o);
    cpu().muon_units(*co, want.data(), batch, m, n, v ? v->data() : nullptr, vm.data(), beta2, comm);
    be().muon_units(*go, du, batch, m, n, dv, dvm, beta2, comm);
    if (v_got) *v_got = get(dv, v->size());
    return {get(du, u.size()), want};
  }
};

TEST_P(Orthogonalize, NewtonSchulzEveryMethod) {
  struct Case {
    int m, n;
    bool bf16;
    NsMethod method;
  };
  // 1100 and 1300 sides: the cuda backend's symmetric products in 2 block columns
  const Case cases[] = {{64, 256, false, NsMethod::Symmetric}, {256, 64, false, NsMethod::Plain},
                        {128, 128, false, NsMethod::Symmetric}, {96, 300, true, NsMethod::Symmetric},
                        {300, 96, true, NsMethod::Plain},        {1100, 1300, false, NsMethod::Symmetric},
                        {1300, 1100, true, NsMethod::Symmetric}, {1100, 2300, false, NsMethod::Gram},
                        {64, 256, false, NsMethod::Gram},        {256, 64, true, NsMethod::Symmetric}};
  int ran = 0;
  for (const Case& c : cases) {
    if (c.bf16 && !be().capabilities().bf16_products) continue;  // the backend declares it
    NsOptions o;
    o.schedule = Schedule::PolarExpress, o.steps = 5, o.method = c.method, o.scale = 1.02f;
    o.matmul_dtype = c.bf16 ? DType::BF16 : DType::F32;
    if (refused(o)) continue;
    // The large shapes exercise a device backend's 2-block symmetric products; where the products
    // are the cpu's they would compare the cpu kernel with itself (orthogonalize_test covers them).
    const int64_t numel = int64_t{c.m} * c.n, batch = 3;
    if (numel > 1000000 && bitwise_products()) continue;
    const std::vector<float> u = randn(static_cast<size_t>(batch * numel), 13);
    const auto [got, want] = units(o, u, batch, c.m, c.n, nullptr, 0.95, DType::F32);
    const std::string what = std::to_string(c.m) + "x" + std::to_string(c.n) + (c.bf16 ? " bf16 " : " fp32 ") +
                             std::string(to_string(c.method));
    expect_matches_cpu(got, want, c.bf16, what);
    for (int64_t e = 0; e < batch; ++e) {  // Polar Express: singular values in its band around 1
      const std::vector<float> xe(got.begin() + e * numel, got.begin() + (e + 1) * numel);
      const std::vector<float> ce(want.begin() + e * numel, want.begin() + (e + 1) * numel);
      const std::vector<double> sg = singular_values(xe, c.m, c.n), sc = singular_values(ce, c.m, c.n);
      const double bound = c.bf16 ? spec().sigma_bf16 : spec().sigma_fp32;
      for (size_t i = 0; i < sg.size(); ++i) EXPECT_LE(std::fabs(sg[i] - sc[i]), bound) << what << " sigma " << i;
      // a square Gaussian matrix has singular values near 0 that five steps cannot lift
      if (c.m != c.n) EXPECT_GT(*std::min_element(sg.begin(), sg.end()), 0.5) << what;
      EXPECT_LT(*std::max_element(sg.begin(), sg.end()), 1.5) << what;
    }
    ++ran;
  }
  EXPECT_GT(ran, 0);
}

// The suite's `lacks` list is the backend's own declaration (KernelCaps::ns_methods), not a second
// opinion: every method of the table is either declared or listed as lacked, never both.
TEST_P(Orthogonalize, LacksAgreesWithTheDeclaredMethods) {
  (void)test_method();
  const std::vector<NsMethod> declared = be().kernel_caps().ns_methods;
  for (NsMethod method : cpu::ns_methods()) {
    const std::string name(to_string(method));
    const bool has = std::find(declared.begin(), declared.end(), method) != declared.end();
    EXPECT_NE(has, spec().lacks.count(name) == 1) << GetParam() << ": method " << name << " declared " << has;
  }
}

// Every method of the method table (backend/cpu/kernels/ns_methods.h), the built-ins and the ones this binary
// registered, fp32 products, wide and tall, a batch of two: as the cpu's and in the SVD band, or
// refused by name where the backend lacks it. A method added to the table runs here unasked.
TEST_P(Orthogonalize, EveryRegisteredMethod) {
  (void)test_method();  // registered before the table is read
  const std::vector<NsMethod> methods = cpu::ns_methods();
  EXPECT_GE(methods.size(), 4u) << "the three built-ins and the test method";
  for (NsMethod method : methods)
    for (const auto& [m, n] : std::vector<std::pair<int, int>>{{48, 160}, {160, 48}}) {
      NsOptions o;
      o.schedule = Schedule::PolarExpress, o.steps = 5, o.scale = 1.02f, o.method = method;
      if (refused(o)) continue;
      const std::vector<float> u = randn(static_cast<size_t>(2 * m * n), 16);
      const auto [got, want] = units(o, u, 2, m, n, nullptr, 0.95, DType::F32);
      const std::string what = std::string(to_string(method)) + " " + std::to_string(m) + "x" + std::to_string(n);
      expect_matches_cpu(got, want, false, what);
      for (int e = 0; e < 2; ++e) {
        const std::vector<double> sv =
            singular_values(std::vector<float>(got.begin() + e * m * n, got.begin() + (e + 1) * m * n), m, n);
        EXPECT_GT(*std::min_element(sv.begin(), sv.end()), 0.5) << what;
        EXPECT_LT(*std::max_element(sv.begin(), sv.end()), 1.5) << what;
      }
    }
}

// NorMuon after the iteration and the bf16 comm rounding: the result is bf16 values, the state
// moved, both as the cpu's (bitwise, or within the bound: NorMuon's own kernel is bitwise on
// cuda, its input is not).
TEST_P(Orthogonalize, MuonUnitsWithNorMuonAndBf16Comm) {
  NsOptions o;
  const int m = 48, n = 160;
  const int64_t batch = 2, len = normuon_state_size(m, n);
  std::vector<float> v(static_cast<size_t>(batch * len), 0.5f), vg;
  const std::vector<float> v0 = v;
  const auto [got, want] = units(o, randn(static_cast<size_t>(batch * m * n), 14), batch, m, n, &v, 0.95, DType::BF16, &vg);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], bf16_to_float(float_to_bf16(got[i]))) << "not bf16 at " << i;
  if (bitwise_products()) {
    EXPECT_BITWISE(got, want, "update");
    EXPECT_BITWISE(vg, v, "NorMuon state");
  } else {
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-2 * std::max(1.0f, std::fabs(want[i]))) << i;
    for (size_t i = 0; i < vg.size(); ++i) ASSERT_NEAR(vg[i], v[i], 1e-3 * std::fabs(v[i]) + 1e-6) << i;
  }
  EXPECT_NE(first_difference(v, v0), -1) << "negative control: the NorMuon state moved";
}

// MuonEq and Muon+, each alone and both, NorMuon on and off, wide and tall, a batch of three: as the
// cpu's; Muon+ leaves each matrix's norm at sqrt(min(m, n)); each matrix of the batch has its bits
// alone. Negative control: the options change the result.
TEST_P(Orthogonalize, MuonEqAndMuonPlus) {
  for (const auto& [m, n] : std::vector<std::pair<int, int>>{{64, 200}, {200, 64}}) {
    const int64_t batch = 3, numel = int64_t{m} * n, len = normuon_state_size(m, n);
    std::vector<float> u = randn(static_cast<size_t>(batch * numel), 21);
    for (int64_t i = 0; i < n; ++i) u[static_cast<size_t>(i)] *= 50.0f;  // an uneven row: MuonEq matters
    std::vector<float> plain;
    for (const int which : {0, 1, 2, 3})
      for (const bool normuon : {true, false}) {
        NsOptions o;
        o.schedule = Schedule::PolarExpress, o.steps = 5, o.scale = 1.01f, o.eps = 1e-6f;
        o.muon_eq = which & 1, o.muon_plus = which & 2;
        const std::string what = std::to_string(m) + "x" + std::to_string(n) + " eq " + std::to_string(o.muon_eq) +
                                 " plus " + std::to_string(o.muon_plus) + (normuon ? " normuon" : "");
        std::vector<float> v(static_cast<size_t>(batch * len), 0.25f);
        const auto [got, want] = units(o, u, batch, m, n, normuon ? &v : nullptr, 0.9, DType::F32);
        expect_matches_cpu(got, want, false, what);
        if (o.muon_plus && !normuon)
          for (int64_t e = 0; e < batch; ++e) {
            double sq = 0;
            for (int64_t i = e * numel; i < (e + 1) * numel; ++i) sq += double(got[static_cast<size_t>(i)]) * got[static_cast<size_t>(i)];
            EXPECT_NEAR(std::sqrt(sq), std::sqrt(double(std::min(m, n))), 1e-4 * std::sqrt(double(std::min(m, n)))) << what;
          }
        auto go = be().make_orthogonalizer(o);
        for (int64_t e = 0; e < batch; ++e) {  // each matrix alone: the batch's bits
          const std::vector<float> one(u.begin() + e * numel, u.begin() + (e + 1) * numel);
          float* d1 = put(one);
          float* dv1 = put(std::vector<float>(static_cast<size_t>(len), 0.25f));
          float* dvm = put(std::vector<float>(static_cast<size_t>(len)));
          be().muon_units(*go, d1, 1, m, n, normuon ? dv1 : nullptr, dvm, 0.9, DType::F32);
          const std::vector<float> alone = get(d1, static_cast<size_t>(numel));
          EXPECT_EQ(std::memcmp(alone.data(), got.data() + e * numel, static_cast<size_t>(numel) * 4), 0) << what << ": matrix " << e;
        }
        if (which == 0 && normuon) plain = got;
        if (which != 0 && normuon) EXPECT_NE(first_difference(plain, got), -1) << what << ": no effect";
      }
  }
}

// muon_batch over units of one shape (two matrices, then one; NorMuon on): each matrix bitwise what
// muon_units gives it alone on the same backend (layout invariance), fp32 and bf16 products,
// symmetric and plain, wide and tall; and as the cpu's.
TEST_P(Orthogonalize, MuonBatchGivesEachMatrixItsOwnBits) {
  struct Case {
    int m, n;
    NsMethod method;
  };
  const Case cases[] = {{48, 160, NsMethod::Symmetric}, {130, 70, NsMethod::Plain}};
  for (const bool bf16 : {false, true}) {
    if (bf16 && !be().capabilities().bf16_products) continue;
    for (const Case& c : cases) {
      NsOptions o;
      o.matmul_dtype = bf16 ? DType::BF16 : DType::F32, o.method = c.method;
      auto orth = be().make_orthogonalizer(o);
      const int64_t numel = int64_t{c.m} * c.n, len = normuon_state_size(c.m, c.n);
      const std::vector<float> u = randn(static_cast<size_t>(3 * numel), 21 + c.m), v(static_cast<size_t>(3 * len), 0.25f);
      float *bu = put(u), *bv = put(v), *vm = put(std::vector<float>(static_cast<size_t>(len)));
      const Backend::UnitRef refs[] = {{bu, 2, bv}, {bu + 2 * numel, 1, bv + 2 * len}};
      be().muon_batch(*orth, refs, c.m, c.n, vm, 0.95, DType::BF16);
      float *au = put(u), *av = put(v);
      for (int64_t e = 0; e < 3; ++e) be().muon_units(*orth, au + e * numel, 1, c.m, c.n, av + e * len, vm, 0.95, DType::BF16);
      const std::string what = (bf16 ? "bf16 " : "fp32 ") + std::to_string(c.m) + "x" + std::to_string(c.n);
      const std::vector<float> batched = get(bu, u.size());
      EXPECT_BITWISE(get(au, u.size()), batched, what + " update");
      EXPECT_BITWISE(get(av, v.size()), get(bv, v.size()), what + " NorMuon state");
      std::vector<float> vc = v;
      const auto [got, want] = units(o, u, 3, c.m, c.n, &vc, 0.95, DType::BF16);
      EXPECT_BITWISE(got, batched, what + ": muon_units of the batch");
      if (bitwise_products()) EXPECT_BITWISE(batched, want, what + " vs the cpu");
      else for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(batched[i], want[i], 2e-2 * std::max(1.0f, std::fabs(want[i]))) << what << " " << i;
    }
  }
}

// Newton–Schulz keeps no state between calls: the same input twice gives the same bits; an
// all-zero matrix (one -0) gives +0 exactly, never NaN, with either eps mode.
TEST_P(Orthogonalize, DeterministicAndExactOnZeros) {
  for (const bool bf16 : {false, true}) {
    if (bf16 && !be().capabilities().bf16_products) continue;
    NsOptions o;
    o.matmul_dtype = bf16 ? DType::BF16 : DType::F32;
    auto go = be().make_orthogonalizer(o);
    const int m = 200, n = 520;
    const std::vector<float> u = randn(size_t{m} * n, 77);
    float *a = put(u), *b = put(u);
    be().muon_units(*go, a, 1, m, n, nullptr, nullptr, 0.95, DType::F32);
    be().muon_units(*go, b, 1, m, n, nullptr, nullptr, 0.95, DType::F32);
    const std::vector<float> ga = get(a, u.size());
    EXPECT_BITWISE(ga, get(b, u.size()), bf16 ? "bf16 run twice" : "fp32 run twice");
    EXPECT_NE(first_difference(ga, u), -1) << "negative control";
    for (const EpsMode mode : {EpsMode::Add, EpsMode::Clamp}) {
      NsOptions z = o;
      z.eps_mode = mode, z.eps = mode == EpsMode::Clamp ? 0.0f : 1e-7f;
      auto zo = be().make_orthogonalizer(z);
      std::vector<float> zeros(size_t{m} * n, 0.0f);
      zeros[5] = -0.0f;
      float* dz = put(zeros);
      be().muon_units(*zo, dz, 1, m, n, nullptr, nullptr, 0.95, DType::F32);
      EXPECT_BITWISE(get(dz, zeros.size()), std::vector<float>(zeros.size(), 0.0f), "all-zero input");
    }
  }
}

// gram_newton_schulz on `shards` slices of one matrix cut along its long dim, one thread (and one
// stream of the backend) per slice, the Gram matrices summed in slice order through host copies (a
// stand-in for the communicator); the whole result on the host.
std::vector<float> gram_ns_sharded(Backend& be, bool device, const NsOptions& o, const std::vector<float>& g, int m,
                                   int n, int shards) {
  const bool wide = m <= n;
  const int s = std::min(m, n), l = std::max(m, n);
  std::vector<std::vector<float>> slices(static_cast<size_t>(shards));
  std::vector<int> extent(static_cast<size_t>(shards));
  for (int r = 0; r < shards; ++r) {
    const int b = l * r / shards, e = l * (r + 1) / shards;
    extent[static_cast<size_t>(r)] = e - b;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j)
        if ((wide ? j : i) >= b && (wide ? j : i) < e) slices[static_cast<size_t>(r)].push_back(g[static_cast<size_t>(i) * n + j]);
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<float>> posted(static_cast<size_t>(shards));
  int arrived = 0, generation = 0;
  std::vector<float> total;
  auto reduce_of = [&](int r) {
    // runs inside the slice's stream job: the backend's copies there are ordered after its Gram product
    return [&, r](float* a, size_t count, int, DeviceEvent ready) {
      std::vector<float> mine(count);
      // read on another thread's stream, ordered after `ready` only (the backend's point after
      // which `a` is written), so a wrong `ready` shows as a wrong sum
      std::thread([&] {
        if (!ready.empty()) be.wait(ready);
        be.copy(mine.data(), a, count * 4);
      }).join();
      std::unique_lock<std::mutex> lock(mu);
      posted[static_cast<size_t>(r)] = std::move(mine);
      const int gen = generation;
      if (++arrived == shards) {
        total.assign(count, 0.0f);
        for (const auto& p : posted)
          for (size_t i = 0; i < count; ++i) total[i] += p[i];
        arrived = 0, ++generation;
        cv.notify_all();
      } else {
        cv.wait(lock, [&] { return generation != gen; });
      }
      be.copy(a, total.data(), count * 4);
    };
  };
  std::vector<std::vector<float>> out(static_cast<size_t>(shards));
  std::vector<std::thread> threads;
  for (int r = 0; r < shards; ++r)
    threads.emplace_back([&, r] {
      const int lm = wide ? m : extent[static_cast<size_t>(r)], ln = wide ? extent[static_cast<size_t>(r)] : n;
      std::vector<float>& x = slices[static_cast<size_t>(r)];
      const size_t bytes = x.size() * 4;
      detail::Buffer d = be.allocate(bytes, device ? detail::MemoryKind::Device : detail::MemoryKind::Host);
      be.copy(d.data(), x.data(), bytes);
      auto stream = be.make_stream(false);
      stream->submit([&] {
        be.gram_newton_schulz(o, d.as<float>(), lm, ln, wide, s, reduce_of(r), DType::F32);
        be.synchronize();
      });
      stream->synchronize();
      out[static_cast<size_t>(r)].resize(x.size());
      be.copy(out[static_cast<size_t>(r)].data(), d.data(), bytes);
    });
  for (auto& t : threads) t.join();
  std::vector<float> whole(static_cast<size_t>(m) * n);
  for (int r = 0, b = 0; r < shards; b += extent[static_cast<size_t>(r)], ++r) {
    size_t k = 0;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j)
        if ((wide ? j : i) >= b && (wide ? j : i) < b + extent[static_cast<size_t>(r)]) whole[static_cast<size_t>(i) * n + j] = out[static_cast<size_t>(r)][k++];
  }
  return whole;
}

TEST_P(Orthogonalize, GramNewtonSchulzOverShards) {
  ASSERT_TRUE(be().capabilities().gram_newton_schulz) << "every backend has the Gram NS kernel (the gram_allreduce strategy)";
  const bool device = be().capabilities().device_memory;
  NsOptions o;
  o.schedule = Schedule::PolarExpress, o.scale = 1.02f;
  for (const auto& [m, n] : std::vector<std::pair<int, int>>{{64, 256}, {256, 64}, {40, 41}})
    for (const int shards : {1, 3}) {
      const std::vector<float> g = randn(static_cast<size_t>(m) * n, 90 + m);
      const std::vector<float> want = gram_ns_sharded(cpu(), false, o, g, m, n, shards);
      const std::vector<float> got = gram_ns_sharded(be(), device, o, g, m, n, shards);
      const std::string what = std::to_string(m) + "x" + std::to_string(n) + " over " + std::to_string(shards) + " shards";
      expect_matches_cpu(got, want, false, what);
      // the harness: 3 slices agree with 1 on the cpu, and the result is not the input
      if (shards == 3) EXPECT_LE(relative_distance(want, gram_ns_sharded(cpu(), false, o, g, m, n, 1)), 1e-5) << what;
      EXPECT_GT(relative_distance(want, g), 0.1) << what << ": negative control";
    }
  const std::vector<float> zeros(64 * 100, 0.0f);
  EXPECT_BITWISE(gram_ns_sharded(be(), device, o, zeros, 64, 100, 2), zeros, "all-zero input");
}

// The test-only method through the method table: its name parses and prints, ns_flops prices it,
// bf16 products are refused with its own reason, and muon_units runs it: an orthogonalization (SVD
// band) by the test method's own function (counted), on every backend as on the cpu (or refused).
TEST_P(Orthogonalize, ATestOnlyMethodRunsThroughTheTable) {
  const NsMethod id = test_method();
  EXPECT_EQ(parse_ns_method(kTestMethodName), id);
  EXPECT_EQ(to_string(id), kTestMethodName);
  NsOptions o;
  o.schedule = Schedule::PolarExpress, o.steps = 5, o.scale = 1.02f, o.method = id;
  EXPECT_DOUBLE_EQ(ns_flops(64, 256, o), 5 * (4.0 * 64 * 64 * 256 + 2.0 * 64 * 64 * 64));
  NsOptions b = o;
  b.matmul_dtype = DType::BF16;
  try {
    Orthogonalizer refused_bf16(b);
    ADD_FAILURE() << "bf16 products accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("has no bf16 products"), std::string::npos) << e.what();
  }
  NsOptions unknown = o;
  unknown.method = static_cast<NsMethod>(1000);
  EXPECT_THROW(Orthogonalizer{unknown}, std::invalid_argument) << "an unregistered id is refused";
  if (refused(o)) return;
  const int m = 64, n = 256;
  const std::vector<float> u = randn(static_cast<size_t>(2 * m * n), 15);
  const auto [got, want] = units(o, u, 2, m, n, nullptr, 0.95, DType::F32);
  expect_matches_cpu(got, want, false, "test method");
  for (int e = 0; e < 2; ++e) {
    const std::vector<double> sv = singular_values(std::vector<float>(got.begin() + e * m * n, got.begin() + (e + 1) * m * n), m, n);
    EXPECT_GT(*std::min_element(sv.begin(), sv.end()), 0.5);
    EXPECT_LT(*std::max_element(sv.begin(), sv.end()), 1.5);
  }
  // The cpu's bits are the test method's own: each unit ran its function (counted; not inferred
  // from bits that differ from a built-in's, which two methods need not), and they are repeatable.
  const uint64_t before = test_method_runs();
  std::vector<float> again = u;
  auto to = cpu().make_orthogonalizer(o);
  cpu().muon_units(*to, again.data(), 2, m, n, nullptr, nullptr, 0.95, DType::F32);
  EXPECT_EQ(test_method_runs(), before + 2) << "the test method did not run for each unit";
  EXPECT_EQ(first_difference(again, want), -1);
  for (NsMethod builtin : {NsMethod::Plain, NsMethod::Symmetric, NsMethod::Gram}) {  // the same polar factor
    NsOptions k = o;
    k.method = builtin;
    std::vector<float> other = u;
    auto ko = cpu().make_orthogonalizer(k);
    const uint64_t ran = test_method_runs();
    cpu().muon_units(*ko, other.data(), 2, m, n, nullptr, nullptr, 0.95, DType::F32);
    EXPECT_EQ(test_method_runs(), ran) << to_string(builtin) << " ran the test method";
    EXPECT_LE(relative_distance(other, want), 1e-4) << "the same polar factor as " << to_string(builtin);
  }
}

INSTANTIATE_TEST_SUITE_P(Conformance, Orthogonalize, ::testing::ValuesIn(conformance_backend_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace meshmuon::conformance
