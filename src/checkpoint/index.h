// Internal: index.json of a checkpoint (checkpoint.h, docs/checkpoint.md), version 1:
// {
//   "format": "meshmuon-checkpoint", "version": 1, "step": 100, "world_size": 4,
//   "mesh": "dp_shard=4", "generation": "g100-5f0c...",
//   "metadata": {"<k>": "<v>"}, "step_counts": {"<param>": 100},
//   "files": [{"path": "g100-5f0c.../rank-0.safetensors", "rank": 0, "size": 1234, "crc32": 305419896}],
//   "tensors": [{"key": "param/w1", "dtype": "fp32", "shape": [8, 4], "mesh": "dp_shard=4",
//                "placements": ["S(0)"],
//                "pieces": [{"file": "g100-5f0c.../rank-0.safetensors", "name": "param/w1",
//                            "box": [[[0, 2]], [[0, 4]]]}]}]
// }
// A box lists, per tensor dim, its ranges [begin, end) in local order (box.h). Parsing validates
// every field and throws meshmuon::Error "[checkpoint] <path>: <field>: ..." naming it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/box.h"
#include "meshmuon/dtype.h"
#include "meshmuon/placement.h"
#include "meshmuon/tensor.h"

namespace meshmuon::detail {

inline constexpr std::string_view kCheckpointFormat = "meshmuon-checkpoint";
inline constexpr int kCheckpointVersion = 1;

struct IndexPiece {
  std::string file;  // relative to the checkpoint directory
  std::string name;  // the tensor's name inside that safetensors file
  Box box;           // global coordinates
};

struct IndexTensor {
  std::string key;
  DType dtype = DType::F32;
  Shape shape;
  std::string mesh;  // Mesh::to_string at save time (information only)
  std::vector<Placement> placements;
  std::vector<IndexPiece> pieces;
};

struct IndexFile {
  std::string path;  // relative to the checkpoint directory
  int rank = 0;
  uint64_t size = 0;
  uint32_t crc32 = 0;
};

struct CheckpointIndex {
  int64_t step = 0;
  int world_size = 0;
  std::string mesh;
  std::string generation;
  std::map<std::string, std::string> metadata;
  std::map<std::string, int64_t> step_counts;
  std::vector<IndexFile> files;
  std::vector<IndexTensor> tensors;
};

std::string index_to_json(const CheckpointIndex& index);
// `path` names the file in errors.
CheckpointIndex parse_index(std::string_view text, std::string_view path);

// Whether `name` is a generation directory name ("g<digits>-<hex>"): what a save may delete.
bool is_generation_name(std::string_view name);

}  // namespace meshmuon::detail
