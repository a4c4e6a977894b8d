// Internal: what save and load of a checkpoint share (checkpoint.h): paths, the local view checks,
// which rank writes a piece (the error agreement over the world is comm/agreement.h's).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "comm/agreement.h"
#include "meshmuon/box.h"
#include "meshmuon/checkpoint.h"
#include "meshmuon/comm.h"

namespace meshmuon::detail {

inline constexpr std::string_view kIndexFile = "index.json";

std::string normalize_dir(const std::string& dir);            // without trailing '/'
std::string join_path(const std::string& dir, std::string_view rel);
std::string rank_file_name(const std::string& generation, int rank);  // "<gen>/rank-<r>.safetensors"

// The box `rank` holds of `t`, after checking the key, the mesh (spans `world` ranks) and the
// placements; std::invalid_argument "[checkpoint] tensor '<key>': ..." otherwise.
Box checkpoint_box(const CheckpointTensor& t, int rank, int world);
// Checks that t.data is a contiguous view of dtype t.dtype and shape box.shape(), in host memory
// or with a device_copy.
void check_view(const CheckpointTensor& t, const Box& box);

// Whether t's view is device memory (its bytes move only through t.device_copy; check_view
// refuses a device view without one).
inline bool on_device(const CheckpointTensor& t) { return t.data.device.kind != DeviceKind::Cpu; }

// Whether `rank` writes its piece: its coordinates on the mesh dims that replicate are all 0.
bool writes_piece(const Mesh& mesh, std::span<const Placement> placements, int rank);

// load_checkpoint with a check of the index's information that runs with the other validation,
// before the agreement (a failure there modifies nothing, like any other).
CheckpointInfo load_checkpoint_checked(Communicator& comm, const std::string& dir,
                                       std::span<const CheckpointTensor> tensors,
                                       const std::function<void(const CheckpointInfo&)>& check);

}  // namespace meshmuon::detail
