// Reshardable checkpoints across world sizes (include/meshmuon/checkpoint.h), run by CTest as fixtures:
//   checkpoint_dist_test --save DIR             saves the test tensors in the layout of this world
//   checkpoint_dist_test --load DIR --saved-np N  loads them in the layout of this world, checks
//                                               every element bitwise against its formula
//   checkpoint_dist_test --errors DIR           a corrupt file on the last rank: every rank throws
//                                               (that rank naming file and tensor, the others the
//                                               rank), nobody's tensors change
// Each tensor's value is a function of (key, global index), so any N -> M reshard is checkable.
// Layouts by world size W: FSDP (dp_shard=W, Shard / StridedShard), and at W = 4 also HSDP
// (dp_replicate=2,dp_shard=2), TP-like [Shard(0), Shard(1)] and FSDP-over-TP [StridedShard, Shard].
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "../support/corrupt_file.h"
#include "core/hash.h"
#include "meshmuon/checkpoint.h"
#include "meshmuon/comm.h"
#include "meshmuon/error.h"
#include "verdict.h"

namespace {

using namespace meshmuon;

int g_failures = 0;
#define CHECK_TRUE(cond, ...)                                                   \
  do {                                                                          \
    if (!(cond)) {                                                              \
      ++g_failures;                                                             \
      std::fprintf(stderr, "[rank %d] check failed at line %d: %s: %s\n", g_rank, __LINE__, #cond, \
                   meshmuon::detail::concat(__VA_ARGS__).c_str());                 \
    }                                                                           \
  } while (0)
int g_rank = 0;

struct Spec {
  std::string key;
  Shape shape;
  DType dtype;
};

const std::vector<Spec>& specs() {
  static const std::vector<Spec> s = {
      {"fsdp/a", {7, 5}, DType::F32},     {"fsdp/b", {3, 9}, DType::BF16},  {"rep/c", {4, 3}, DType::F32},
      {"strided/d", {13, 4}, DType::F32}, {"mix/e", {9, 6}, DType::F32},    {"mix/f", {8, 6}, DType::BF16},
      {"mix/g", {8, 6}, DType::F32},      {"expert/h", {3, 5, 4}, DType::F32}, {"scalar", {1}, DType::F32}};
  return s;
}

// Mesh and placements of a key at world size w.
void layout(const std::string& key, int w, Mesh& mesh, std::vector<Placement>& pl) {
  const auto S = Placement::shard;
  const auto SS = Placement::strided_shard;
  const Placement R = Placement::replicate();
  const Mesh fsdp = Mesh::parse("dp_shard=" + std::to_string(w));
  mesh = fsdp;
  if (key == "fsdp/a") pl = {S(0)};
  else if (key == "fsdp/b") pl = {S(1)};
  else if (key == "rep/c") pl = {R};
  else if (key == "strided/d") pl = {SS(0, 2)};
  else if (key == "scalar") pl = {S(0)};
  else if (w == 4 && key == "mix/e") mesh = Mesh::parse("dp_replicate=2,dp_shard=2"), pl = {R, S(0)};
  else if (w == 4 && key == "mix/f") mesh = Mesh::parse("dp=2,tp=2"), pl = {S(0), S(1)};
  else if (w == 4 && key == "mix/g") mesh = Mesh::parse("dp=2,tp=2"), pl = {SS(0, 2), S(0)};
  else if (w == 4 && key == "expert/h") mesh = Mesh::parse("dp=2,tp=2"), pl = {S(0), S(2)};
  else if (key == "mix/e") pl = {S(0)};
  else if (key == "mix/f") pl = {S(1)};
  else if (key == "mix/g") pl = {SS(0, 3)};
  else pl = {S(1)};
}

uint64_t key_hash(const std::string& key) {
  detail::Fnv1a h;
  h.str(key);
  return h.h;
}

// The value of element `lin` (row-major global index) of `key`, as raw bits.
uint32_t f32_bits(uint64_t h, int64_t lin) {
  const float v = static_cast<float>((h ^ (static_cast<uint64_t>(lin) * 2654435761u)) % (1u << 20)) / 16.0f - 1000.0f;
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}
uint16_t bf16_bits(uint64_t h, int64_t lin) { return static_cast<uint16_t>((h + static_cast<uint64_t>(lin) * 40503u) & 0x7f7f); }

// This rank's tensors of the world-`w` layout, in owned buffers.
struct Local {
  Spec spec;
  Box box;
  Mesh mesh;
  std::vector<Placement> pl;
  std::vector<std::byte> data;
  CheckpointTensor view() {
    return {spec.key, spec.shape, spec.dtype, mesh, pl, TensorView(data.data(), spec.dtype, box.shape())};
  }
};

// Row-major global index of each local element of `box`.
std::vector<int64_t> global_indices(const Shape& shape, const Box& box) {
  std::vector<int64_t> out;
  const int nd = shape.ndim();
  const int64_t n = box.numel();
  std::vector<int64_t> pos(static_cast<size_t>(nd), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t lin = 0;
    for (int d = 0; d < nd; ++d) lin = lin * shape[d] + box.dims[static_cast<size_t>(d)].at(pos[static_cast<size_t>(d)]);
    out.push_back(lin);
    for (int d = nd - 1; d >= 0; --d) {
      if (++pos[static_cast<size_t>(d)] < box.dims[static_cast<size_t>(d)].size()) break;
      pos[static_cast<size_t>(d)] = 0;
    }
  }
  return out;
}

std::vector<Local> make_locals(int rank, int w, bool fill) {
  std::vector<Local> out;
  for (const Spec& s : specs()) {
    Local l;
    l.spec = s;
    layout(s.key, w, l.mesh, l.pl);
    l.box = local_box(s.shape, l.pl, l.mesh, rank);
    const std::vector<int64_t> idx = global_indices(s.shape, l.box);
    l.data.assign(idx.size() * dtype_size(s.dtype), std::byte{0xAB});
    if (fill) {
      const uint64_t h = key_hash(s.key);
      for (size_t k = 0; k < idx.size(); ++k) {
        if (s.dtype == DType::F32) {
          const uint32_t b = f32_bits(h, idx[k]);
          std::memcpy(l.data.data() + 4 * k, &b, 4);
        } else {
          const uint16_t b = bf16_bits(h, idx[k]);
          std::memcpy(l.data.data() + 2 * k, &b, 2);
        }
      }
    }
    out.push_back(std::move(l));
  }
  return out;
}

std::vector<CheckpointTensor> views(std::vector<Local>& locals) {
  std::vector<CheckpointTensor> v;
  for (Local& l : locals) v.push_back(l.view());
  return v;
}

void check_values(const std::vector<Local>& locals) {
  for (const Local& l : locals) {
    const std::vector<int64_t> idx = global_indices(l.spec.shape, l.box);
    const uint64_t h = key_hash(l.spec.key);
    int64_t bad = 0;
    for (size_t k = 0; k < idx.size(); ++k) {
      if (l.spec.dtype == DType::F32) {
        uint32_t b;
        std::memcpy(&b, l.data.data() + 4 * k, 4);
        bad += b != f32_bits(h, idx[k]);
      } else {
        uint16_t b;
        std::memcpy(&b, l.data.data() + 2 * k, 2);
        bad += b != bf16_bits(h, idx[k]);
      }
    }
    CHECK_TRUE(bad == 0, "tensor '", l.spec.key, "' box ", l.box.to_string(), ": ", bad, " of ", idx.size(),
               " elements differ");
  }
}

void run_save(Communicator& comm, const std::string& dir) {
  std::vector<Local> locals = make_locals(comm.rank(), comm.size(), true);
  save_checkpoint(comm, dir, views(locals), 100 + comm.size(), {{"w", 7}}, {{{"np", std::to_string(comm.size())}}, {}});
}

void run_load(Communicator& comm, const std::string& dir, int saved_np) {
  std::vector<Local> locals = make_locals(comm.rank(), comm.size(), false);
  const CheckpointInfo info = load_checkpoint(comm, dir, views(locals));
  check_values(locals);
  CHECK_TRUE(info.world_size == saved_np, "world_size ", info.world_size);
  CHECK_TRUE(info.step == 100 + saved_np, "step ", info.step);
  CHECK_TRUE(info.metadata.count("np") && info.metadata.at("np") == std::to_string(saved_np), "metadata");
  CHECK_TRUE(info.step_counts.count("w") && info.step_counts.at("w") == 7, "step_counts");
  CHECK_TRUE(info.keys.size() == specs().size(), "keys ", info.keys.size());
}

void run_errors(Communicator& comm, const std::string& dir) {
  const int last = comm.size() - 1;
  std::vector<Local> saved = make_locals(comm.rank(), comm.size(), true);
  // Ranks that disagree on the tensors: every rank throws, nothing is written.
  {
    std::vector<CheckpointTensor> v = views(saved);
    if (comm.rank() == last) v[0].key = "other";
    try {
      save_checkpoint(comm, dir, v, 1);
      CHECK_TRUE(false, "save succeeded with different keys");
    } catch (const Error& e) {
      const std::string m = e.what();
      CHECK_TRUE(m.find("ranks passed different tensors") != std::string::npos, m);
      CHECK_TRUE(m.find("'other'") != std::string::npos && m.find("rank " + std::to_string(last)) != std::string::npos,
                 "the error names the differing tensor and the rank: " + m);
    }
    CHECK_TRUE(!std::filesystem::exists(dir + "/index.json"), "index written");
  }
  // A caller mistake on one rank: that rank's std::invalid_argument, the others name it.
  {
    std::vector<CheckpointTensor> v = views(saved);
    if (comm.rank() == last) v[0].data.shape = Shape({1, 1, 1});
    try {
      save_checkpoint(comm, dir, v, 1);
      CHECK_TRUE(false, "save succeeded with a bad view");
    } catch (const std::invalid_argument& e) {
      CHECK_TRUE(comm.rank() == last && std::string(e.what()).find("'fsdp/a'") != std::string::npos, e.what());
    } catch (const Error& e) {
      CHECK_TRUE(comm.rank() != last && std::string(e.what()).find("rank " + std::to_string(last) + " failed") !=
                                             std::string::npos, e.what());
    }
  }
  save_checkpoint(comm, dir, views(saved), 1);
  const CheckpointInfo info = read_checkpoint_info(dir);
  const std::string file = dir + "/" + info.generation + "/rank-" + std::to_string(last) + ".safetensors";
  if (comm.rank() == 0) {  // flip a byte of the last rank's file
    test::flip_bits_near_end(file, 2, 0x40);
  }
  comm.barrier("corrupted").wait();
  std::vector<Local> targets = make_locals(comm.rank(), comm.size(), false);
  std::vector<std::vector<std::byte>> before;
  for (const Local& l : targets) before.push_back(l.data);
  try {
    load_checkpoint(comm, dir, views(targets));
    CHECK_TRUE(false, "load succeeded despite the corrupt file");
  } catch (const Error& e) {
    const std::string msg = e.what();
    // Only the last rank (and ranks that read its file) see the CRC error themselves.
    CHECK_TRUE(msg.find(file) != std::string::npos, msg);
    CHECK_TRUE(msg.find("CRC-32") != std::string::npos, msg);
    if (comm.rank() == last) CHECK_TRUE(msg.rfind("[checkpoint] " + file + ": tensor '", 0) == 0, msg);
    else if (msg.rfind("[checkpoint] " + file, 0) != 0)
      CHECK_TRUE(msg.find("rank " + std::to_string(last) + " failed") != std::string::npos, msg);
  }
  for (size_t i = 0; i < targets.size(); ++i)
    CHECK_TRUE(targets[i].data == before[i], "tensor '", targets[i].spec.key, "' was modified");

  // An I/O error on the last rank during a save (its temporary file vanishes before the rename):
  // every rank throws naming that rank's file; the committed checkpoint stays the previous one.
  CheckpointSaveOptions opt;
  opt.test_hook = [&](std::string_view point) {
    if (point != "files_written" || comm.rank() != last) return;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
      if (e.path().filename() == "rank-" + std::to_string(last) + ".safetensors.tmp") std::filesystem::remove(e.path());
  };
  try {
    save_checkpoint(comm, dir, views(saved), 2, {}, opt);
    CHECK_TRUE(false, "save succeeded without its file");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK_TRUE(msg.find("/rank-" + std::to_string(last) + ".safetensors") != std::string::npos, msg);
    if (comm.rank() != last) CHECK_TRUE(msg.find("rank " + std::to_string(last) + " failed") != std::string::npos, msg);
  }
  CHECK_TRUE(read_checkpoint_info(dir).generation == info.generation, "the index changed");
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, dir;
  int saved_np = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--save" || a == "--load" || a == "--errors") mode = a.substr(2), dir = argv[i + 1];
    else if (a == "--saved-np") saved_np = std::stoi(argv[i + 1]);
  }
  if (mode.empty()) {
    std::fprintf(stderr, "usage: %s --save DIR | --load DIR --saved-np N | --errors DIR\n", argv[0]);
    return 2;
  }
  const char* backend = std::getenv("MESHMUON_TEST_BACKEND");
  auto comm = make_communicator(backend != nullptr && *backend != '\0' ? backend : "mpi");
  comm->set_default_timeout(std::chrono::seconds(30));
  g_rank = comm->rank();
  try {
    if (mode == "save") run_save(*comm, dir);
    else if (mode == "load") run_load(*comm, dir, saved_np);
    else {
      if (comm->rank() == 0) std::filesystem::remove_all(dir);
      comm->barrier("clean").wait();
      run_errors(*comm, dir);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s: %s\n", g_rank, mode.c_str(), e.what());
    ++g_failures;
  }
  const int code = meshmuon::test::agree_verdict(*comm, g_failures, "checkpoint " + mode + " at " + std::to_string(comm->size()) + " ranks");
  comm.reset();
  return code;
}
