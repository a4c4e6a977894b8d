// BLAS introspection and threads: dmuon.blas_info(), blas_set_num_threads(), blas_get_num_threads().
#include <nanobind/stl/string.h>

#include "bindings.h"
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
  m.def("blas_set_num_threads", &blas_set_num_threads, nb::arg("n"),
        "Sets the BLAS worker threads (OpenBLAS only).");
  m.def("blas_get_num_threads", &blas_get_num_threads);
}

}  // namespace dmuon::python
