// save_checkpoint (checkpoint.h): validate and agree, write this rank's pieces under a new
// generation (temporary name, fsync, rename), gather sizes and CRCs, commit index.json on rank 0
// (temporary name, fsync, rename, fsync of the directory), then delete the other generations.
// Device views are staged to host through their device_copy, a bounded buffer at a time, as the
// file is written (safetensors_io.h).
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <vector>

#include "meshmuon/checkpoint.h"
#include "meshmuon/error.h"
#include "comm/agreement.h"
#include "checkpoint/common.h"
#include "checkpoint/index.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors_io.h"

namespace meshmuon {
namespace {

using namespace detail;

// What every rank must pass alike, one line per tensor (keys in order, global shapes, dtypes,
// meshes, placements).
std::string tensor_line(const CheckpointTensor& t) {
  std::string l = concat("'", t.key, "' ", t.global_shape.to_string(), " ", to_string(t.dtype), " mesh ", t.mesh.to_string(), " [");
  for (size_t i = 0; i < t.placements.size(); ++i) l += concat(i ? "," : "", to_string(t.placements[i]));
  return l + "]";
}

std::string new_generation(int64_t step) {
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(rng()));
  return concat("g", step < 0 ? 0 : step, "-", hex);
}

// Rank 0 deletes every generation directory but `keep` and a stale index.json.tmp (best effort:
// the checkpoint is committed already).
void remove_other_generations(const std::string& dir, const std::string& keep) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name != keep && is_generation_name(name) && it->is_directory(ec)) {
      std::error_code ignored;
      fs::remove_all(it->path(), ignored);
    }
  }
  std::error_code ignored;
  fs::remove(join_path(dir, std::string(kIndexFile) + ".tmp"), ignored);
}

}  // namespace

