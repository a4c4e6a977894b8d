// The `meshmuon._core` extension module: the native engine behind the `meshmuon` Python package.
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.h"
#include "meshmuon/version.h"

NB_MODULE(_core, m) {
  using namespace meshmuon::python;
  m.doc() = "meshmuon native engine (nanobind bindings); use the `meshmuon` and `meshmuon.torch` packages";
  m.attr("__version__") = std::string(meshmuon::kVersion);
  init_errors(m);
  init_blas(m);
  init_options(m);
  init_orthogonalize(m);
  init_local_optimizer(m);
  init_optimizer(m);
  init_comm(m);  // after init_optimizer: adds methods to its Communicator class
  init_sharded_params(m);
}
