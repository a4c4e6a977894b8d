// meshmuon.ShardedParams: the native sharded parameter group (meshmuon/sharded_params.h) as meshmuon.torch's
// ZeRO engine uses it (python/meshmuon/torch/_zero.py): fp32 master shards in one flat buffer (exposed as
// torch tensors aliasing it), the fixed-order gradient reduction read straight from the caller's full
// gradients (torch .grad, fp32 or bf16), the unshard written straight into the caller's full
// parameters (fp32 bits or bf16 round to nearest even), and a meshmuon.Optimizer over the same mesh
// communicators and inventory. The GIL is released during every collective call.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/unique_ptr.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "meshmuon/mesh_comms.h"
#include "meshmuon/optimizer.h"
#include "meshmuon/plan.h"
#include "meshmuon/sharded_params.h"
#include "meshmuon/strategy.h"

namespace meshmuon::python {
namespace {

GradReduce parse_reduce(const std::string& v) {
  if (v == "mean") return GradReduce::Mean;
  if (v == "sum") return GradReduce::Sum;
  detail::throw_invalid_argument(detail::concat("[python] ShardedParams reduce='", v, "'; use 'mean' or 'sum'"));
}

nb::dict reduce_stats_dict(const ReduceStats& s) {
  nb::dict d;
  d["buckets"] = s.buckets;
  d["seconds"] = s.seconds;
  d["shard_seconds"] = s.shard_seconds;
  d["replicate_seconds"] = s.replicate_seconds;
  d["overlap_seconds"] = s.overlap_seconds;
  d["sum_seconds"] = s.sum_seconds;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_recv"] = s.bytes_recv;
  return d;
}

}  // namespace

void init_sharded_params(nb::module_& m) {
  nb::class_<ShardedParams>(m, "ShardedParams",
                            "Parameters sharded Shard(0) like FSDP2 (meshmuon/sharded_params.h): fp32 master "
                            "shards, fixed-order gradient reduction, unshard. COLLECTIVE calls on every rank.")
      .def(
          "__init__",
          [](ShardedParams* self, std::shared_ptr<Communicator> comm, const Mesh& mesh, std::vector<ParamSpec> params,
             const std::string& reduce, const std::string& reduce_dtype, double grad_divisor, int64_t bucket_bytes,
             double timeout_s, const std::string& device) {
            ShardedParamsOptions o;
            o.device = device;
            o.reduce = parse_reduce(reduce);
            o.reduce_dtype = parse_dtype(reduce_dtype, "reduce_dtype");
            o.grad_divisor = grad_divisor;
            o.bucket_bytes = bucket_bytes;
            o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3));
            auto comms = std::make_shared<MeshCommunicators>(std::move(comm));
            nb::gil_scoped_release release;
            new (self) ShardedParams(std::move(comms), mesh, std::move(params), o);
          },
          nb::arg("comm"), nb::arg("mesh"), nb::arg("params"), nb::arg("reduce") = "mean",
          nb::arg("reduce_dtype") = "fp32", nb::arg("grad_divisor") = 0.0, nb::arg("bucket_bytes") = int64_t{16} << 20,
          nb::arg("timeout_s") = 0.0, nb::arg("device") = "cpu",
          "COLLECTIVE. device: 'cpu', 'cuda' or 'cuda:N' (masters, gradients and the caller's full tensors live "
          "there; the communicator must take its buffers). mesh: dp_shard=S (or dp_replicate=R,dp_shard=S; no dims on one rank). params: name, "
          "shape, role, expert, qk (placements empty, set here). Masters start at zero.")
      .def_prop_ro("size", &ShardedParams::size)
      .def_prop_ro("inventory", &ShardedParams::inventory)
      .def("local_box",
           [](const ShardedParams& sp, size_t i) {
             std::vector<std::pair<int64_t, int64_t>> rows;
             const Box box = sp.local_box(i);  // ranges() refers into it: keep it alive over the loop
             for (const Range& r : box.dims[0].ranges()) rows.emplace_back(r.begin, r.end);
             return rows;
           },
           nb::arg("param"), "This rank's rows of parameter i: [(begin, end)] (Shard(0); empty when it holds none).")
      .def("param", [](ShardedParams& sp, size_t i) { return state_tensor(sp.param(i), nb::find(&sp)); },
           nb::arg("param"), "This rank's fp32 master shard of parameter i (a torch tensor aliasing it).")
      .def("grad", [](ShardedParams& sp, size_t i) { return state_tensor(sp.grad(i), nb::find(&sp)); },
           nb::arg("param"), "This rank's reduced fp32 gradient shard of parameter i (aliasing it).")
      .def("grads", [](ShardedParams& sp) {
             nb::list out;
             for (size_t i = 0; i < sp.size(); ++i) out.append(state_tensor(sp.grad(i), nb::find(&sp)));
             return out;
           })
      .def("unshard_into",
           [](ShardedParams& sp, const std::vector<Array>& full) {
             const std::vector<TensorView> v = views(full, "full parameter");
             nb::gil_scoped_release release;
             sp.unshard_into(v);
           },
           nb::arg("full"), "COLLECTIVE. Writes every master into the caller's full tensor (fp32 bits or bf16 RNE).")
      .def("reduce_grads_from",
           [](ShardedParams& sp, const std::vector<Grad>& full) {
             const std::vector<TensorView> v = grad_views(full);
             nb::gil_scoped_release release;
             sp.reduce_grads_from(v);
           },
           nb::arg("full"),
           "COLLECTIVE. Reduces the caller's full gradients (fp32 / bf16; None = zeros) into grad(i) in the "
           "documented fixed order.")
      .def("last_reduce_stats", [](const ShardedParams& sp) { return reduce_stats_dict(sp.last_reduce_stats()); })
      .def(
          "make_optimizer",
          [](ShardedParams& sp, std::vector<ParamGroup> groups, const std::string& non_finite,
             const std::string& comm_dtype, int window, int64_t chunk_bytes, double timeout_s,
             const nb::object& machine, const std::string& strategy, const std::string& replica, bool exact,
             bool env_override, bool offload_state) {
            // The optimizer steps on the master shards: on their device.
            const OptimizerOptions options = optimizer_options(
                {non_finite, comm_dtype, window, chunk_bytes, 0, timeout_s, machine, strategy, replica, exact,
                 env_override, offload_state, sp.options().device});
            nb::gil_scoped_release release;
            return std::make_unique<Optimizer>(sp.mesh_communicators(), sp.inventory(), std::move(groups), options);
          },
          nb::arg("groups"), nb::arg("non_finite") = "raise", nb::arg("comm_dtype") = "fp32", nb::arg("window") = 2,
          nb::arg("chunk_bytes") = int64_t{32} << 20, nb::arg("timeout_s") = 0.0, nb::arg("machine") = "cpu",
          nb::arg("strategy") = "", nb::arg("replica") = "auto", nb::arg("exact") = true,
          nb::arg("env_override") = true, nb::arg("offload_state") = false,
          "COLLECTIVE. A meshmuon.Optimizer over this object's mesh communicators and inventory (steps on "
          "the master shards, on their device); the options as meshmuon.Optimizer's.")
      .def_prop_ro("device", [](const ShardedParams& sp) { return sp.options().device; },
                   "Where the masters live: 'cpu', 'cuda' or 'cuda:N' as given.");
}

}  // namespace meshmuon::python
