// Internal: shared pieces of checkpoint save and load (checkpoint_common.h).
#include "checkpoint/common.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "meshmuon/error.h"

namespace meshmuon::detail {

std::string normalize_dir(const std::string& dir) {
  MESHMUON_CHECK(!dir.empty(), "[checkpoint] the checkpoint directory is empty");
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d;
}

std::string join_path(const std::string& dir, std::string_view rel) {
  std::string out;
  out.reserve(dir.size() + 1 + rel.size());
  out.append(dir);
  if (out.empty() || out.back() != '/') out.push_back('/');
  out.append(rel);
  return out;
}

std::string rank_file_name(const std::string& generation, int rank) {
  return concat(generation, "/rank-", rank, ".safetensors");
}

Box checkpoint_box(const CheckpointTensor& t, int rank, int world) {
  MESHMUON_CHECK(!t.key.empty(), "[checkpoint] a tensor has an empty key");
  MESHMUON_CHECK(t.mesh.size() == world, "[checkpoint] tensor '", t.key, "': mesh ", t.mesh.to_string(), " has ",
              t.mesh.size(), " ranks, the communicator ", world);
  check_placements(t.global_shape, t.placements, t.mesh, concat("[checkpoint] tensor '", t.key, "'"));
  return local_box(t.global_shape, t.placements, t.mesh, rank);
}

void check_view(const CheckpointTensor& t, const Box& box) {
  const Shape shape = box.shape();
  MESHMUON_CHECK(t.data.dtype == t.dtype, "[checkpoint] tensor '", t.key, "': the view is ", to_string(t.data.dtype),
              ", the tensor ", to_string(t.dtype));
  MESHMUON_CHECK(t.data.shape == shape, "[checkpoint] tensor '", t.key, "': the view has shape ",
              t.data.shape.to_string(), ", this rank's box ", box.to_string(), " has shape ", shape.to_string());
  MESHMUON_CHECK(shape.numel() == 0 || (t.data.data != nullptr && t.data.is_contiguous()), "[checkpoint] tensor '",
              t.key, "': the view must be contiguous and non-null");
  MESHMUON_CHECK(t.data.device.kind == DeviceKind::Cpu || t.device_copy, "[checkpoint] tensor '", t.key,
              "': the view is in ", to_string(t.data.device),
              " memory and has no device_copy: the host does not touch device memory (set "
              "CheckpointTensor::device_copy, e.g. to the engine backend's copy; checkpoint_tensors() does)");
}

bool writes_piece(const Mesh& mesh, std::span<const Placement> placements, int rank) {
  const DimMask rep = replicate_dims(placements, mesh);
  for (int d = 0; d < mesh.ndim(); ++d)
    if (((rep >> d) & 1u) && mesh.coord(rank, d) != 0) return false;
  return true;
}

}  // namespace meshmuon::detail
