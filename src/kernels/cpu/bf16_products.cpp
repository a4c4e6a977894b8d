// The choice between oneDNN's and dmuon's widened bf16 products (bf16_products.h).
#include "kernels/cpu/bf16_products.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string_view>

#include "dmuon/blas.h"
#include "dmuon/error.h"
#include "kernels/cpu/bf16_matmul.h"

namespace dmuon::cpu {
namespace {

constexpr const char* kEnv = "DMUON_BF16_PRODUCTS";

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

// What the environment asks for; DMUON_BF16_PRODUCTS is read once.
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
                             "; unset it (dmuon then widens the bf16 operands to fp32, same contract)");
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
    return widened("oneDNN would emulate bf16 here (" + info.kernel +
                       ", no avx512_bf16 / amx_bf16): the fp32 GEMM on widened operands is faster",
                   false);
  return widened(info.error, false);
}

std::atomic<int> g_override{-1};  // -1: none; else a Bf16ProductPath

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
  DMUON_CHECK_RUNTIME(p.error.empty(), "[orth] ", who, ": ", p.error);
  return p;
}

void set_bf16_product_path_for_tests(std::optional<Bf16ProductPath> path) {
  g_override.store(path ? static_cast<int>(*path) : -1);
}

}  // namespace dmuon::cpu
