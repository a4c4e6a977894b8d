// The inventory's own checks (inventory.h): every mesh spans one world, parameter names are unique,
// each parameter is valid on its mesh, and the model's total element count fits.
#include "meshmuon/inventory.h"

#include <map>
#include <string_view>

#include "core/checked_math.h"
#include "meshmuon/error.h"

namespace meshmuon {

int64_t Inventory::num_elements() const {
  int64_t n = 0;
  for (const ParamSpec& p : params)
    MESHMUON_CHECK(detail::checked_add(n, p.numel(), n) && n <= kMaxParamElements, "[inventory] model '", model,
                "': parameter '", p.name, "' ", p.shape.to_string(), " brings the total past 2^60 (", kMaxParamElements,
                ") elements; meshmuon supports at most 2^60 per model");
  return n;
}

void Inventory::validate() const {
  MESHMUON_CHECK(!meshes.empty(), "[inventory] model '", model, "' has no mesh");
  MESHMUON_CHECK(mesh_names.size() == meshes.size(), "[inventory] model '", model, "': mesh names and meshes differ in count");
  for (size_t i = 1; i < meshes.size(); ++i)
    MESHMUON_CHECK(meshes[i].size() == meshes[0].size(), "[inventory] mesh '", mesh_names[i], "' (",
                meshes[i].to_string(), ") has ", meshes[i].size(), " ranks but mesh '", mesh_names[0],
                "' has ", meshes[0].size(), "; every mesh must span the same world");
  std::map<std::string_view, size_t> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    MESHMUON_CHECK(p.mesh >= 0 && p.mesh < static_cast<int>(meshes.size()), "[inventory] parameter '", p.name,
                "': field 'mesh' is ", p.mesh, " but the model has ", meshes.size(), " meshes");
    validate_param(p, meshes[static_cast<size_t>(p.mesh)]);
    MESHMUON_CHECK(seen.emplace(p.name, i).second, "[inventory] parameter name '", p.name, "' appears twice");
  }
  num_elements();  // the model's total must fit too (each parameter's does, by validate_param)
}

}  // namespace meshmuon
