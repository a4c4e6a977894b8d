// BLAS introspection and threads: dmuon.blas_info(), blas_set_num_threads(), blas_get_num_threads();
// the CPU's bf16 support: dmuon.cpu_info().
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "core/cpu_features.h"
#include "dmuon/blas.h"

namespace dmuon::python {

void init_blas(nb::module_& m) {
  m.def(
      "blas_info",
      [] {
        const BlasInfo i = blas_info();
        nb::dict d;
        d["library"] = i.library;
        d["corename"] = i.corename;
        d["config"] = i.config;
        d["coretype_env"] = i.coretype_env;
        d["recommended"] = i.recommended;
        d["core_ok"] = i.coretype_ok;
        d["threads"] = i.threads;
        return d;
      },
      "The BLAS dmuon computes with: library, corename, config, coretype_env, recommended, core_ok "
      "(False when OpenBLAS runs a slower core than recommended), threads. Loads it if needed.");
  m.def(
      "cpu_info",
      [] {
        const detail::CpuBf16 b = detail::cpu_bf16_support();
        nb::dict d;
        d["model"] = detail::cpu_model_name();
        d["avx512_bf16"] = b.avx512_bf16;
        d["amx_bf16"] = b.amx_bf16;
        d["bf16_native"] = b.native;
        d["bf16_assumed_absent"] = b.assumed_absent;
        return d;
      },
      "This CPU: model, avx512_bf16, amx_bf16, bf16_native (bf16 products run natively; else oneDNN "
      "emulates them, slower than fp32), bf16_assumed_absent "
      "(DMUON_ASSUME_NO_NATIVE_BF16=1, for tests). As `dmuon info`.");
  m.def("blas_set_num_threads", &blas_set_num_threads, nb::arg("n"),
        "Sets the BLAS worker threads (OpenBLAS only).");
  m.def("blas_get_num_threads", &blas_get_num_threads);
}

}  // namespace dmuon::python
