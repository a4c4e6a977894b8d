// Option structs as Python classes: NsOptions, GroupOptions, QkTag, ParamInfo, ParamGroup. Enum
// fields read and write as the engine's lowercase names ("jordan", "symmetric", "muon", ...), so
// Python and the CLI spell them the same way; bad names raise ValueError.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "meshmuon/local_optimizer.h"
#include "meshmuon/optim_options.h"
#include "meshmuon/orthogonalize.h"
#include "meshmuon/qk_clip.h"

namespace meshmuon::python {
namespace {

// A read-write property that converts between an enum field and its string name.
template <class C, class E, class Parse>
void enum_property(nb::class_<C>& cls, const char* name, E C::*field, Parse parse) {
  cls.def_prop_rw(
      name, [field](const C& c) { return std::string(to_string(c.*field)); },
      [field, parse](C& c, const std::string& v) { c.*field = parse(v); });
}

EpsMode parse_eps_mode(std::string_view v) {
  if (v == "add") return EpsMode::Add;
  if (v == "clamp") return EpsMode::Clamp;
  detail::throw_invalid_argument(detail::concat("[python] unknown eps_mode '", v, "'; use add, clamp"));
}

}  // namespace

void init_options(nb::module_& m) {
  nb::class_<NsOptions> ns(m, "NsOptions", "Orthogonalization options (meshmuon/orthogonalize.h).");
  ns.def(nb::init<>());
  enum_property(ns, "schedule", &NsOptions::schedule, parse_schedule);
  enum_property(ns, "method", &NsOptions::method, parse_ns_method);
  ns.def_rw("steps", &NsOptions::steps)
      .def_rw("scale", &NsOptions::scale)
      .def_rw("eps", &NsOptions::eps)
      .def_prop_rw(
          "eps_mode",
          [](const NsOptions& o) { return std::string(o.eps_mode == EpsMode::Add ? "add" : "clamp"); },
          [](NsOptions& o, const std::string& v) { o.eps_mode = parse_eps_mode(v); })
      .def_rw("pe_l0", &NsOptions::pe_l0)
      .def_rw("pe_safety", &NsOptions::pe_safety)
      .def_rw("pe_cushion", &NsOptions::pe_cushion)
      .def_rw("bf16_rounding", &NsOptions::bf16_rounding)
      .def_rw("muon_eq", &NsOptions::muon_eq)
      .def_rw("muon_plus", &NsOptions::muon_plus)
      .def_prop_rw(
          "matmul_dtype", [](const NsOptions& o) { return std::string(to_string(o.matmul_dtype)); },
          [](NsOptions& o, const std::string& v) { o.matmul_dtype = parse_dtype(v, "ns_matmul_dtype"); })
      .def_prop_rw(
          "custom",
          [](const NsOptions& o) {
            std::vector<std::tuple<double, double, double>> out;
            for (const Coefficients& c : o.custom) out.emplace_back(c.a, c.b, c.c);
            return out;
          },
          [](NsOptions& o, const std::vector<std::tuple<double, double, double>>& v) {
            o.custom.clear();
            for (const auto& [a, b, c] : v) o.custom.push_back({a, b, c});
          })
      .def("coefficients", [](const NsOptions& o) {
        std::vector<std::tuple<double, double, double>> out;
        for (const Coefficients& c : make_schedule(o)) out.emplace_back(c.a, c.b, c.c);
        return out;
      }, "The per-step (a, b, c) these options describe; raises ValueError when invalid.");

  nb::class_<GroupOptions> g(m, "GroupOptions", "Hyperparameters of one group (meshmuon/optim_options.h).");
  g.def(nb::init<>());
  enum_property(g, "algorithm", &GroupOptions::algorithm, parse_algorithm);
  enum_property(g, "momentum_kind", &GroupOptions::momentum_kind, parse_momentum_kind);
  enum_property(g, "lr_rule", &GroupOptions::lr_rule, parse_lr_rule);
  enum_property(g, "decay_lr", &GroupOptions::decay_lr, parse_decay_lr);
  g.def_rw("lr", &GroupOptions::lr)
      .def_rw("weight_decay", &GroupOptions::weight_decay)
      .def_rw("momentum", &GroupOptions::momentum)
      .def_rw("nesterov", &GroupOptions::nesterov)
      .def_rw("cautious_wd", &GroupOptions::cautious_wd)
      .def_rw("normuon", &GroupOptions::normuon)
      .def_rw("normuon_beta2", &GroupOptions::normuon_beta2)
      .def_rw("ns", &GroupOptions::ns)
      .def_rw("qk_clip_threshold", &GroupOptions::qk_clip_threshold)
      .def_rw("num_heads", &GroupOptions::num_heads)
      .def_rw("split_sizes", &GroupOptions::split_sizes)
      .def_rw("beta1", &GroupOptions::beta1)
      .def_rw("beta2", &GroupOptions::beta2)
      .def_rw("eps", &GroupOptions::eps)
      .def("validate", [](const GroupOptions& o, size_t index) { validate_group_options(o, index); },
           nb::arg("group_index") = 0, "Raises ValueError naming the field when a value is out of range.");

  nb::class_<QkTag> qk(m, "QkTag", "Where a QK-clip parameter sits in attention (meshmuon/qk_clip.h).");
  qk.def(nb::init<>());
  enum_property(qk, "kind", &QkTag::kind, parse_qk_kind);
  qk.def_rw("layer", &QkTag::layer)
      .def_rw("heads", &QkTag::heads)
      .def_rw("head_dim", &QkTag::head_dim)
      .def_rw("rope_dim", &QkTag::rope_dim)
      .def_rw("v_dim", &QkTag::v_dim);

  nb::class_<ParamInfo>(m, "ParamInfo", "A parameter as the engine sees it: name, global shape, flags.")
      .def(nb::init<>())
      .def_rw("name", &ParamInfo::name)
      .def_prop_rw(
          "shape", [](const ParamInfo& p) { return std::vector<int64_t>(p.shape.begin(), p.shape.end()); },
          [](ParamInfo& p, const std::vector<int64_t>& s) {
            MESHMUON_CHECK(s.size() <= static_cast<size_t>(kMaxDims), "[python] parameter '", p.name,
                        "' has ", s.size(), " dims; at most ", kMaxDims, " are supported");
            p.shape = Shape(std::span<const int64_t>(s.data(), s.size()));
          })
      .def_rw("expert_stack", &ParamInfo::expert_stack)
      .def_rw("qk", &ParamInfo::qk, nb::arg().none())
      .def_rw("split", &ParamInfo::split);

  nb::class_<ParamGroup>(m, "ParamGroup", "Group options and the indices of its parameters.")
      .def(nb::init<>())
      .def_rw("options", &ParamGroup::options)
      .def_rw("params", &ParamGroup::params);
}

}  // namespace meshmuon::python
