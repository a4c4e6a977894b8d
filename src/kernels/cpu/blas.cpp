// Run-time BLAS loading. dlopen (rather than link-time) lets libmeshmuon set OPENBLAS_CORETYPE before
// OpenBLAS initializes, so C++, CLI and Python users all get the fast kernels without doing anything.
#include "kernels/cpu/blas.h"
#include "kernels/cpu/products.h"

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

BlasApi load() {
  detail::prepare_blas_environment();  // in case the load-time constructor did not run (static link)
  const char* user = std::getenv("MESHMUON_BLAS_LIBRARY");
  const char* candidates[] = {user, "libopenblas.so.0", "libopenblas.so", "libcblas.so.3"};
  BlasApi api;
  const detail::OpenedLibrary lib =
      detail::open_first_library(candidates, RTLD_NOW | RTLD_LOCAL, [&api](void* handle, const char* name) {
        api = BlasApi{};
        (void)detail::bind_symbol(handle, "cblas_sgemm", api.sgemm);
        (void)detail::bind_symbol(handle, "cblas_ssyrk", api.ssyrk);
        if (api.sgemm == nullptr || api.ssyrk == nullptr) return std::string("no cblas_sgemm/cblas_ssyrk");
        api.library = name;  // the candidate itself: $MESHMUON_BLAS_LIBRARY or a literal, both outlive the api
        return std::string();
      });
  if (lib.handle == nullptr)
    detail::throw_error(detail::concat("[blas] could not load a CBLAS library; tried ", lib.tried(),
                                       ". Install OpenBLAS (apt-get install libopenblas0) or set "
                                       "MESHMUON_BLAS_LIBRARY to a library exporting cblas_sgemm"));
  void* handle = lib.handle;
  (void)detail::bind_symbol(handle, "cblas_ssymm", api.ssymm);
  (void)detail::bind_symbol(handle, "openblas_set_num_threads", api.set_num_threads);
  (void)detail::bind_symbol(handle, "openblas_get_num_threads", api.get_num_threads);
  (void)detail::bind_symbol(handle, "openblas_get_corename", api.get_corename);
  (void)detail::bind_symbol(handle, "openblas_get_config", api.get_config);
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
