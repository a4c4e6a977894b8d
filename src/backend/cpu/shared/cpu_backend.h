// Internal, SHARED (backend/cpu/shared/: what other backends reuse of the cpu backend): the host
// stream (a worker thread, or the caller's thread) and the pack table run on the host. The cpu backend
// itself (OpenBLAS fp32 products, oneDNN bf16 products, the kernels of src/backend/cpu/kernels) is
// cpu_backend.cpp, found through the registry (registry.h).
#pragma once

#include "backend/backend.h"

namespace meshmuon::detail {

std::unique_ptr<Stream> make_cpu_stream(bool threaded);
void cpu_pack(std::span<const PackRun> runs, std::span<std::byte* const> bases);

}  // namespace meshmuon::detail
