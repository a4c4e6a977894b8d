// Exceptions across the boundary: std::invalid_argument arrives as ValueError (nanobind's default),
// meshmuon::Error as meshmuon.MeshmuonError (a RuntimeError), both with the engine's message.
#include "bindings.h"
#include "meshmuon/error.h"

namespace meshmuon::python {


void init_errors(nb::module_& m) {
  nb::exception<meshmuon::Error>(m, "MeshmuonError", PyExc_RuntimeError);
}

}  // namespace meshmuon::python
