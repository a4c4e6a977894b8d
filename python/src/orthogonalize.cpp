// meshmuon.Orthogonalizer: Newton–Schulz on fp32 arrays in place or out of place, GIL released.
#include "bindings.h"
#include "meshmuon/orthogonalize.h"

namespace meshmuon::python {

void init_orthogonalize(nb::module_& m) {
  nb::class_<Orthogonalizer>(m, "Orthogonalizer",
                             "Orthogonalizes fp32 [m, n] matrices or [B, m, n] stacks "
                             "(meshmuon/orthogonalize.h). Not thread-safe: one per thread.")
      .def(nb::init<NsOptions>(), nb::arg("options"))
      .def_prop_ro("options", &Orthogonalizer::options)
      .def(
          "run",
          [](Orthogonalizer& o, const Array& in, const Array& out) {
            const TensorView vi = to_cpu_view(in, "in"), vo = to_cpu_view(out, "out");
            nb::gil_scoped_release release;
            o.run(vi, vo);
          },
          nb::arg("input"), nb::arg("out"),
          "out <- orthogonalize(input); `out` may be `input` (in place). Zero-copy.");
  m.def("ns_flops", &ns_flops, nb::arg("m"), nb::arg("n"), nb::arg("options"),
        "Floating-point operations of one orthogonalization of an m x n matrix.");
}

}  // namespace meshmuon::python