void save_checkpoint(Communicator& comm, const std::string& dir_in, std::span<const CheckpointTensor> tensors,
                     int64_t step, const std::map<std::string, int64_t>& step_counts,
                     const CheckpointSaveOptions& options) {
  const int rank = comm.rank(), world = comm.size();
  const auto hook = [&](std::string_view point) {
    if (options.test_hook) options.test_hook(point);
  };
  const std::string context = concat("save to '", dir_in, "'");

  // 1. Local checks, and the description of what every rank must pass alike.
  LocalFailure failure;
  std::string dir;
  std::vector<Box> boxes(tensors.size());
  std::vector<std::string> lines{concat(tensors.size(), " tensors")};
  try {
    dir = normalize_dir(dir_in);
    std::set<std::string_view> keys;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const CheckpointTensor& t = tensors[i];
      MESHMUON_CHECK(keys.insert(t.key).second, "[checkpoint] tensor '", t.key, "' is given twice");
      boxes[i] = checkpoint_box(t, rank, world);
      check_view(t, boxes[i]);
      lines.push_back(tensor_line(t));
    }
  } catch (...) {
    failure.capture();
  }
  agree_on_failure(comm, failure, "[checkpoint]", context);
  agree_on_lines(comm, comm.default_timeout(), lines, concat("[checkpoint] ", context, ": ranks passed different tensors"),
                 "every rank passes the same keys in the same order, with the same global shapes, dtypes, meshes and placements");

  // 2. The generation, named by rank 0.
  char gen_buf[64] = {};
  if (rank == 0) {
    const std::string g = new_generation(step);
    std::memcpy(gen_buf, g.data(), g.size());
  }
  comm.broadcast(OutBuffer(gen_buf, CommType::U8, sizeof(gen_buf)), 0, "checkpoint generation").wait();
  gen_buf[sizeof(gen_buf) - 1] = '\0';
  const std::string generation = gen_buf;
  const std::string gen_dir = join_path(dir, generation);
  const std::string my_file = join_path(dir, rank_file_name(generation, rank));

  // 3. This rank's file: the pieces it writes (replicas once), under a temporary name.
  std::vector<SafetensorsTensor> pieces;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const CheckpointTensor& t = tensors[i];
    if (boxes[i].numel() > 0 && writes_piece(t.mesh, t.placements, rank))
      pieces.push_back({t.key, t.dtype, boxes[i].shape(), t.data.data, on_device(t) ? &t.device_copy : nullptr});
  }
  WrittenFile written;
  try {
    make_dirs(gen_dir);
    if (!pieces.empty()) {
      const std::map<std::string, std::string> meta = {
          {"format", std::string(kCheckpointFormat)}, {"generation", generation}, {"rank", std::to_string(rank)}};
      written = write_safetensors(my_file + ".tmp", pieces, meta);
    }
  } catch (...) {
    failure.capture();
  }
  hook("files_written");
  if (!failure && !pieces.empty()) {
    try {
      rename_file(my_file + ".tmp", my_file);
      sync_dir(gen_dir);
    } catch (...) {
      failure.capture();
    }
  }
  hook("files_renamed");

  // 4. Every rank's outcome, file size and CRC (the boxes every rank computes itself).
  uint64_t mine[4] = {failure ? 1u : 0u, pieces.empty() ? 0u : 1u, written.size, written.crc32};
  std::vector<uint64_t> all(static_cast<size_t>(world) * 4);
  comm.all_gather(InBuffer(mine, CommType::U64, 4), OutBuffer(all.data(), CommType::U64, all.size()),
                  "checkpoint files").wait();
  for (int r = world - 1; r >= 0; --r)
    if (all[static_cast<size_t>(r) * 4] != 0)
      throw_failure_of(comm, r, failure, "[checkpoint]", concat(context, ": ", join_path(dir, rank_file_name(generation, r))));

  // 5. Rank 0 commits the index.
  if (rank == 0) {
    try {
      CheckpointIndex idx;
      idx.step = step;
      idx.world_size = world;
      idx.mesh = tensors.empty() ? Mesh().to_string() : tensors[0].mesh.to_string();
      idx.generation = generation;
      idx.metadata = options.metadata;
      idx.step_counts = step_counts;
      for (int r = 0; r < world; ++r) {
        const size_t k = static_cast<size_t>(r) * 4;
        if (all[k + 1] != 0)
          idx.files.push_back({rank_file_name(generation, r), r, all[k + 2], static_cast<uint32_t>(all[k + 3])});
      }
      for (const CheckpointTensor& t : tensors) {
        IndexTensor it;
        it.key = t.key;
        it.dtype = t.dtype;
        it.shape = t.global_shape;
        it.mesh = t.mesh.to_string();
        it.placements = t.placements;
        for (int r = 0; r < world; ++r) {
          if (!writes_piece(t.mesh, t.placements, r)) continue;
          Box b = local_box(t.global_shape, t.placements, t.mesh, r);
          if (b.numel() == 0) continue;
          MESHMUON_CHECK_RUNTIME(all[static_cast<size_t>(r) * 4 + 1] != 0, "[checkpoint] ", context, ": rank ", r,
                              " wrote no file but holds a piece of '", t.key, "'");
          it.pieces.push_back({rank_file_name(generation, r), t.key, std::move(b)});
        }
        idx.tensors.push_back(std::move(it));
      }
      const std::string text = index_to_json(idx);
      const std::string tmp = join_path(dir, std::string(kIndexFile) + ".tmp");
      File f = File::create(tmp);
      f.write_all(text.data(), text.size());
      f.sync();
      f.close();
      hook("index_written");
      rename_file(tmp, join_path(dir, kIndexFile));  // the commit
      sync_dir(dir);
    } catch (...) {
      failure.capture();
    }
  } else {
    hook("index_written");
  }
  agree_on_failure(comm, failure, "[checkpoint]", concat(context, ": ", join_path(dir, kIndexFile)));
  hook("committed");

  // 6. Older generations and leftovers of crashed saves (every rank has passed the agreement).
  if (rank == 0) remove_other_generations(dir, generation);
}

}  // namespace meshmuon
