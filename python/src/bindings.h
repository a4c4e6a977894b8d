// Shared declarations of the `dmuon._core` binding files: one init_<area>(m) per file, called from
// module.cpp, and the DLPack -> TensorView conversion every binding uses.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>
#include <vector>

#include "dmuon/tensor.h"

namespace dmuon::python {

namespace nb = nanobind;

// Any CPU array that speaks DLPack (torch tensors, numpy arrays); no dtype or layout constraint, so
// nanobind never converts (copies): the engine validates dtype, shape and contiguity itself.
using Array = nb::ndarray<nb::device::cpu>;

// A view of `a` (fp32 or bf16, up to 4 dims, strides kept). Throws std::invalid_argument naming
// `what` for another dtype or more dims.
TensorView to_view(const Array& a, const char* what);
// to_view of every array (parameters or gradients of one step).
std::vector<TensorView> views(const std::vector<Array>& arrays, const char* what);
// Gradients of one step: None becomes the "no gradient" view (TensorView::is_none).
using Grad = std::optional<Array>;
std::vector<TensorView> grad_views(const std::vector<Grad>& grads);

// A torch tensor aliasing fp32 engine state `v`; `owner` (the optimizer object) is kept alive by it.
using StateTensor = nb::ndarray<nb::pytorch, float>;
StateTensor state_tensor(const TensorView& v, nb::handle owner);

void init_errors(nb::module_& m);
void init_blas(nb::module_& m);
void init_options(nb::module_& m);
void init_orthogonalize(nb::module_& m);
void init_local_optimizer(nb::module_& m);
void init_optimizer(nb::module_& m);

}  // namespace dmuon::python
