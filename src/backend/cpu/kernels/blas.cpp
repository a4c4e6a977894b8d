// Run-time BLAS loading. dlopen (rather than link-time) lets libmeshmuon set OPENBLAS_CORETYPE before
// OpenBLAS initializes, so C++, CLI and Python users all get the fast kernels without doing anything.
#include "backend/cpu/kernels/blas.h"
#include "backend/cpu/kernels/products.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cctype>
#include <string>

#include "core/cpu_features.h"
#include "core/dl_symbol.h"
#include "core/library_loader.h"
#include "meshmuon/blas.h"
#include "meshmuon/error.h"

namespace meshmuon::cpu {
namespace {

// Binds prefix + name (PyPI's scipy-openblas32 exports scipy_cblas_sgemm, scipy_openblas_...).
template <class F>
bool bind(void* handle, const char* prefix, const char* name, F& fn) {
  return detail::bind_symbol(handle, (std::string(prefix) + name).c_str(), fn);
}

BlasApi load() {
  detail::prepare_blas_environment();  // in case the load-time constructor did not run (static link)
  const char* user = std::getenv("MESHMUON_BLAS_LIBRARY");
  // Installed from a wheel: the scipy-openblas32 package beside meshmuon in site-packages comes first.
  const std::string& site = detail::install_location().site_packages;
  const std::string wheel = site.empty() ? std::string() : site + "/scipy_openblas32/lib/libscipy_openblas.so";
  const char* candidates[] = {user, wheel.c_str(), "libopenblas.so.0", "libopenblas.so", "libcblas.so.3"};
  static std::string kept;  // the candidate kept; outlives the api (blas() holds it for the process)
  BlasApi api;
  const detail::OpenedLibrary lib =
      detail::open_first_library(candidates, RTLD_NOW | RTLD_LOCAL, [&api](void* handle, const char*) {
        api = BlasApi{};
        for (const char* prefix : {"", "scipy_"}) {
          (void)bind(handle, prefix, "cblas_sgemm", api.sgemm);
          (void)bind(handle, prefix, "cblas_ssyrk", api.ssyrk);
          if (api.sgemm != nullptr && api.ssyrk != nullptr) {
            api.prefix = prefix;
            return std::string();
          }
        }
        return std::string("no cblas_sgemm/cblas_ssyrk (nor scipy_cblas_sgemm/scipy_cblas_ssyrk)");
      });
  if (lib.handle == nullptr)
    detail::throw_error(detail::concat("[blas] could not load a CBLAS library; tried ", lib.tried(),
                                       ". Install OpenBLAS (pip install scipy-openblas32, or apt-get install "
                                       "libopenblas0) or set MESHMUON_BLAS_LIBRARY to a library exporting cblas_sgemm"));
  kept = lib.name;
  api.library = kept.c_str();
  void* handle = lib.handle;
  (void)bind(handle, api.prefix, "cblas_ssymm", api.ssymm);
  (void)bind(handle, api.prefix, "openblas_set_num_threads", api.set_num_threads);
  (void)bind(handle, api.prefix, "openblas_get_num_threads", api.get_num_threads);
  (void)bind(handle, api.prefix, "openblas_get_corename", api.get_corename);
  (void)bind(handle, api.prefix, "openblas_get_config", api.get_config);
  (void)bind(handle, api.prefix, "LAPACKE_dsyevd", api.dsyevd);
  // meshmuon's products (products.h) split the work over threads themselves, in pieces that do not
  // depend on the thread count; OpenBLAS's own threads would split it differently per count.
  if (api.get_num_threads != nullptr && api.set_num_threads != nullptr) {
    api.default_threads = std::max(1, api.get_num_threads());
    api.set_num_threads(1);
  }
  return api;
}

}  // namespace

const BlasApi& blas() {
  static const BlasApi api = load();
  return api;
}

DsyevdFn lapacke_dsyevd() {
  static const DsyevdFn fn = [] {
    if (blas().dsyevd != nullptr) return blas().dsyevd;
    const char* candidates[] = {std::getenv("MESHMUON_LAPACKE_LIBRARY"), "liblapacke.so.3", "liblapacke.so"};
    DsyevdFn found = nullptr;
    const detail::OpenedLibrary lib =
        detail::open_first_library(candidates, RTLD_NOW | RTLD_LOCAL, [&found](void* h, const char*) {
          return detail::bind_symbol(h, "LAPACKE_dsyevd", found) ? std::string() : std::string("no LAPACKE_dsyevd");
        });
    if (lib.handle == nullptr)
      detail::throw_error(detail::concat("[blas] LAPACKE_dsyevd is in neither the BLAS (", blas().library,
                                         ") nor another library; tried ", lib.tried(),
                                         ". Install scipy-openblas32 (pip) or liblapacke (apt-get install liblapacke), "
                                         "or set MESHMUON_LAPACKE_LIBRARY"));
    return found;
  }();
  return fn;
}

}  // namespace meshmuon::cpu

namespace meshmuon {

BlasInfo blas_info() {
  const cpu::BlasApi& api = cpu::blas();
  BlasInfo info;
  info.library = api.library;
  if (api.get_corename) info.corename = api.get_corename();
  if (api.get_config) info.config = api.get_config();
  if (const char* env = std::getenv("OPENBLAS_CORETYPE")) info.coretype_env = env;
  info.recommended = detail::recommended_openblas_coretype();
  // OpenBLAS names its cores in lower case in get_corename ("skylakex").
  auto lower = [](std::string s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  info.coretype_ok = info.recommended.empty() || info.corename.empty() ||
                     lower(info.corename) == lower(info.recommended) ||
                     lower(info.corename) == "cooperlake" || lower(info.corename) == "sapphirerapids";
  info.threads = blas_get_num_threads();
  return info;
}

void blas_set_num_threads(int n) { cpu::set_product_threads(n); }

int blas_get_num_threads() { return cpu::product_threads(); }

}  // namespace meshmuon
