// Reshardable checkpoints: every rank writes the boxes it holds in GLOBAL coordinates, so a checkpoint
// saved on one mesh loads on any other (FSDP <-> HSDP, N ranks -> M ranks) by intersecting boxes.
//
// On disk (docs/checkpoint.md): a directory with
//   index.json                         shapes, dtypes, placements and mesh at save time, the step,
//                                      each tensor's pieces (file, name, box), each file's size and
//                                      CRC-32 (zlib), per-parameter optimizer step counts
//   <gen>/rank-<r>.safetensors         the pieces rank r wrote (safetensors: 8-byte header length,
//                                      JSON header, raw little-endian data), one generation per save
// A piece held by several ranks (replicas) is written once, by the rank whose coordinates on the
// replicating mesh dims are all 0.
//
// Atomicity: a save writes its generation's files under temporary names, fsyncs them, renames them,
// then rank 0 writes index.json.tmp, fsyncs it, renames it over index.json and fsyncs the directory:
// that rename is the commit. A crash at any point before it leaves the previous checkpoint loadable
// (its index still names its own generation); files of older generations are deleted after the
// commit, leftovers of a crashed save at the next save.
//
// Loading validates everything before anything is modified: the index (format, names, shapes,
// dtypes), every file it reads (size and CRC-32, safetensors header), that the pieces cover every
// element this rank needs; then the ranks agree (one all-reduce) and either every rank copies into
// its tensors or every rank throws: meshmuon::Error naming the file and the tensor ("[checkpoint]
// ckpt/3/rank-1.safetensors: tensor 'param/w1' ..."), ranks that were fine naming the rank that failed.
//
// COLLECTIVE over the world of the communicator given (a deadline on every wait). All ranks must
// see the same directory (a shared file system).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/box.h"
#include "meshmuon/comm.h"
#include "meshmuon/export.h"
#include "meshmuon/mesh.h"
#include "meshmuon/placement.h"
#include "meshmuon/tensor.h"

namespace meshmuon {

class Optimizer;
class ShardedParams;

// One tensor of a checkpoint as this rank holds it: a key unique in the checkpoint, the global shape
// and dtype, how it is placed (mesh + placements: its box on this rank is local_box(...)), and a view
// of the local data (contiguous, shape == the box's shape). Saving reads `data`; loading writes it.
//
// Device memory: a view whose data.device is not the CPU is never touched by the host. Its bytes
// move through `device_copy` (copy(dst, src, bytes): one side host memory, the other inside `data`;
// complete when it returns, e.g. the engine backend's copy): saving stages them into a bounded host
// buffer piece by piece before the CRC and the write; loading reads and verifies everything into
// host staging first (the all-or-nothing protocol below) and copies into `data` only after the
// ranks agreed. A device view without a device_copy is refused (std::invalid_argument naming the
// key). checkpoint_tensors() sets it from the engines' backend.
using CheckpointCopy = std::function<void(void* dst, const void* src, size_t bytes)>;

struct CheckpointTensor {
  std::string key;            // "param/<name>", "optim/<name>/<state key>", or the caller's own
  Shape global_shape;
  DType dtype = DType::F32;
  Mesh mesh;
  std::vector<Placement> placements;
  TensorView data;
  CheckpointCopy device_copy;  // required when data.device is not the CPU; ignored otherwise
};

struct CheckpointSaveOptions {
  // Free-form strings stored in the index (e.g. the trainer's config); read back by load.
  std::map<std::string, std::string> metadata;
  // Tests only: called at the named points of a save ("files_written", "files_renamed",
  // "index_written", "committed") on every rank; a hook that ends the process simulates a crash there.
  std::function<void(std::string_view point)> test_hook;
};

struct CheckpointInfo {
  int64_t step = 0;
  int world_size = 0;                 // of the job that saved it
  std::string mesh;                   // Mesh::to_string of the first tensor's mesh at save time
  std::string generation;             // the generation directory the index names
  std::map<std::string, std::string> metadata;
  std::vector<std::string> keys;      // every tensor key, in save order
  std::map<std::string, int64_t> step_counts;  // optimizer step count per parameter name
};

// COLLECTIVE. Writes `tensors` (every rank the same keys, shapes, dtypes, meshes and placements:
// checked with a digest, meshmuon::Error on every rank otherwise) and `step`; step_counts are stored
// as given (rank 0's). Throws std::invalid_argument naming the key for a view that does not match
// its box, meshmuon::Error for I/O errors (naming the file) on every rank.
MESHMUON_API void save_checkpoint(Communicator& comm, const std::string& dir, std::span<const CheckpointTensor> tensors,
                               int64_t step, const std::map<std::string, int64_t>& step_counts = {},
                               const CheckpointSaveOptions& options = {});

// COLLECTIVE. Fills every tensor's data from the checkpoint in `dir` (keys must exist with the same
// global shape; dtype conversion fp32 <-> bf16 is refused). Nothing is written unless every rank
// succeeded. Returns the index's information.
MESHMUON_API CheckpointInfo load_checkpoint(Communicator& comm, const std::string& dir,
                                         std::span<const CheckpointTensor> tensors);

// Local: the index only (validated), no tensor data read. Throws meshmuon::Error naming the file.
MESHMUON_API CheckpointInfo read_checkpoint_info(const std::string& dir);

// The tensors of a trainer built on ShardedParams and meshmuon::Optimizer: "param/<name>" for every
// master shard, "optim/<name>/<key>" for every optimizer state tensor (NorMuon's factored state
// placed like its parameter). `optimizer` may be null (parameters only). On a device backend the
// views are device memory and device_copy is the owning engine's backend copy.
MESHMUON_API std::vector<CheckpointTensor> checkpoint_tensors(ShardedParams& params, Optimizer* optimizer);

// COLLECTIVE over params' world: save / load everything above plus the optimizer's per-parameter
// step counts. Loading at another mesh or world size works as long as the parameter names and
// global shapes match.
MESHMUON_API void save_checkpoint(const std::string& dir, ShardedParams& params, Optimizer* optimizer, int64_t step,
                               const CheckpointSaveOptions& options = {});
MESHMUON_API CheckpointInfo load_checkpoint(const std::string& dir, ShardedParams& params, Optimizer* optimizer);

}  // namespace meshmuon
