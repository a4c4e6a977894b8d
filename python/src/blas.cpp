// BLAS introspection and threads: meshmuon.blas_info(), blas_set_num_threads(), blas_get_num_threads();
// the CPU's bf16 support: meshmuon.cpu_info().
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "core/cpu_features.h"
#include "meshmuon/blas.h"
#include "meshmuon/error.h"
#include "meshmuon/orthogonalize.h"
#include "backend/cpu/kernels/bf16_products.h"

namespace meshmuon::python {

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
      "The BLAS meshmuon computes with: library, corename, config, coretype_env, recommended, core_ok "
      "(False when OpenBLAS runs a slower core than recommended), threads. Loads it if needed.");
  m.def(
      "cpu_info",
      [] {
        const detail::CpuBf16 b = detail::cpu_bf16_support();
        const Bf16ProductsInfo p = bf16_products_info();
        nb::dict d;
        d["model"] = detail::cpu_model_name();
        d["avx512_bf16"] = b.avx512_bf16;
        d["amx_bf16"] = b.amx_bf16;
        d["bf16_native"] = p.error.empty() && p.kind == "native";
        d["bf16_products"] = p.kind;
        d["bf16_kernel"] = p.kernel;
        d["bf16_reason"] = p.reason;
        d["bf16_forced"] = p.forced;
        d["bf16_error"] = p.error;
        d["auto_matmul_dtype"] = std::string(to_string(auto_matmul_dtype()));
        return d;
      },
      "This CPU and its bf16 products: model, avx512_bf16, amx_bf16 (the hardware), bf16_native "
      "(bf16 products run on bf16 instructions), bf16_products ('native', 'widened': meshmuon's, at the "
      "fp32 rate, or 'onednn_emulated'), bf16_kernel, bf16_reason, bf16_forced "
      "(MESHMUON_BF16_PRODUCTS), bf16_error (non-empty: they cannot run), auto_matmul_dtype (what "
      "ns_matmul_dtype='auto' picks). As `meshmuon info`.");
  m.def(
      "measure_bf16_cost",
      [](int size, int repeats) {
        Bf16Cost c;
        {
          nb::gil_scoped_release release;
          c = measure_bf16_cost(size, repeats);
        }
        nb::dict d;
        d["size"] = c.size;
        d["fp32_seconds"] = c.fp32_seconds;
        d["bf16_seconds"] = c.bf16_seconds;
        d["bf16_over_fp32"] = c.bf16_over_fp32;
        return d;
      },
      nb::arg("size") = 192, nb::arg("repeats") = 3,
      "One size x size orthogonalization with fp32 and with bf16 products on one thread (its CPU "
      "time), best of `repeats`: a dict of size, fp32_seconds, bf16_seconds, bf16_over_fp32.");
  m.def(
      "_set_bf16_products_for_tests",
      [](const std::string& path) {
        if (path.empty() || path == "auto") return cpu::set_bf16_product_path_for_tests(std::nullopt);
        MESHMUON_CHECK(path == "onednn" || path == "widened", "[orth] path must be auto, onednn or widened, got '", path, "'");
        cpu::set_bf16_product_path_for_tests(path == "onednn" ? cpu::Bf16ProductPath::OneDnn
                                                              : cpu::Bf16ProductPath::Widened);
      },
      nb::arg("path"), "Tests: forces the bf16 products of Orthogonalizers made afterwards ('auto' undoes it).");
  m.def("blas_set_num_threads", &blas_set_num_threads, nb::arg("n"),
        "Sets the threads meshmuon's products use (each product is split into tiles whose shapes do not "
        "depend on the count, so results do not either; the BLAS runs one thread per tile).");
  m.def("blas_get_num_threads", &blas_get_num_threads);
}

}  // namespace meshmuon::python
