// `meshmuon bench ns`: times one orthogonalization (median of --repeats after a warm-up) next to a plain
// SGEMM of the same sizes measured in the same run, and reports the result's singular values.
// Example: meshmuon bench ns --shape 1024x4096 --schedule polar_express --steps 5 --compare

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda/shared/cuda_bench.h"
#include "commands.h"
#include "meshmuon/bf16.h"
#include "meshmuon/blas.h"
#include "meshmuon/error.h"
#include "meshmuon/orthogonalize.h"
#include "backend/cpu/kernels/bf16_matmul.h"
#include "backend/cpu/kernels/blas.h"
#include "backend/cpu/kernels/ns_methods.h"
#include "backend/cpu/kernels/products.h"

namespace meshmuon::cli {
namespace {

struct BenchNsArgs {
  std::string shape = "1024x4096", schedule = "polar_express", method = "symmetric", matmul = "fp32";
  std::string device = "cpu";
  int steps = 5, repeats = 5, warmup = 1, threads = 0;
  int64_t batch = 1;
  float scale = 1.0f;
  bool json = false, compare = false;
};

struct Result {
  NsMethod method;
  DType matmul;
  std::vector<double> times;
  double seconds = 0, flops = 0, sigma_min = 0, sigma_max = 0, sigma_diff = 0;
  std::vector<double> sigmas;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

template <class F>
double time_once(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::pair<int64_t, int64_t> parse_shape(const std::string& s) {
  const size_t x = s.find('x');
  int64_t m = -1, n = -1;
  try {
    if (x != std::string::npos) m = std::stoll(s.substr(0, x)), n = std::stoll(s.substr(x + 1));
  } catch (const std::exception&) {
  }
  MESHMUON_CHECK(m > 0 && n > 0, "[bench] --shape must be MxN with positive sizes (e.g. 1024x4096), got '", s, "'");
  return {m, n};
}

// Singular values of x (m×n) from the eigenvalues of its small Gram matrix (SYRK in fp32, dsyevd in
// double), sorted descending.
std::vector<double> singular_values(const std::vector<float>& x, int64_t m, int64_t n) {
  const int s = static_cast<int>(std::min(m, n));
  std::vector<float> g(size_t(s) * s);
  cpu::ssyrk_lower(m > n, s, static_cast<int>(std::max(m, n)), 1.0f, x.data(), static_cast<int>(n), 0.0f,
                   g.data(), s);
  std::vector<double> gd(g.begin(), g.end()), w(static_cast<size_t>(s));
  const int info = cpu::lapacke_dsyevd()(cpu::kRowMajor, 'N', 'L', s, gd.data(), s, w.data());
  MESHMUON_CHECK_RUNTIME(info == 0, "[bench] LAPACKE_dsyevd failed with info=", info);
  std::vector<double> sv(w.size());
  for (size_t i = 0; i < w.size(); ++i) sv[i] = std::sqrt(std::max(0.0, w[w.size() - 1 - i]));
  return sv;
}

// --device cuda: the cuda backend's Newton–Schulz (--method plain: full GEMMs; symmetric: G and G² on
// their block triangle; gram is not a method of that backend and is refused by name) against cuBLAS GEMMs of the same
// sizes and operand dtype, timed in the same run (detail::time_ns_cuda). TFLOP/s count the flops
// the backend's products do (detail::cuda_ns_flops_done).
void run_bench_cuda(const BenchNsArgs& a, const NsOptions& base, const std::vector<DType>& dtypes,
                    const std::vector<float>& g, int64_t m, int64_t n) {
  const int64_t s = std::min(m, n), l = std::max(m, n);
  const double gemm_flops = 2.0 * double(s) * double(s) * double(l);
  const std::string shape = std::to_string(m) + "x" + std::to_string(n);
  nlohmann::json rows = nlohmann::json::array();
  std::string device;
  for (DType dt : dtypes) {
    NsOptions o = base;
    o.method = parse_ns_method(a.method);
    o.matmul_dtype = dt;
    const detail::CudaNsTiming t = detail::time_ns_cuda(o, g.data(), m, n, a.warmup, a.repeats, a.batch);
    device = t.device;
    const double sec = median(t.ns_seconds), flops = detail::cuda_ns_flops_done(m, n, o);
    nlohmann::json batched;
    if (a.batch > 1) {
      const double tb = median(t.batched_seconds), to = median(t.one_at_a_time_seconds);
      batched = {{"batch", a.batch}, {"batched_seconds", tb}, {"one_at_a_time_seconds", to},
                 {"batched_tflops", flops * double(a.batch) / tb / 1e12}, {"speedup", to / tb},
                 {"bitwise_equal", t.batch_bitwise}};
    }
    const double gemm_tflops = 2 * gemm_flops / (median(t.gram_gemm_seconds) + median(t.apply_gemm_seconds)) / 1e12;
    const std::vector<double> sv = singular_values(t.result, m, n);
    rows.push_back({{"matmul_dtype", std::string(to_string(dt))}, {"method", a.method}, {"seconds", sec}, {"times", t.ns_seconds},
                    {"flops", flops}, {"tflops", flops / sec / 1e12}, {"gemm_tflops", gemm_tflops},
                    {"gemm_nt_tflops", gemm_flops / median(t.gram_gemm_seconds) / 1e12},
                    {"gemm_nn_tflops", gemm_flops / median(t.apply_gemm_seconds) / 1e12},
                    {"efficiency_vs_gemm", flops / sec / 1e12 / gemm_tflops},
                    {"sigma_min", sv.back()}, {"sigma_max", sv.front()}, {"batched", batched}});
  }
  if (a.json) {
    std::cout << nlohmann::json({{"device", "cuda"}, {"gpu", device}, {"shape", shape}, {"schedule", a.schedule},
                                 {"steps", a.steps}, {"repeats", a.repeats}, {"results", rows}})
                     .dump(2)
              << "\n";
    return;
  }
  std::printf("meshmuon bench ns --device cuda: %s, %s, %s, %d steps, method %s, median of %d after %d warm-up\n",
              device.c_str(), shape.c_str(), a.schedule.c_str(), a.steps, a.method.c_str(), a.repeats, a.warmup);
  std::printf("%-6s %10s %8s %9s %15s %13s %10s %10s\n", "dtype", "ms", "TFLOP", "TFLOP/s", "cuBLAS TFLOP/s",
              "vs cuBLAS", "sigma_min", "sigma_max");
  for (const auto& r : rows)
    std::printf("%-6s %10.3f %8.3f %9.1f %15.1f %12.2fx %10.4f %10.4f\n",
                r["matmul_dtype"].get<std::string>().c_str(), r["seconds"].get<double>() * 1e3,
                r["flops"].get<double>() / 1e12, r["tflops"].get<double>(), r["gemm_tflops"].get<double>(),
                r["efficiency_vs_gemm"].get<double>(), r["sigma_min"].get<double>(), r["sigma_max"].get<double>());
  for (const auto& r : rows)
    if (!r["batched"].is_null()) {
      const auto& b = r["batched"];
      std::printf("%-6s batch %lld: one call %.3f ms (%.1f TFLOP/s), one matrix at a time %.3f ms: %.2fx; bitwise equal: %s\n",
                  r["matmul_dtype"].get<std::string>().c_str(), static_cast<long long>(b["batch"].get<int64_t>()),
                  b["batched_seconds"].get<double>() * 1e3, b["batched_tflops"].get<double>(),
                  b["one_at_a_time_seconds"].get<double>() * 1e3, b["speedup"].get<double>(),
                  b["bitwise_equal"].get<bool>() ? "yes" : "NO");
    }
  std::printf("cuBLAS = the step's two GEMM shapes (%lldx%lldx%lld NT, %lldx%lldx%lld NN) in the same dtype, same run\n",
              static_cast<long long>(s), static_cast<long long>(s), static_cast<long long>(l),
              static_cast<long long>(s), static_cast<long long>(l), static_cast<long long>(s));
}

void run_bench(const BenchNsArgs& a) {
  const auto [m, n] = parse_shape(a.shape);
  MESHMUON_CHECK(a.repeats >= 1, "[bench] --repeats must be >= 1, got ", a.repeats);
  MESHMUON_CHECK(a.warmup >= 0, "[bench] --warmup must be >= 0, got ", a.warmup);
  MESHMUON_CHECK(a.batch >= 1, "[bench] --batch must be >= 1, got ", a.batch);
  MESHMUON_CHECK(a.batch == 1 || a.device == "cuda", "[bench] --batch times the cuda backend's batched products; add --device cuda");
  if (a.threads > 0) blas_set_num_threads(a.threads);
  NsOptions base;
  base.schedule = parse_schedule(a.schedule);
  MESHMUON_CHECK(base.schedule != Schedule::Custom, "[bench] --schedule custom needs coefficients; use jordan, you or polar_express");
  base.steps = a.steps;
  base.scale = a.scale;
  std::vector<NsMethod> methods;
  if (a.compare)
    methods = cpu::ns_methods();  // every method of the table (backend/cpu/kernels/ns_methods.h)
  else
    methods = {parse_ns_method(a.method)};
  std::vector<DType> dtypes;
  if (a.matmul == "fp32" || a.matmul == "both") dtypes.push_back(DType::F32);
  if (a.matmul == "bf16" || a.matmul == "both") dtypes.push_back(DType::BF16);
  MESHMUON_CHECK(!dtypes.empty(), "[bench] --matmul-dtype must be fp32, bf16 or both, got '", a.matmul, "'");

  std::mt19937_64 rng(12345);
  std::normal_distribution<float> normal;
  std::vector<float> g(size_t(m * n));
  for (float& v : g) v = normal(rng);
  MESHMUON_CHECK(a.device == "cpu" || a.device == "cuda", "[bench] --device must be cpu or cuda, got '", a.device, "'");
  MESHMUON_CHECK(!(a.compare && a.device == "cuda"),
              "[bench] --compare runs the cpu methods only; with --device cuda pick one with --method");
  if (a.device == "cuda") return run_bench_cuda(a, base, dtypes, g, m, n);
  std::vector<float> out(g.size());

  std::vector<Orthogonalizer> orths;
  std::vector<Result> results;
  for (DType dt : dtypes)
    for (NsMethod meth : methods) {
      if (a.compare && dt == DType::BF16 && !cpu::ns_method_spec(meth).bf16_refusal.empty()) continue;  // refused, see NsOptions
      NsOptions o = base;
      o.method = meth;
      o.matmul_dtype = dt;
      orths.emplace_back(o);
      results.push_back({meth, dt, {}, 0, ns_flops(m, n, o)});
    }
  // SGEMM baseline of the sizes involved: s×l·l×s (the Gram matrix) and s×s·s×l (the update), by
  // the BLAS's own threaded driver on the same thread count (the best a caller of the BLAS gets;
  // meshmuon's products run it on one thread per tile), and by meshmuon's tiled products.
  const int s = static_cast<int>(std::min(m, n)), l = static_cast<int>(std::max(m, n));
  std::vector<float> gs(size_t(s) * s, 0.01f), ys(size_t(s) * l);
  const cpu::BlasApi& blas = cpu::blas();
  const int threads = cpu::product_threads();
  const auto threaded = [&](auto&& f) {
    if (blas.set_num_threads) blas.set_num_threads(threads);
    f();
    if (blas.set_num_threads) blas.set_num_threads(1);
  };
  auto sgemm_gram = [&] {
    threaded([&] { blas.sgemm(cpu::kRowMajor, cpu::kNoTrans, cpu::kTrans, s, s, l, 1.0f, g.data(), l, g.data(), l, 0.0f, gs.data(), s); });
  };
  auto sgemm_apply = [&] {
    threaded([&] { blas.sgemm(cpu::kRowMajor, cpu::kNoTrans, cpu::kNoTrans, s, l, s, 1.0f, gs.data(), s, g.data(), l, 0.0f, ys.data(), l); });
  };
  auto tiled_gram = [&] { cpu::sgemm(false, true, s, s, l, 1.0f, g.data(), l, g.data(), l, 0.0f, gs.data(), s); };
  auto tiled_apply = [&] { cpu::sgemm(false, false, s, l, s, 1.0f, gs.data(), s, g.data(), l, 0.0f, ys.data(), l); };
  const double gemm_flops = 2.0 * s * s * double(l);
  std::vector<double> gram_times, apply_times, tiled_times;
  // bf16 GEMM baseline, when bf16 products are timed: oneDNN's plain bf16 matmul (the library the
  // bf16 products run on) on the same pair, the same thread count, the plain path's output types
  // (X·Xᵀ to fp32, Z·X rounded to bf16).
  std::unique_ptr<cpu::Bf16Matmul> bmm;
  std::string bf16_kernel;
  if (std::find(dtypes.begin(), dtypes.end(), DType::BF16) != dtypes.end() && cpu::bf16_matmul_info().available) {
    bmm = std::make_unique<cpu::Bf16Matmul>();
    bf16_kernel = "oneDNN " + cpu::bf16_matmul_info().version + " " + cpu::bf16_matmul_info().kernel;
  }
  std::vector<BFloat16> gb(g.size()), gsb(gs.size(), float_to_bf16(0.01f)), ysb(ys.size());
  if (bmm)
    for (size_t i = 0; i < g.size(); ++i) gb[i] = float_to_bf16(g[i]);
  const auto bf16_threaded = [&](auto&& f) {
    const int previous = bmm->set_threads(threads);
    f();
    bmm->set_threads(previous);
  };
  auto bf16_gram = [&] {
    bf16_threaded([&] { bmm->gemm(s, s, l, {gb.data(), l, false}, {gb.data(), l, true}, gs.data(), s); });
  };
  auto bf16_apply = [&] {
    bf16_threaded([&] { bmm->gemm(s, l, s, {gsb.data(), s, false}, {gb.data(), l, false}, ysb.data(), l); });
  };
  std::vector<double> bf16_gram_times, bf16_apply_times;

  // Round-robin over methods and the baseline so that machine noise hits all of them alike.
  for (int r = 0; r < a.warmup + a.repeats; ++r) {
    for (size_t i = 0; i < orths.size(); ++i) {
      const double t = time_once([&] { orths[i].run(g.data(), out.data(), m, n); });
      if (r >= a.warmup) results[i].times.push_back(t);
    }
    if (bmm && r >= a.warmup) {  // before the BLAS, whose workers spin after its calls
      bf16_gram_times.push_back(time_once(bf16_gram));
      bf16_apply_times.push_back(time_once(bf16_apply));
    } else if (bmm) {  // warm-up: primitives created, caches warm
      bf16_gram(), bf16_apply();
    }
    const double tt = time_once(tiled_gram) + time_once(tiled_apply);
    const double tg = time_once(sgemm_gram), ta = time_once(sgemm_apply);
    // OpenBLAS's workers spin for a while after a threaded call (2^28 cycles by default): let them
    // sleep before the next round, or they would take cores from the next method timed.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (r >= a.warmup) gram_times.push_back(tg), apply_times.push_back(ta), tiled_times.push_back(tt);
  }
  // The baseline is the pair (X·Xᵀ as NT, Z·X as NN) the plain path runs; both rates are reported.
  const double sgemm_gflops = 2 * gemm_flops / (median(gram_times) + median(apply_times)) / 1e9;
  const double sgemm_nt_gflops = gemm_flops / median(gram_times) / 1e9;
  const double sgemm_nn_gflops = gemm_flops / median(apply_times) / 1e9;
  const double tiled_gflops = 2 * gemm_flops / median(tiled_times) / 1e9;
  const double bf16_gflops = bmm ? 2 * gemm_flops / (median(bf16_gram_times) + median(bf16_apply_times)) / 1e9 : 0;
  const double bf16_nt_gflops = bmm ? gemm_flops / median(bf16_gram_times) / 1e9 : 0;
  const double bf16_nn_gflops = bmm ? gemm_flops / median(bf16_apply_times) / 1e9 : 0;
  for (size_t i = 0; i < orths.size(); ++i) {
    Result& res = results[i];
    res.seconds = median(res.times);
    orths[i].run(g.data(), out.data(), m, n);
    res.sigmas = singular_values(out, m, n);
    res.sigma_max = res.sigmas.front();
    res.sigma_min = res.sigmas.back();
  }
  const Result* sym = nullptr;
  for (const Result& r : results)
    if (r.method == NsMethod::Symmetric && r.matmul == DType::F32) sym = &r;
  for (Result& r : results)
    if (sym)
      for (size_t k = 0; k < r.sigmas.size(); ++k)
        r.sigma_diff = std::max(r.sigma_diff, std::fabs(r.sigmas[k] - sym->sigmas[k]));

  const BlasInfo info = blas_info();
  const std::string shape = std::to_string(m) + "x" + std::to_string(n);
  auto to_json = [&](const Result& r) {
    nlohmann::json j = {{"method", std::string(to_string(r.method))},
                        {"matmul_dtype", std::string(to_string(r.matmul))}, {"seconds", r.seconds},
                        {"times", r.times}, {"flops", r.flops}, {"gflops", r.flops / r.seconds / 1e9},
                        {"sgemm_gflops", sgemm_gflops}, {"sgemm_nt_gflops", sgemm_nt_gflops},
                        {"sgemm_nn_gflops", sgemm_nn_gflops}, {"meshmuon_sgemm_gflops", tiled_gflops},
                        {"efficiency_vs_sgemm", r.flops / r.seconds / 1e9 / sgemm_gflops},
                        {"bf16_gemm_gflops", bmm ? nlohmann::json(bf16_gflops) : nlohmann::json()},
                        {"efficiency_vs_bf16_gemm",
                         bmm ? nlohmann::json(r.flops / r.seconds / 1e9 / bf16_gflops) : nlohmann::json()},
                        {"sigma_min", r.sigma_min}, {"sigma_max", r.sigma_max},
                        {"threads", info.threads}, {"shape", shape}, {"schedule", a.schedule},
                        {"steps", a.steps}, {"repeats", a.repeats}, {"blas_core", info.corename}};
    if (r.method == NsMethod::Gram && l < 2 * s) j["note"] = "aspect ratio < 2: ran the symmetric path";
    if (sym && &r != sym) j["sigma_maxdiff_vs_symmetric"] = r.sigma_diff;
    return j;
  };
  if (a.json) {
    if (results.size() == 1) {
      std::cout << to_json(results[0]).dump(2) << "\n";
    } else {
      nlohmann::json j = {{"shape", shape}, {"schedule", a.schedule}, {"steps", a.steps},
                          {"threads", info.threads}, {"sgemm_gflops", sgemm_gflops},
                          {"sgemm_nt_gflops", sgemm_nt_gflops}, {"sgemm_nn_gflops", sgemm_nn_gflops},
                          {"meshmuon_sgemm_gflops", tiled_gflops}, {"blas_core", info.corename},
                          {"methods", nlohmann::json::array()}};
      if (bmm)
        j["bf16_gemm"] = {{"gflops", bf16_gflops}, {"nt_gflops", bf16_nt_gflops},
                          {"nn_gflops", bf16_nn_gflops}, {"kernel", bf16_kernel}};
      for (const Result& r : results) j["methods"].push_back(to_json(r));
      std::cout << j.dump(2) << "\n";
    }
    return;
  }
  std::printf("meshmuon bench ns: %s, %s, %d steps, %d threads (BLAS core %s), median of %d after %d warm-up\n",
              shape.c_str(), a.schedule.c_str(), a.steps, info.threads, info.corename.c_str(), a.repeats,
              a.warmup);
  std::printf("SGEMM baseline (the BLAS's own threads): %.1f GFLOP/s (X·Xᵀ %dx%dx%d NT %.1f, Z·X %dx%dx%d NN %.1f); "
              "meshmuon's tiled products on the same pair: %.1f (%.2fx)\n",
              sgemm_gflops, s, s, l, sgemm_nt_gflops, s, l, s, sgemm_nn_gflops, tiled_gflops, tiled_gflops / sgemm_gflops);
  if (bmm)
    std::printf("bf16 GEMM baseline (%s, %d threads): %.1f GFLOP/s (X·Xᵀ NT to fp32 %.1f, Z·X NN to bf16 %.1f), "
                "%.2fx SGEMM\n",
                bf16_kernel.c_str(), threads, bf16_gflops, bf16_nt_gflops, bf16_nn_gflops, bf16_gflops / sgemm_gflops);
  std::printf("%-15s %10s %8s %8s %9s %9s %10s %10s %10s %10s\n", "method", "ms", "GFLOP", "GFLOP/s",
              "vs SGEMM", "vs bf16", "vs plain", "sigma_min", "sigma_max", "dsigma/sym");
  const double plain_t = results[0].method == NsMethod::Plain ? results[0].seconds : 0;
  for (const Result& r : results) {
    const double gf = r.flops / r.seconds / 1e9;
    const std::string label = std::string(to_string(r.method)) + (r.matmul == DType::BF16 ? " bf16" : "");
    std::printf("%-15s %10.3f %8.2f %8.1f %8.2fx ", label.c_str(), r.seconds * 1e3,
                r.flops / 1e9, gf, gf / sgemm_gflops);
    if (bmm) std::printf("%8.2fx ", gf / bf16_gflops); else std::printf("%9s ", "-");
    if (plain_t > 0) std::printf("%9.2fx ", plain_t / r.seconds); else std::printf("%10s ", "-");
    std::printf("%10.4f %10.4f ", r.sigma_min, r.sigma_max);
    if (sym && &r != sym) std::printf("%10.1e\n", r.sigma_diff); else std::printf("%10s\n", "-");
  }
  if (a.compare || results.size() > 1)
    std::printf("vs bf16 = rate over the bf16 GEMM baseline; vs plain = speed-up over plain fp32 (time ratio); dsigma/sym = max |sigma_i - sigma_i(symmetric fp32)|\n");
  if (l < 2 * s && std::find(methods.begin(), methods.end(), NsMethod::Gram) != methods.end())
    std::printf("note: gram needs aspect ratio >= 2; it ran the symmetric path here\n");
}

}  // namespace

void add_bench_ns_command(CLI::App& bench) {
  auto args = std::make_shared<BenchNsArgs>();
  auto* cmd = bench.add_subcommand("ns", "Time Newton–Schulz orthogonalization against SGEMM in the same run");
  cmd->add_option("--shape", args->shape, "Matrix shape MxN")->capture_default_str();
  cmd->add_option("--schedule", args->schedule, "jordan | you | polar_express")->capture_default_str();
  cmd->add_option("--steps", args->steps, "Newton–Schulz steps")->capture_default_str();
  cmd->add_option("--method", args->method, cpu::ns_method_names())->capture_default_str();
  cmd->add_option("--repeats", args->repeats, "Timed runs (the median is reported)")->capture_default_str();
  cmd->add_option("--warmup", args->warmup, "Untimed warm-up runs")->capture_default_str();
  cmd->add_option("--threads", args->threads, "BLAS threads (0: leave as is)")->capture_default_str();
  cmd->add_option("--scale", args->scale, "Normalization s in |G|_F*s")->capture_default_str();
  cmd->add_option("--batch", args->batch,
                  "--device cuda: also time this many copies in one call (batched products) against one at a time")
      ->capture_default_str();
  cmd->add_option("--matmul-dtype", args->matmul,
                  "Product operands: fp32 | bf16 (oneDNN) | both (each method in each dtype)")
      ->capture_default_str();
  cmd->add_option("--device", args->device,
                  "cpu | cuda (the cuda backend on device 0, next to cuBLAS GEMMs of the same dtype; "
                  "--method gram is refused there: the cuda backend implements plain and symmetric; --compare is cpu only)")
      ->capture_default_str();
  cmd->add_flag("--compare", args->compare, "Run plain, symmetric and gram in one run and compare");
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->callback([args] { run_bench(*args); });
}

}  // namespace meshmuon::cli
