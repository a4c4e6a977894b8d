// Exceptions across the boundary: std::invalid_argument arrives as ValueError (nanobind's default),
// dmuon::Error as dmuon.DmuonError (a RuntimeError), both with the engine's message; and the
// DLPack -> TensorView conversion, whose failures are caller mistakes too.
#include <string>

#include "bindings.h"
#include "dmuon/error.h"

namespace dmuon::python {

TensorView to_view(const Array& a, const char* what) {
  DType dtype;
  const nb::dlpack::dtype dt = a.dtype();
  if (dt == nb::dtype<float>()) {
    dtype = DType::F32;
  } else if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16 &&
             dt.lanes == 1) {
    dtype = DType::BF16;
  } else {
    detail::throw_invalid_argument(detail::concat("[python] ", what, ": dtype code ", int(dt.code),
                                                  " with ", int(dt.bits),
                                                  " bits is not supported; use float32 or bfloat16"));
  }
  DMUON_CHECK(a.ndim() <= static_cast<size_t>(kMaxDims), "[python] ", what, " has ", a.ndim(),
              " dims; at most ", kMaxDims, " are supported");
  Shape shape, strides;
  int64_t dims[kMaxDims], steps[kMaxDims];
  for (size_t i = 0; i < a.ndim(); ++i) {
    dims[i] = static_cast<int64_t>(a.shape(i));
    steps[i] = a.stride(i);
  }
  shape = Shape(std::span<const int64_t>(dims, a.ndim()));
  strides = Shape(std::span<const int64_t>(steps, a.ndim()));
  return TensorView(const_cast<void*>(a.data()), dtype, shape, strides);
}

void init_errors(nb::module_& m) {
  nb::exception<dmuon::Error>(m, "DmuonError", PyExc_RuntimeError);
}

}  // namespace dmuon::python
