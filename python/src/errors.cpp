// Exceptions across the boundary: std::invalid_argument arrives as ValueError (nanobind's default),
// dmuon::Error as dmuon.DmuonError (a RuntimeError), both with the engine's message.
#include "bindings.h"
#include "dmuon/error.h"

namespace dmuon::python {


void init_errors(nb::module_& m) {
  nb::exception<dmuon::Error>(m, "DmuonError", PyExc_RuntimeError);
}

}  // namespace dmuon::python
