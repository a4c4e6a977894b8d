// Internal: the one check of an optimizer's parameter groups, shared by both engines (the engine
// runs it; LocalOptimizer's facade runs it first for its own shape messages). Defined in
// optim_options.cpp.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "meshmuon/optim_options.h"

namespace meshmuon::detail {

// Every group's options are valid (validate_group_options), every index is in [0, nparams), and
// every parameter is in exactly one group. Returns each parameter's group. Throws
// std::invalid_argument naming the group or the parameter (`name(i)`):
//   "[optim] group 1 lists parameter index 9 but there are 6 parameters"
//   "[optim] parameter 'bias' is in groups 0 and 2; put each parameter in exactly one group"
//   "[optim] parameter 'embed' is in no group; add it to a Muon or AdamW group"
std::vector<int> validate_param_groups(std::span<const ParamGroup> groups, size_t nparams,
                                       const std::function<std::string_view(size_t)>& name);

}  // namespace meshmuon::detail
