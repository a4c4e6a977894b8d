// load_checkpoint and read_checkpoint_info (checkpoint.h): read and validate the index, read the
// files this rank needs (size, CRC-32, safetensors header, each piece's dtype and shape), copy the
// intersections of their pieces with this rank's boxes into staging buffers, check that every
// element is covered exactly once, agree over the world, and only then copy into the targets
// (device views through their device_copy, checkpoint.h).
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "meshmuon/checkpoint.h"
#include "meshmuon/error.h"
#include "checkpoint/box_copy.h"
#include "checkpoint/common.h"
#include "checkpoint/index.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors_io.h"

namespace meshmuon {
namespace {

using namespace detail;

CheckpointIndex read_index(const std::string& dir) {
  const std::string path = join_path(dir, kIndexFile);
  return parse_index(read_text_file(path), path);
}

CheckpointInfo info_of(const CheckpointIndex& idx) {
  CheckpointInfo info;
  info.step = idx.step;
  info.world_size = idx.world_size;
  info.mesh = idx.mesh;
  info.generation = idx.generation;
  info.metadata = idx.metadata;
  info.step_counts = idx.step_counts;
  for (const IndexTensor& t : idx.tensors) info.keys.push_back(t.key);
  return info;
}

struct Target {
  const CheckpointTensor* tensor = nullptr;
  const IndexTensor* saved = nullptr;
  Box box;
  std::vector<std::byte> staging;
  std::vector<uint8_t> coverage;  // per element: how many pieces wrote it (saturating)
};

// A piece of a saved tensor that some target of this rank needs.
struct Need {
  size_t target = 0;
  const IndexPiece* piece = nullptr;
};

// Rethrows a file operation's error ("[checkpoint] <path>: <what>") as "[checkpoint] <path>:
// tensor '<key>': <what>".
[[noreturn]] void fail_file(const std::string& path, const std::string& key, const std::string& what) {
  throw_error(concat("[checkpoint] ", path, ": tensor '", key, "': ", what));
}

std::string strip_prefix(const std::string& message, const std::string& path) {
  const std::string prefix = concat("[checkpoint] ", path, ": ");
  return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
}

void read_file_pieces(const std::string& dir, const IndexFile& file, std::span<const Need> needs,
                      std::vector<Target>& targets) {
  const std::string path = join_path(dir, file.path);
  const std::string* key_in_work = &targets[needs.front().target].tensor->key;  // for the messages
  try {
    File f = File::open_read(path);
    const uint64_t size = f.size();
    if (size != file.size)
      fail_file(path, *key_in_work, concat("the file has ", size, " bytes, the index says ", file.size,
                                        size < file.size ? " (truncated)" : " (overwritten?)"));
    const uint32_t crc = file_crc32(f, size);
    if (crc != file.crc32)
      fail_file(path, *key_in_work, concat("CRC-32 ", crc, " does not match the index's ", file.crc32, " (corrupt file)"));
    const SafetensorsHeader header = read_safetensors_header(f, size);
    std::vector<std::byte> buffer;
    for (const Need& n : needs) {
      Target& t = targets[n.target];
      const std::string& key = t.tensor->key;
      key_in_work = &key;
      const auto it = header.tensors.find(n.piece->name);
      if (it == header.tensors.end())
        fail_file(path, key, concat("the file has no tensor '", n.piece->name, "'"));
      const SafetensorsEntry& e = it->second;
      const Shape piece_shape = n.piece->box.shape();
      if (e.dtype != t.saved->dtype)
        fail_file(path, key, concat("the piece is ", safetensors_dtype(e.dtype), ", the index says ",
                                    safetensors_dtype(t.saved->dtype)));
      if (!(e.shape == piece_shape))
        fail_file(path, key, concat("the piece has shape ", e.shape.to_string(), ", its box ",
                                    n.piece->box.to_string(), " in the index has shape ", piece_shape.to_string()));
      const size_t es = dtype_size(e.dtype);
      if (n.piece->box == t.box) {  // the same box: straight into staging
        f.read_at(t.staging.data(), static_cast<size_t>(e.nbytes), e.offset);
        for (uint8_t& c : t.coverage)
          if (c != 255) ++c;
        continue;
      }
      // Only the rows (dim 0 positions) of the piece that the target needs are read.
      Box part = n.piece->box;
      uint64_t offset = e.offset, nbytes = e.nbytes;
      if (!part.dims.empty() && part.dims[0].size() > 0) {
        int64_t lo = part.dims[0].size(), hi = 0;
        for (const DimMatch& m : match_dim(part.dims[0], t.box.dims[0])) {
          lo = std::min(lo, m.src_pos);
          hi = std::max(hi, m.src_pos + m.len);
        }
        if (lo >= hi) continue;
        const uint64_t row_bytes = e.nbytes / static_cast<uint64_t>(part.dims[0].size());
        part.dims[0] = part.dims[0].slice(lo, hi);
        offset += static_cast<uint64_t>(lo) * row_bytes;
        nbytes = static_cast<uint64_t>(hi - lo) * row_bytes;
      }
      buffer.resize(static_cast<size_t>(nbytes));
      f.read_at(buffer.data(), buffer.size(), offset);
      copy_box_intersection(buffer.data(), part, t.staging.data(), t.box, es, t.coverage.data());
    }
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find(": tensor '") != std::string::npos) throw;
    fail_file(path, *key_in_work, strip_prefix(msg, path));
  }
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& dir) { return info_of(read_index(normalize_dir(dir))); }

CheckpointInfo load_checkpoint(Communicator& comm, const std::string& dir,
                               std::span<const CheckpointTensor> tensors) {
  return detail::load_checkpoint_checked(comm, dir, tensors, {});
}

CheckpointInfo detail::load_checkpoint_checked(Communicator& comm, const std::string& dir_in,
                                               std::span<const CheckpointTensor> tensors,
                                               const std::function<void(const CheckpointInfo&)>& check) {
  const int rank = comm.rank(), world = comm.size();
  LocalFailure failure;
  CheckpointInfo info;
  std::vector<Target> targets(tensors.size());
  try {
    const std::string dir = normalize_dir(dir_in);
    const std::string index_path = join_path(dir, kIndexFile);
    // Targets first (caller mistakes), then the index.
    std::set<std::string_view> keys;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const CheckpointTensor& t = tensors[i];
      MESHMUON_CHECK(keys.insert(t.key).second, "[checkpoint] tensor '", t.key, "' is given twice");
      targets[i].tensor = &t;
      targets[i].box = checkpoint_box(t, rank, world);
      check_view(t, targets[i].box);
    }
    const CheckpointIndex idx = read_index(dir);
    info = info_of(idx);
    if (check) check(info);
    std::map<std::string_view, const IndexTensor*> saved;
    for (const IndexTensor& t : idx.tensors) saved.emplace(t.key, &t);
    std::map<std::string_view, const IndexFile*> files;
    for (const IndexFile& f : idx.files) files.emplace(f.path, &f);

    std::map<std::string_view, std::vector<Need>> needs;  // by file, in path order
    for (size_t i = 0; i < targets.size(); ++i) {
      Target& t = targets[i];
      const std::string& key = t.tensor->key;
      const auto it = saved.find(key);
      if (it == saved.end())
        throw_error(concat("[checkpoint] ", index_path, ": tensor '", key, "': not in the checkpoint (it holds ",
                           idx.tensors.size(), " tensors)"));
      t.saved = it->second;
      if (!(t.saved->shape == t.tensor->global_shape))
        throw_error(concat("[checkpoint] ", index_path, ": tensor '", key, "': global shape ",
                           t.saved->shape.to_string(), " in the checkpoint, ", t.tensor->global_shape.to_string(),
                           " expected"));
      if (t.saved->dtype != t.tensor->dtype)
        throw_error(concat("[checkpoint] ", index_path, ": tensor '", key, "': dtype ", to_string(t.saved->dtype),
                           " in the checkpoint, ", to_string(t.tensor->dtype),
                           " expected (fp32 <-> bf16 conversion is refused)"));
      const int64_t numel = t.box.numel();
      t.staging.resize(static_cast<size_t>(numel) * dtype_size(t.tensor->dtype));
      t.coverage.assign(static_cast<size_t>(numel), 0);
      if (numel == 0) continue;
      for (const IndexPiece& p : t.saved->pieces)
        if (boxes_intersect(p.box, t.box)) needs[p.file].push_back({i, &p});
    }
    for (const auto& [file, list] : needs) read_file_pieces(dir, *files.at(file), list, targets);
    for (const Target& t : targets) {
      int64_t missing = 0, twice = 0;
      for (uint8_t c : t.coverage) {
        missing += c == 0;
        twice += c > 1;
      }
      if (missing > 0 || twice > 0)
        throw_error(concat("[checkpoint] ", index_path, ": tensor '", t.tensor->key, "': of the ", t.coverage.size(),
                           " elements of rank ", rank, "'s box ", t.box.to_string(), ", ", missing,
                           " are in no piece and ", twice, " in more than one"));
    }
  } catch (...) {
    failure.capture();
  }
  agree_on_failure(comm, failure, "[checkpoint]", concat("load from '", dir_in, "'"));
  // Every rank verified everything in host staging: only now the targets are written (device
  // views through their device_copy; the host never touches their memory).
  for (Target& t : targets) {
    if (t.staging.empty()) continue;
    if (on_device(*t.tensor)) {
      t.tensor->device_copy(t.tensor->data.data, t.staging.data(), t.staging.size());
    } else {
      std::memcpy(t.tensor->data.data, t.staging.data(), t.staging.size());
    }
  }
  return info;
}

}  // namespace meshmuon
