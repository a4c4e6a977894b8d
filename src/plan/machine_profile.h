// Internal: the machine profile's measured fields (memory bandwidth, cores, overlap, Newton–Schulz
// rates by shape, communication per world size) as JSON (machine_profile.cpp); the scalar fields
// stay with MachineProfile::from_json (plan_report.cpp), which hands every other key here.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "meshmuon/plan.h"

namespace meshmuon::detail {

// Reads `key` into `m` when it is one of the measured fields; false for an unknown key. Throws
// std::invalid_argument naming the field on a malformed value.
bool read_measured_field(MachineProfile& m, const std::string& key, const nlohmann::json& v);

// The `cpu` profile (MachineProfile::named("cpu")): constants fitted on this project's machine.
MachineProfile fitted_cpu_profile();

}  // namespace meshmuon::detail
