// Internal: the cuda backend (cuda_backend.cpp and the files it names): make_cuda_backend (registry.h),
// a device probe (cuda_registration.cpp, with the registry entry) and the switches of tests.
#pragma once

#include <cstddef>
#include <string>

#include <memory>

#include "backend/backend.h"
#include "backend/memory_space.h"
#include "backend/registry.h"

namespace meshmuon::detail {

// Whether the CUDA runtime sees at least one device; `why` gets the runtime's reason when not
// ("CUDA driver version is insufficient...", "no CUDA-capable device is detected", ...). Never throws.
bool cuda_device_available(std::string* why = nullptr);

// cudart's MemorySpace (cuda_memory_space.cpp); nullptr when no CUDA device is usable.
std::shared_ptr<MemorySpace> cuda_memory_space();

// The scratch one muon_batch call takes at most at a time (512 MiB by default; at least one matrix
// whatever the value): larger batches run in parts, each matrix with the bits it has alone. Returns
// the previous value. For tests (parts of one matrix) and for memory-tight runs.
size_t set_cuda_ns_batch_bytes(size_t bytes);

// Tests only: whether an upload through a thread's pinned ring first gives back the events of the
// uploads the device has done (on by default: a ring then holds only as many events as uploads in
// flight). Off, regions are reclaimed only when the ring wraps onto them, through the wait before
// reuse, which the emulation's test of that wait needs (its queries run queued work). Returns the
// previous value.
bool set_upload_ring_eager_release(bool on);

}  // namespace meshmuon::detail
