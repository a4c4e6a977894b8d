// Shared declarations of the `meshmuon._core` binding files: one init_<area>(m) per file, called from
// module.cpp, the DLPack -> TensorView conversion every binding uses, and the methods both engines
// (LocalOptimizer, Optimizer) bind alike.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "meshmuon/tensor.h"

namespace meshmuon {
struct StepStats;         // optimizer.h
struct OptimizerOptions;  // optimizer.h
}

namespace meshmuon::python {

namespace nb = nanobind;

// Any array that speaks DLPack (torch tensors, numpy arrays) on the CPU or a CUDA device; no dtype,
// layout or device constraint, so nanobind never converts (copies): the engine validates dtype,
// shape, contiguity and device itself (a view on another device than the engine's is its error,
// naming the parameter).
using Array = nb::ndarray<>;

// A view of `a` (fp32 or bf16, up to 4 dims, strides kept) carrying its device: DLPack's CPU and
// CUDA-host (pinned) memory are the CPU, kDLCUDA is cuda:<device_id>. Throws std::invalid_argument
// naming `what` for another dtype, more dims or another device type (managed memory, ROCm, ...).
TensorView to_view(const Array& a, const char* what);
// to_view of an array that must be CPU memory (the host-only entry points: Orthogonalizer, ...).
TensorView to_cpu_view(const Array& a, const char* what);
// to_view of every array (parameters or gradients of one step).
std::vector<TensorView> views(const std::vector<Array>& arrays, const char* what);
// Gradients of one step: None becomes the "no gradient" view (TensorView::is_none).
using Grad = std::optional<Array>;
std::vector<TensorView> grad_views(const std::vector<Grad>& grads);

// A torch tensor aliasing fp32 engine memory `v` on v's device (a CUDA tensor for device state);
// `owner` (the optimizer object) is kept alive by it.
using StateTensor = nb::ndarray<nb::pytorch, float>;
StateTensor state_tensor(const TensorView& v, nb::handle owner);

// The methods LocalOptimizer and Optimizer share: step (views taken with the GIL held, the step
// itself without it), state (tensors aliasing the engine's memory; they keep the engine alive),
// state_keys, step_count, set_step_count and options (live GroupOptions). The docs name what
// differs: whole parameters or local shards, collective or not.
template <class Engine>
void bind_engine_methods(nb::class_<Engine>& cls, const char* step_doc, const char* state_doc) {
  using Logits = std::map<int, std::vector<float>>;
  cls.def(
         "step",
         [](Engine& e, const std::vector<Array>& params, const std::vector<Grad>& grads, const Logits& qk_logits) {
           const std::vector<TensorView> p = views(params, "parameter");
           const std::vector<TensorView> g = grad_views(grads);
           nb::gil_scoped_release release;
           return e.step(p, g, qk_logits);
         },
         nb::arg("params"), nb::arg("grads"), nb::arg("qk_logits") = Logits{}, step_doc)
      .def(
          "state",
          [](Engine& e, size_t param, const std::string& key) { return state_tensor(e.state(param, key), nb::find(&e)); },
          nb::arg("param"), nb::arg("key"), state_doc)
      .def("state_keys", &Engine::state_keys, nb::arg("param"))
      .def("step_count", &Engine::step_count, nb::arg("param"))
      .def("set_step_count", &Engine::set_step_count, nb::arg("param"), nb::arg("count"))
      .def("options", &Engine::options, nb::arg("group"), nb::rv_policy::reference_internal,
           "The live GroupOptions of a group: writes take effect at the next step.")
      .def(
          "set_stream",
          [](Engine& e, std::optional<uintptr_t> stream) {
            e.set_stream(stream ? reinterpret_cast<void*>(*stream) : nullptr);
          },
          nb::arg("stream").none(),
          "The caller's CUDA stream the steps order themselves with on the device (a cudaStream_t as "
          "an int, e.g. torch.cuda.current_stream().cuda_stream; 1 = cudaStreamLegacy for the legacy "
          "default stream, whose handle is 0). None: none, step() waits on the host (meshmuon/optimizer.h "
          "Optimizer::set_stream).")
      .def(
          "stream", [](const Engine& e) -> std::optional<uintptr_t> {
            void* s = e.stream();
            if (s == nullptr) return std::nullopt;
            return reinterpret_cast<uintptr_t>(s);
          },
          "The stream set by set_stream, or None.");
}

// meshmuon::StepStats as a dict (both engines' last_stats(); optimizer.cpp).
nb::dict stats_dict(const StepStats& s);

// The meshmuon.Optimizer options as its bindings take them (meshmuon.Optimizer() and
// ShardedParams.make_optimizer): names, strings and seconds checked and converted here, once.
// `machine`: a profile name ("h100", "cpu") or a meshmuon.MachineProfile.
struct PyOptimizerArgs {
  std::string non_finite = "raise", comm_dtype = "fp32";
  int window = 2;
  int64_t chunk_bytes = int64_t{32} << 20;
  int blas_threads = 0;
  double timeout_s = 0;
  nb::object machine;
  std::string strategy, replica = "auto";
  bool exact = true, env_override = true;
  bool offload_state = false;
  std::string device = "cpu";
};
OptimizerOptions optimizer_options(const PyOptimizerArgs& a);

void init_errors(nb::module_& m);
void init_blas(nb::module_& m);
void init_options(nb::module_& m);
void init_orthogonalize(nb::module_& m);
void init_local_optimizer(nb::module_& m);
void init_optimizer(nb::module_& m);
void init_comm(nb::module_& m);
void init_sharded_params(nb::module_& m);  // after init_optimizer: returns meshmuon.Optimizer

}  // namespace meshmuon::python
