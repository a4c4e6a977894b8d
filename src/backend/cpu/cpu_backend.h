// Internal: the cpu backend (OpenBLAS fp32 products, oneDNN bf16 products, the update kernels of
// src/kernels/cpu), its stream and its thread control (the BLAS thread count).
#pragma once

#include "backend/backend.h"

namespace meshmuon::detail {

std::unique_ptr<Stream> make_cpu_stream(bool threaded);
void cpu_pack(std::span<const PackRun> runs, std::span<std::byte* const> bases);

}  // namespace meshmuon::detail
