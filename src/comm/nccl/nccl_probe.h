// Internal, without nccl.h (tests include it): load libnccl as make_nccl_communicator would.
#pragma once

#include <string>

namespace meshmuon::detail {
// Loads libnccl (`only` if not null, else the usual search: nccl_loader.h) and resolves every symbol
// the nccl communicator uses; returns "<library> (NCCL x.y.z)". Throws meshmuon::Error naming what was
// tried and nvidia-nccl-cu13. Needs no GPU. Defined only in builds with the nccl communicator.
std::string nccl_probe(const char* only);
}  // namespace meshmuon::detail
