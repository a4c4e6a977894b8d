// meshmuon.LocalOptimizer: the single-process engine. Parameters and gradients cross as DLPack views
// each step (no copies); the state lives in the engine and is exposed as torch tensors that alias
// it (so the optimizer's state dict and the engine share memory). The GIL is released in step().
#include <string>
#include <vector>

#include "bindings.h"
#include "meshmuon/local_optimizer.h"
#include "meshmuon/optimizer.h"
#include "meshmuon/plan.h"

namespace meshmuon::python {

void init_local_optimizer(nb::module_& m) {
  nb::class_<LocalOptimizer> cls(m, "LocalOptimizer",
                                 "Single-process optimizer step over whole parameters "
                                 "(meshmuon/local_optimizer.h). Not thread-safe.");
  cls.def(
          "__init__",
          [](LocalOptimizer* self, std::vector<ParamInfo> params, std::vector<ParamGroup> groups,
             const std::string& policy, const std::string& comm_dtype, int threads, bool offload_state,
             const std::string& device) {
            LocalOptimizerOptions options;
            options.policy = parse_non_finite_policy(policy);
            options.comm_dtype = parse_dtype(comm_dtype, "comm_dtype");
            options.threads = threads;
            options.offload_state = offload_state;
            options.device = device;
            new (self) LocalOptimizer(std::move(params), std::move(groups), options);
          },
          nb::arg("params"), nb::arg("groups"), nb::arg("non_finite") = "raise",
          nb::arg("comm_dtype") = "fp32", nb::arg("threads") = 1, nb::arg("offload_state") = false,
          nb::arg("device") = "cpu",
          "comm_dtype 'bf16' rounds the orthogonalization input and output to bf16 where the "
          "distributed engine communicates them, so results equal a distributed run's bitwise. "
          "threads: parameters updated at once (0: the BLAS thread count; results do not depend "
          "on it). offload_state=True stages the state through device slots per chunk (bitwise the same "
          "results; on the cpu backend the same copies, a cost, so the mechanism is tested). device: 'cpu', "
          "'cuda' or 'cuda:N'; parameters, gradients and state() are that device's memory.")
      .def_prop_rw("threads", &LocalOptimizer::threads, &LocalOptimizer::set_threads)
      .def_prop_ro("comm_dtype", [](const LocalOptimizer& o) { return std::string(to_string(o.comm_dtype())); })
      .def_prop_ro("params", &LocalOptimizer::params)
      .def_prop_ro("groups", &LocalOptimizer::groups)
      .def_prop_rw(
          "non_finite", [](const LocalOptimizer& o) { return std::string(to_string(o.policy())); },
          [](LocalOptimizer& o, const std::string& v) { o.set_policy(parse_non_finite_policy(v)); })
      .def("plan_string", [](const LocalOptimizer& o) { return o.plan().to_string(); },
           "The engine's plan on one rank as `meshmuon plan` prints it.")
      .def("plan_json", [](const LocalOptimizer& o) { return o.plan().to_json(); },
           "The plan as JSON (docs/plan.md): one rank, every Muon parameter computed locally.")
      .def("last_stats", [](const LocalOptimizer& o) { return stats_dict(o.last_stats()); },
           "The counters of the last step (meshmuon::StepStats) as a dict: times; no bytes on one rank.");
  bind_engine_methods(cls, "One step; params updated in place. Returns False when skipped (non-finite, policy skip).",
                      "A torch.Tensor aliasing the engine's fp32 state (read-write; stable across steps).");
}

}  // namespace meshmuon::python
