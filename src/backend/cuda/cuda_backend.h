// Internal: the cuda backend (cuda_backend.cpp): make_cuda_backend (backend.h) and a device probe.
#pragma once

#include <cstddef>
#include <string>

#include "backend/backend.h"

namespace dmuon::detail {

// Whether the CUDA runtime sees at least one device; `why` gets the runtime's reason when not
// ("CUDA driver version is insufficient...", "no CUDA-capable device is detected", ...). Never throws.
bool cuda_device_available(std::string* why = nullptr);

// The scratch one muon_batch call takes at most at a time (512 MiB by default; at least one matrix
// whatever the value): larger batches run in parts, each matrix with the bits it has alone. Returns
// the previous value. For tests (parts of one matrix) and for memory-tight runs.
size_t set_cuda_ns_batch_bytes(size_t bytes);

}  // namespace dmuon::detail
