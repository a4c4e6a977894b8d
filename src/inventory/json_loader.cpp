// Model files: the JSON format of docs/model-format.md -> Inventory, with errors naming the field.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "meshmuon/error.h"
#include "meshmuon/inventory.h"

namespace meshmuon {
namespace {

using nlohmann::json;

[[noreturn]] void fail(std::string_view source, const std::string& where, const std::string& msg) {
  detail::throw_invalid_argument(detail::concat("[inventory] ", source, ": ", where, ": ", msg));
}

void check_keys(const json& j, std::initializer_list<const char*> allowed, std::string_view source,
                const std::string& where) {
  const std::set<std::string> ok(allowed.begin(), allowed.end());
  for (const auto& [key, value] : j.items())
    if (!ok.count(key)) fail(source, where, "unknown field '" + key + "'");
}

const json& need(const json& j, const char* key, json::value_t type, const char* type_name,
                 std::string_view source, const std::string& where) {
  if (!j.contains(key)) fail(source, where, std::string("field '") + key + "' is missing");
  const json& v = j.at(key);
  const bool ok = v.type() == type || (type == json::value_t::number_integer && v.is_number_unsigned());
  if (!ok) fail(source, where, std::string("field '") + key + "' must be " + type_name);
  return v;
}

std::string get_string(const json& j, const char* key, std::string_view source, const std::string& where) {
  return need(j, key, json::value_t::string, "a string", source, where).get<std::string>();
}

int get_int(const json& j, const char* key, std::string_view source, const std::string& where) {
  const json& v = need(j, key, json::value_t::number_integer, "an integer", source, where);
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX)
                                           : v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX;
  if (!fits) fail(source, where, std::string("field '") + key + "' is " + v.dump() + "; it must fit a 32-bit integer");
  return v.get<int>();
}

QkTag parse_qk(const json& j, std::string_view source, const std::string& where) {
  const std::string w = where + " field 'qk'";
  if (!j.is_object()) fail(source, w, "must be an object");
  check_keys(j, {"layer", "kind", "heads", "head_dim", "rope_dim", "v_dim"}, source, w);
  QkTag t;
  t.layer = get_int(j, "layer", source, w);
  t.kind = parse_qk_kind(get_string(j, "kind", source, w));
  t.heads = get_int(j, "heads", source, w);
  t.head_dim = get_int(j, "head_dim", source, w);
  if (j.contains("rope_dim")) t.rope_dim = get_int(j, "rope_dim", source, w);
  if (j.contains("v_dim")) t.v_dim = get_int(j, "v_dim", source, w);
  return t;
}

ParamSpec parse_param(const json& j, size_t index, const std::vector<std::string>& mesh_names,
                      std::string_view source) {
  std::string where = "params[" + std::to_string(index) + "]";
  if (!j.is_object()) fail(source, where, "must be an object");
  ParamSpec p;
  p.name = get_string(j, "name", source, where);
  where = "parameter '" + p.name + "'";
  check_keys(j, {"name", "shape", "dtype", "role", "expert", "tp", "mesh", "placements", "qk", "split"}, source, where);
  const json& shape = need(j, "shape", json::value_t::array, "an array of integers", source, where);
  if (shape.empty() || shape.size() > static_cast<size_t>(kMaxDims))
    fail(source, where, "field 'shape' must have 1 to " + std::to_string(kMaxDims) + " extents");
  std::vector<int64_t> dims;
  for (const json& e : shape) {
    if (!e.is_number_integer() || (!e.is_number_unsigned() && e.get<int64_t>() < 0))
      fail(source, where, "field 'shape' must hold non-negative integers");
    // validate_param bounds the element count; here, extents that do not even fit int64
    if (e.is_number_unsigned() && e.get<uint64_t>() > static_cast<uint64_t>(kMaxParamElements))
      fail(source, where, "field 'shape' has extent " + e.dump() + "; meshmuon supports at most 2^60 (" +
                              std::to_string(kMaxParamElements) + ") elements and extents per tensor");
    dims.push_back(e.get<int64_t>());
  }
  p.shape = Shape(std::span<const int64_t>(dims));
  const std::string w = "parameter '" + p.name + "' field ";
  if (j.contains("dtype")) p.dtype = parse_dtype(get_string(j, "dtype", source, where), w + "'dtype'");
  p.role = parse_role(get_string(j, "role", source, where), w + "'role'");
  if (j.contains("expert")) {
    if (!j.at("expert").is_boolean()) fail(source, where, "field 'expert' must be true or false");
    p.expert = j.at("expert").get<bool>();
  }
  if (j.contains("tp")) p.tp = parse_tp_style(get_string(j, "tp", source, where), w + "'tp'");
  if (j.contains("mesh")) {
    const std::string m = get_string(j, "mesh", source, where);
    const auto it = std::find(mesh_names.begin(), mesh_names.end(), m);
    if (it == mesh_names.end()) fail(source, where, "field 'mesh' names unknown mesh '" + m + "'");
    p.mesh = static_cast<int>(it - mesh_names.begin());
  }
  if (j.contains("placements")) {
    const json& pl = need(j, "placements", json::value_t::array, "an array of strings", source, where);
    for (size_t i = 0; i < pl.size(); ++i) {
      if (!pl[i].is_string()) fail(source, where, "field 'placements' must hold strings like \"S(0)\"");
      p.placements.push_back(parse_placement(pl[i].get<std::string>(),
                                             w + "'placements[" + std::to_string(i) + "]'"));
    }
  }
  if (j.contains("qk") && !j.at("qk").is_null()) p.qk = parse_qk(j.at("qk"), source, where);
  if (j.contains("split") && !j.at("split").is_null()) {  // row blocks (validate_param checks the sum)
    const json& sp = need(j, "split", json::value_t::array, "an array of positive row counts", source, where);
    for (const json& e : sp) {
      if (!e.is_number_integer() || e.get<int64_t>() <= 0) fail(source, where, "field 'split' must hold positive integers");
      p.split.push_back(e.get<int64_t>());
    }
  }
  return p;
}

}  // namespace

