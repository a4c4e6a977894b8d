// The choice between oneDNN's and meshmuon's widened bf16 products (bf16_products.h).
#include "backend/cpu/kernels/bf16_products.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "meshmuon/blas.h"
#include "meshmuon/error.h"
#include "meshmuon/orthogonalize.h"
#include "backend/cpu/kernels/bf16_matmul.h"
#include "backend/cpu/kernels/products.h"

namespace meshmuon::cpu {
namespace {

constexpr const char* kEnv = "MESHMUON_BF16_PRODUCTS";

Bf16Products widened(std::string reason, bool forced) {
  Bf16Products p;
  p.path = Bf16ProductPath::Widened;
  p.kind = "widened";
  std::string core;
  try {
    core = blas_info().corename;
  } catch (const std::exception&) {  // no BLAS: the products will say so when they run
  }
  p.kernel = core.empty() ? "fp32 GEMM on bf16-valued operands" : "OpenBLAS " + core + " SGEMM on bf16-valued operands";
  p.reason = std::move(reason);
  p.forced = forced;
  return p;
}

Bf16Products onednn(const Bf16MatmulInfo& info, std::string reason, bool forced) {
  Bf16Products p;
  p.path = Bf16ProductPath::OneDnn;
  p.kind = info.native ? "native" : "onednn_emulated";
  p.kernel = "oneDNN " + info.version + " " + info.kernel;
  p.reason = std::move(reason);
  p.forced = forced;
  return p;
}

// What the environment asks for; MESHMUON_BF16_PRODUCTS is read once.
Bf16Products choose(std::optional<Bf16ProductPath> forced_path) {
  const Bf16MatmulInfo info = bf16_matmul_info();
  std::string_view want = "auto";
  if (forced_path) {
    want = *forced_path == Bf16ProductPath::OneDnn ? "onednn" : "widened";
  } else if (const char* env = std::getenv(kEnv); env != nullptr && *env != '\0') {
    want = env;
  }
  const bool forced = want != "auto";
  if (want == "widened") return widened("forced by " + std::string(kEnv) + "=widened", true);
  if (want == "onednn") {
    if (info.available) return onednn(info, "forced by " + std::string(kEnv) + "=onednn", true);
    Bf16Products p = widened("", true);
    p.error = detail::concat(kEnv, "=onednn, but oneDNN cannot form bf16 products here: ", info.error,
                             "; unset it (meshmuon then widens the bf16 operands to fp32, same contract)");
    return p;
  }
  if (want != "auto") {
    Bf16Products p = widened("", forced);
    p.error = detail::concat("invalid ", kEnv, "='", want, "': use auto, onednn or widened");
    return p;
  }
  if (info.available && info.native)
    return onednn(info, "oneDNN runs bf16 products natively here (" + info.kernel + ")", false);
  if (info.available)
    return widened("oneDNN would emulate bf16 here (its kernel " + info.kernel +
                       " has no bf16 instructions): the fp32 GEMM on widened operands is faster",
                   false);
  return widened(info.error, false);
}

std::atomic<int> g_override{-1};  // -1: none; else a Bf16ProductPath
std::atomic<uint64_t> g_runs[2];   // per Bf16ProductPath

}  // namespace

Bf16Products bf16_products() {
  const int o = g_override.load();
  if (o >= 0) return choose(static_cast<Bf16ProductPath>(o));
  static const Bf16Products from_env = choose(std::nullopt);
  return from_env;
}

Bf16Products require_bf16_products(const char* who) {
  Bf16Products p = bf16_products();
  if (p.error.rfind("invalid ", 0) == 0) throw std::invalid_argument(detail::concat("[orth] ", who, ": ", p.error));
  MESHMUON_CHECK_RUNTIME(p.error.empty(), "[orth] ", who, ": ", p.error);
  return p;
}

void set_bf16_product_path_for_tests(std::optional<Bf16ProductPath> path) {
  g_override.store(path ? static_cast<int>(*path) : -1);
}

uint64_t bf16_product_runs(Bf16ProductPath path) { return g_runs[static_cast<int>(path)].load(); }
void note_bf16_product_run(Bf16ProductPath path) { g_runs[static_cast<int>(path)].fetch_add(1, std::memory_order_relaxed); }

}  // namespace meshmuon::cpu

namespace meshmuon {

Bf16ProductsInfo bf16_products_info() {
  const cpu::Bf16Products p = cpu::bf16_products();
  return {p.kind, p.kernel, p.reason, p.forced, p.error};
}

DType auto_matmul_dtype() {
  const cpu::Bf16Products p = cpu::bf16_products();
  return p.error.empty() && p.kind == "native" ? DType::BF16 : DType::F32;
}

Bf16Cost measure_bf16_cost(int size, int repeats) {
  MESHMUON_CHECK(size >= 1 && repeats >= 1, "[orth] measure_bf16_cost: size and repeats must be >= 1, got ", size,
              " and ", repeats);
  std::mt19937_64 rng(0);
  std::normal_distribution<float> normal;
  std::vector<float> x(size_t(size) * size), out(x.size());
  for (float& v : x) v = normal(rng);
  const auto cpu_seconds = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  };
  const cpu::ScopedProductThreads one(1);  // everything on this thread: its CPU time is the cost
  Bf16Cost cost;
  cost.size = size;
  for (DType dt : {DType::F32, DType::BF16}) {
    NsOptions o;
    o.method = NsMethod::Plain;
    o.matmul_dtype = dt;
    Orthogonalizer orth(o);
    orth.run(x.data(), out.data(), size, size);  // warm-up: loads the libraries, makes primitives
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const double t0 = cpu_seconds();
      orth.run(x.data(), out.data(), size, size);
      best = std::min(best, cpu_seconds() - t0);
    }
    (dt == DType::F32 ? cost.fp32_seconds : cost.bf16_seconds) = std::max(best, 1e-9);
  }
  cost.bf16_over_fp32 = cost.bf16_seconds / cost.fp32_seconds;
  return cost;
}

}  // namespace meshmuon
