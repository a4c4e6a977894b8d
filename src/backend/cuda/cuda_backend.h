// Internal: the cuda backend (cuda_backend.cpp): make_cuda_backend (backend.h) and a device probe.
#pragma once

#include <string>

#include "backend/backend.h"

namespace dmuon::detail {

// Whether the CUDA runtime sees at least one device; `why` gets the runtime's reason when not
// ("CUDA driver version is insufficient...", "no CUDA-capable device is detected", ...). Never throws.
bool cuda_device_available(std::string* why = nullptr);

}  // namespace dmuon::detail