Inventory load_inventory_json(std::string_view text, const ParallelConfig* config, std::string_view source) {
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    detail::throw_invalid_argument(detail::concat("[inventory] ", source, ": malformed JSON (", e.what(), ")"));
  }
  if (!root.is_object()) fail(source, "top level", "must be an object with 'model' and 'params'");
  check_keys(root, {"model", "meshes", "params"}, source, "top level");
  ModelDesc model;
  model.name = root.contains("model") ? get_string(root, "model", source, "top level") : "custom";
  std::vector<std::string> names;
  std::vector<Mesh> meshes;
  if (root.contains("meshes")) {
    const json& ms = need(root, "meshes", json::value_t::array, "an array", source, "top level");
    for (size_t i = 0; i < ms.size(); ++i) {
      const std::string where = "meshes[" + std::to_string(i) + "]";
      if (!ms[i].is_object()) fail(source, where, "must be an object {\"name\", \"dims\"}");
      check_keys(ms[i], {"name", "dims"}, source, where);
      names.push_back(get_string(ms[i], "name", source, where));
      meshes.push_back(Mesh::parse(get_string(ms[i], "dims", source, where)));
    }
  }
  const json& params = need(root, "params", json::value_t::array, "an array", source, "top level");
  size_t placed = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    model.params.push_back(parse_param(params[i], i, names, source));
    placed += params[i].contains("placements") ? 1 : 0;
  }
  if (placed == 0) {
    if (!config) fail(source, "top level", "no parameter has 'placements'; give --parallel to place them");
    return apply_parallel(model, *config);
  }
  if (placed != model.params.size())
    fail(source, "top level", "give 'placements' for every parameter or for none (" + std::to_string(placed) +
                                  " of " + std::to_string(model.params.size()) + " have them)");
  if (meshes.empty()) fail(source, "top level", "parameters give 'placements' but field 'meshes' is missing");
  Inventory inv{model.name, names, meshes, std::move(model.params)};
  inv.validate();
  if (config)
    MESHMUON_CHECK(config->world_size() == inv.world_size(), "[inventory] ", source, ": mesh '", names[0], "' (",
                meshes[0].to_string(), ") has ", inv.world_size(), " ranks but --parallel ", to_string(*config),
                " gives a world of ", config->world_size());
  return inv;
}

Inventory load_inventory_file(const std::string& path, const ParallelConfig* config) {
  std::ifstream in(path);
  MESHMUON_CHECK(in.good(), "[inventory] cannot read model file '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return load_inventory_json(ss.str(), config, "model file '" + path + "'");
}

}  // namespace meshmuon
