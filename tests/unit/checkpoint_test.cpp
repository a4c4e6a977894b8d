// Checkpoints (include/meshmuon/checkpoint.h) on one rank: the safetensors files, save/load round
// trips, box intersections for multi-rank layouts (resharding simulated locally), the errors
// (naming file and tensor, target untouched) and crash atomicity (a forked child that dies mid-save).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "meshmuon/bf16.h"
#include "meshmuon/checkpoint.h"
#include "meshmuon/error.h"
#include "meshmuon/mesh_comms.h"
#include "meshmuon/optimizer.h"
#include "meshmuon/sharded_params.h"
#include "meshmuon/update.h"
#include "checkpoint/box_copy.h"
#include "checkpoint/index.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors_io.h"
#include "../support/temp_dir.h"

namespace meshmuon {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed at the end.
struct TempDir : test::TempDir {
  TempDir() : test::TempDir("meshmuon_ckpt_") {}
};

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Owned data for one checkpoint tensor on the one-rank mesh.
struct Owned {
  std::string key;
  Shape shape;
  DType dtype;
  std::vector<float> f;
  std::vector<BFloat16> b;
  void fill(uint32_t seed) {
    const int64_t n = shape.numel();
    f.assign(static_cast<size_t>(dtype == DType::F32 ? n : 0), 0.0f);
    b.assign(static_cast<size_t>(dtype == DType::BF16 ? n : 0), BFloat16{});
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>((static_cast<int64_t>(seed) * 131 + i * 7) % 1009) / 8.0f - 60.0f;
      if (dtype == DType::F32) f[static_cast<size_t>(i)] = v;
      else b[static_cast<size_t>(i)] = float_to_bf16(v);
    }
  }
  CheckpointTensor tensor() {
    void* data = dtype == DType::F32 ? static_cast<void*>(f.data()) : static_cast<void*>(b.data());
    return {key, shape, dtype, Mesh(), {}, TensorView(data, dtype, shape)};
  }
  std::vector<char> bytes() const {
    const char* p = dtype == DType::F32 ? reinterpret_cast<const char*>(f.data()) : reinterpret_cast<const char*>(b.data());
    return std::vector<char>(p, p + shape.numel() * static_cast<int64_t>(dtype_size(dtype)));
  }
};

std::vector<Owned> make_set(uint32_t seed) {
  std::vector<Owned> s = {{"param/w1", {5, 7}, DType::F32, {}, {}},
                          {"param/emb", {3, 2, 4}, DType::BF16, {}, {}},
                          {"optim/w1/momentum_buffer", {5, 7}, DType::F32, {}, {}},
                          {"scalar", {1}, DType::F32, {}, {}},
                          {"zero_dim", Shape(), DType::F32, {}, {}},
                          {"empty", {0, 4}, DType::BF16, {}, {}}};
  for (size_t i = 0; i < s.size(); ++i) s[i].fill(seed + static_cast<uint32_t>(i));
  return s;
}

std::vector<CheckpointTensor> views(std::vector<Owned>& set) {
  std::vector<CheckpointTensor> v;
  for (Owned& o : set) v.push_back(o.tensor());
  return v;
}

// ---------------------------------------------------------------------------------------------
// safetensors

TEST(Safetensors, RoundTripAndValidFormat) {
  TempDir dir;
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  std::vector<BFloat16> b = {float_to_bf16(1.0f), float_to_bf16(-3.0f), float_to_bf16(0.5f), float_to_bf16(9.0f)};
  const std::vector<detail::SafetensorsTensor> ts = {{"a", DType::F32, {2, 3}, a.data()},
                                                     {"b.bf16", DType::BF16, {4}, b.data()},
                                                     {"empty", DType::F32, {0, 3}, nullptr}};
  const std::string path = dir / "x.safetensors";
  const detail::WrittenFile w = detail::write_safetensors(path, ts, {{"k", "v"}});
  const std::vector<char> bytes = read_bytes(path);
  ASSERT_EQ(w.size, bytes.size());
  EXPECT_EQ(w.crc32, detail::crc32_update(0, bytes.data(), bytes.size()));

  // The format by hand: u64 LE header length, JSON header, data.
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  ASSERT_LE(8 + len, bytes.size());
  EXPECT_EQ((8 + len) % 8, 0u);
  const nlohmann::json h = nlohmann::json::parse(std::string(bytes.data() + 8, len));
  EXPECT_EQ(h["__metadata__"]["k"], "v");
  EXPECT_EQ(h["a"]["dtype"], "F32");
  EXPECT_EQ(h["a"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(h["a"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(h["b.bf16"]["dtype"], "BF16");
  EXPECT_EQ(h["b.bf16"]["data_offsets"], nlohmann::json({24, 32}));
  EXPECT_EQ(h["empty"]["data_offsets"], nlohmann::json({32, 32}));
  EXPECT_EQ(bytes.size(), 8 + len + 32);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + len, a.data(), 24), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + len + 24, b.data(), 8), 0);

  // The reader.
  detail::File f = detail::File::open_read(path);
  const detail::SafetensorsHeader hdr = detail::read_safetensors_header(f, f.size());
  ASSERT_EQ(hdr.tensors.size(), 3u);
  EXPECT_EQ(hdr.metadata.at("k"), "v");
  const auto& eb = hdr.tensors.at("b.bf16");
  EXPECT_EQ(eb.dtype, DType::BF16);
  EXPECT_EQ(eb.shape, Shape({4}));
  std::vector<BFloat16> back(4);
  f.read_at(back.data(), 8, eb.offset);
  EXPECT_EQ(back, b);
}

TEST(Safetensors, RejectsBadHeaders) {
  const auto expect_bad = [](const std::string& json, uint64_t data, const std::string& needle) {
    try {
      detail::parse_safetensors_header(json, 8 + json.size() + data, "f.safetensors");
      ADD_FAILURE() << "accepted " << json;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("f.safetensors"), std::string::npos) << e.what();
    }
  };
  expect_bad("{not json", 0, "not JSON");
  expect_bad(R"({"a": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8, "F64");
  expect_bad(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8, "needs 12");
  expect_bad(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8, "outside");
  expect_bad(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})", 0, "bad extent");
}

// ---------------------------------------------------------------------------------------------
// save / load on one rank

TEST(Checkpoint, SaveLoadRoundTripFp32Bf16) {
  TempDir dir;
  auto comm = make_single_communicator();
  std::vector<Owned> saved = make_set(1);
  const auto tv = views(saved);
  CheckpointSaveOptions opt;
  opt.metadata = {{"config", "{\"lr\": 0.02}"}};
  save_checkpoint(*comm, dir.path(), tv, 42, {{"w1", 41}}, opt);

  // index.json is valid JSON with the schema's header.
  const nlohmann::json idx = nlohmann::json::parse(read_bytes(dir / "index.json"));
  EXPECT_EQ(idx["format"], "meshmuon-checkpoint");
  EXPECT_EQ(idx["version"], 1);
  EXPECT_EQ(idx["step"], 42);

  std::vector<Owned> loaded = make_set(1);
  for (Owned& o : loaded) o.fill(999);
  const CheckpointInfo info = load_checkpoint(*comm, dir.path(), views(loaded));
  for (size_t i = 0; i < saved.size(); ++i) EXPECT_EQ(saved[i].bytes(), loaded[i].bytes()) << saved[i].key;
  EXPECT_EQ(info.step, 42);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.step_counts.at("w1"), 41);
  EXPECT_EQ(info.metadata.at("config"), "{\"lr\": 0.02}");
  EXPECT_EQ(info.keys, (std::vector<std::string>{"param/w1", "param/emb", "optim/w1/momentum_buffer", "scalar",
                                                 "zero_dim", "empty"}));
  const CheckpointInfo info2 = read_checkpoint_info(dir.path() + "/");
  EXPECT_EQ(info2.generation, info.generation);
  EXPECT_TRUE(fs::exists(dir / (info.generation + "/rank-0.safetensors")));

  // A subset of the keys loads too; a second save replaces the first and deletes its generation.
  std::vector<Owned> sub = {saved[1]};
  sub[0].fill(5);
  load_checkpoint(*comm, dir.path(), views(sub));
  EXPECT_EQ(sub[0].bytes(), saved[1].bytes());
  std::vector<Owned> second = make_set(2);
  save_checkpoint(*comm, dir.path(), views(second), 43);
  const CheckpointInfo info3 = read_checkpoint_info(dir.path());
  EXPECT_NE(info3.generation, info.generation);
  EXPECT_FALSE(fs::exists(dir / info.generation));
  load_checkpoint(*comm, dir.path(), views(loaded));
  for (size_t i = 0; i < saved.size(); ++i) EXPECT_EQ(second[i].bytes(), loaded[i].bytes()) << saved[i].key;
}

TEST(Checkpoint, SaveRejectsBadViews) {
  TempDir dir;
  auto comm = make_single_communicator();
  std::vector<Owned> set = make_set(1);
  auto tv = views(set);
  tv[0].data.shape = Shape({7, 5});
  try {
    save_checkpoint(*comm, dir.path(), tv, 1);
    ADD_FAILURE() << "accepted a view of the wrong shape";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'param/w1'"), std::string::npos) << e.what();
  }
  tv = views(set);
  tv[1].key = tv[0].key;
  EXPECT_THROW(save_checkpoint(*comm, dir.path(), tv, 1), std::invalid_argument);
  EXPECT_FALSE(fs::exists(dir / "index.json"));
}

// ---------------------------------------------------------------------------------------------
// Box intersections: several ranks' layouts simulated locally.

TEST(BoxCopy, MatchDim) {
  IndexSet a;
  a.append({0, 2});
  a.append({6, 8});
  IndexSet b(Range{1, 7});
  const auto m = detail::match_dim(a, b);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].src_pos, 1);
  EXPECT_EQ(m[0].dst_pos, 0);
  EXPECT_EQ(m[0].len, 1);
  EXPECT_EQ(m[1].src_pos, 2);
  EXPECT_EQ(m[1].dst_pos, 5);
  EXPECT_EQ(m[1].len, 1);
  EXPECT_TRUE(detail::match_dim(IndexSet(Range{0, 3}), IndexSet(Range{3, 5})).empty());
  EXPECT_TRUE(detail::match_dim(IndexSet(), IndexSet(Range{0, 5})).empty());
}

float global_value(const Shape& shape, std::span<const int64_t> idx) {
  int64_t lin = 0;
  for (int d = 0; d < shape.ndim(); ++d) lin = lin * shape[d] + idx[static_cast<size_t>(d)];
  return static_cast<float>(lin) * 0.5f + 1.0f;
}

// Every element of the box, row-major over its local shape, from global_value.
std::vector<float> fill_box(const Shape& shape, const Box& box) {
  std::vector<float> out;
  const int nd = shape.ndim();
  std::vector<int64_t> pos(static_cast<size_t>(nd), 0), idx(static_cast<size_t>(nd));
  const int64_t n = box.numel();
  for (int64_t k = 0; k < n; ++k) {
    for (int d = 0; d < nd; ++d) idx[static_cast<size_t>(d)] = box.dims[static_cast<size_t>(d)].at(pos[static_cast<size_t>(d)]);
    out.push_back(global_value(shape, idx));
    for (int d = nd - 1; d >= 0; --d) {
      if (++pos[static_cast<size_t>(d)] < box.dims[static_cast<size_t>(d)].size()) break;
      pos[static_cast<size_t>(d)] = 0;
    }
  }
  return out;
}

// Saves `shape` under (mesh_a, pa) — replicas once, as save does — and reassembles each rank's box
// under (mesh_b, pb) from the pieces: values and coverage exactly once.
void reshard_case(const Shape& shape, const Mesh& mesh_a, std::vector<Placement> pa, const Mesh& mesh_b,
                  std::vector<Placement> pb) {
  SCOPED_TRACE(mesh_a.to_string() + " -> " + mesh_b.to_string());
  struct Piece {
    Box box;
    std::vector<float> data;
  };
  std::vector<Piece> pieces;
  for (int r = 0; r < mesh_a.size(); ++r) {
    const DimMask rep = replicate_dims(pa, mesh_a);
    bool writer = true;
    for (int d = 0; d < mesh_a.ndim(); ++d)
      if (((rep >> d) & 1u) && mesh_a.coord(r, d) != 0) writer = false;
    Box b = local_box(shape, pa, mesh_a, r);
    if (writer && b.numel() > 0) pieces.push_back({b, fill_box(shape, b)});
  }
  for (int r = 0; r < mesh_b.size(); ++r) {
    const Box target = local_box(shape, pb, mesh_b, r);
    std::vector<float> out(static_cast<size_t>(target.numel()), -1.0f);
    std::vector<uint8_t> cover(out.size(), 0);
    int64_t copied = 0;
    for (const Piece& p : pieces) {
      const int64_t expect = detail::intersection_numel(p.box, target);
      const int64_t got = detail::copy_box_intersection(p.data.data(), p.box, out.data(), target, 4, cover.data());
      EXPECT_EQ(got, expect);
      copied += got;
    }
    EXPECT_EQ(copied, target.numel()) << "rank " << r << " box " << target.to_string();
    for (uint8_t c : cover) EXPECT_EQ(c, 1) << "rank " << r;
    EXPECT_EQ(out, fill_box(shape, target)) << "rank " << r << " box " << target.to_string();
  }
}

TEST(BoxCopy, ReshardLayouts) {
  const Mesh dp3 = Mesh::parse("dp_shard=3"), dp2 = Mesh::parse("dp_shard=2"), dp4 = Mesh::parse("dp_shard=4");
  const Mesh hsdp = Mesh::parse("dp_replicate=2,dp_shard=2"), tp = Mesh::parse("dp=2,tp=2");
  const Mesh one;
  const auto S = Placement::shard;
  const auto SS = Placement::strided_shard;
  const Placement R = Placement::replicate();
  reshard_case({7, 5}, dp3, {S(0)}, dp2, {S(0)});
  reshard_case({7, 5}, dp3, {S(0)}, one, {});
  reshard_case({7, 5}, one, {}, dp4, {S(1)});
  reshard_case({13, 4}, dp3, {SS(0, 2)}, dp2, {SS(0, 3)});  // multi-range boxes on both sides
  reshard_case({13, 4}, dp2, {SS(0, 3)}, dp4, {S(0)});
  reshard_case({9, 6}, hsdp, {R, S(0)}, tp, {S(0), S(1)});  // replicas written once
  reshard_case({9, 6}, tp, {S(0), S(1)}, hsdp, {R, S(0)});
  reshard_case({8, 6}, tp, {SS(0, 2), S(0)}, dp3, {S(0)});  // FSDP over TP (StridedShard)
  reshard_case({8, 6}, dp3, {S(1)}, tp, {SS(0, 2), S(0)});
  reshard_case({3, 5, 4}, tp, {S(0), S(2)}, dp4, {S(1)});
  reshard_case({2, 3}, dp4, {S(0)}, dp3, {S(1)});  // empty shards
}

// ---------------------------------------------------------------------------------------------
// Errors: message names file and tensor; the target is untouched.

class CheckpointErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = make_single_communicator();
    saved_ = make_set(1);
    save_checkpoint(*comm_, dir_.path(), views(saved_), 7);
    info_ = read_checkpoint_info(dir_.path());
    file_ = dir_ / (info_.generation + "/rank-0.safetensors");
  }
  // load must throw meshmuon::Error mentioning every needle; the targets keep their bytes.
  void expect_load_error(std::vector<Owned> targets, const std::vector<std::string>& needles) {
    std::vector<std::vector<char>> before;
    for (const Owned& o : targets) before.push_back(o.bytes());
    try {
      load_checkpoint(*comm_, dir_.path(), views(targets));
      ADD_FAILURE() << "load succeeded";
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (std::getenv("MESHMUON_TEST_VERBOSE") != nullptr) std::fprintf(stderr, "%s\n", msg.c_str());
      EXPECT_EQ(msg.rfind("[checkpoint] ", 0), 0u) << msg;
      for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
    }
    for (size_t i = 0; i < targets.size(); ++i) EXPECT_EQ(targets[i].bytes(), before[i]) << targets[i].key;
  }
  std::vector<Owned> fresh() {
    std::vector<Owned> t = make_set(1);
    for (Owned& o : t) o.fill(77);
    return t;
  }

  TempDir dir_;
  std::unique_ptr<Communicator> comm_;
  std::vector<Owned> saved_;
  CheckpointInfo info_;
  std::string file_;
};

TEST_F(CheckpointErrors, FlippedByte) {
  std::vector<char> bytes = read_bytes(file_);
  bytes[bytes.size() - 3] ^= 0x10;
  write_bytes(file_, bytes);
  expect_load_error(fresh(), {file_, "tensor 'param/w1'", "CRC-32"});
}

TEST_F(CheckpointErrors, TruncatedFile) {
  std::vector<char> bytes = read_bytes(file_);
  bytes.resize(bytes.size() - 10);
  write_bytes(file_, bytes);
  expect_load_error(fresh(), {file_, "tensor 'param/w1'", "truncated"});
}

TEST_F(CheckpointErrors, MissingFile) {
  fs::remove(file_);
  expect_load_error(fresh(), {file_, "tensor 'param/w1'", "cannot open"});
}

TEST_F(CheckpointErrors, MissingKey) {
  std::vector<Owned> t = fresh();
  t[2].key = "optim/w1/exp_avg";
  expect_load_error(t, {dir_ / "index.json", "tensor 'optim/w1/exp_avg'", "not in the checkpoint"});
}

TEST_F(CheckpointErrors, GlobalShapeMismatch) {
  std::vector<Owned> t = fresh();
  t[0].shape = Shape({7, 5});
  t[0].fill(3);
  expect_load_error(t, {dir_ / "index.json", "tensor 'param/w1'", "global shape [5, 7]"});
}

TEST_F(CheckpointErrors, DtypeMismatch) {
  std::vector<Owned> t = fresh();
  t[1].dtype = DType::F32;
  t[1].fill(3);
  expect_load_error(t, {dir_ / "index.json", "tensor 'param/emb'", "dtype bf16"});
}

TEST_F(CheckpointErrors, PieceDtypeDiffersFromIndex) {
  // An index edited to claim bf16 where the file holds fp32: the header check catches it.
  std::string text;
  {
    const auto b = read_bytes(dir_ / "index.json");
    text.assign(b.begin(), b.end());
  }
  nlohmann::json j = nlohmann::json::parse(text);
  j["tensors"][0]["dtype"] = "bf16";
  write_bytes(dir_ / "index.json", [&] {
    const std::string s = j.dump();
    return std::vector<char>(s.begin(), s.end());
  }());
  std::vector<Owned> t = fresh();
  t[0].dtype = DType::BF16;
  t[0].fill(3);
  expect_load_error(t, {file_, "tensor 'param/w1'", "the piece is F32"});
}

TEST_F(CheckpointErrors, BadIndex) {
  nlohmann::json j = nlohmann::json::parse(read_bytes(dir_ / "index.json"));
  j["version"] = 2;
  const std::string s = j.dump();
  write_bytes(dir_ / "index.json", std::vector<char>(s.begin(), s.end()));
  expect_load_error(fresh(), {dir_ / "index.json", "version"});
  try {
    read_checkpoint_info(dir_.path());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("version: 2"), std::string::npos) << e.what();
  }
  j["version"] = 1;
  j["tensors"][0]["pieces"][0]["box"][0] = nlohmann::json::array({nlohmann::json::array({0, 9})});
  const std::string s2 = j.dump();
  write_bytes(dir_ / "index.json", std::vector<char>(s2.begin(), s2.end()));
  expect_load_error(fresh(), {dir_ / "index.json", "tensor 'param/w1'.pieces[0].box", "outside [0, 5)"});
}

TEST_F(CheckpointErrors, BadSafetensorsHeaderWithMatchingCrc) {
  // A file whose size and CRC the index agrees with but whose header is broken.
  std::vector<char> bytes = read_bytes(file_);
  bytes[0] = 0x7f, bytes[5] = 0x01;  // a header length past the end of the file
  write_bytes(file_, bytes);
  nlohmann::json j = nlohmann::json::parse(read_bytes(dir_ / "index.json"));
  j["files"][0]["crc32"] = detail::crc32_update(0, bytes.data(), bytes.size());
  const std::string s = j.dump();
  write_bytes(dir_ / "index.json", std::vector<char>(s.begin(), s.end()));
  expect_load_error(fresh(), {file_, "tensor 'param/w1'", "not a valid safetensors file", "header length"});
}

TEST_F(CheckpointErrors, MissingIndex) {
  fs::remove(dir_ / "index.json");
  expect_load_error(fresh(), {dir_ / "index.json", "cannot open"});
}

// ---------------------------------------------------------------------------------------------
// Crash atomicity: a child process dies inside a save; the previous checkpoint stays loadable.

// Saves make_set(2) at step 2 in a forked child that ends itself (_exit(3), no cleanup: a crash) at
// the save's hook point `point`. Returns the child's exit code (-1 when it did not exit normally).
int save_in_child_crashing_at(const std::string& dir, const std::string& point) {
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    auto child_comm = make_single_communicator();
    std::vector<Owned> second = make_set(2);
    CheckpointSaveOptions opt;
    opt.test_hook = [&](std::string_view p) {
      if (p == point) ::_exit(3);
    };
    save_checkpoint(*child_comm, dir, views(second), 2, {}, opt);
    ::_exit(0);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

void crash_case(const std::string& point) {
  SCOPED_TRACE(point);
  TempDir dir;
  auto comm = make_single_communicator();
  std::vector<Owned> first = make_set(1);
  save_checkpoint(*comm, dir.path(), views(first), 1);
  const std::string first_gen = read_checkpoint_info(dir.path()).generation;

  ASSERT_EQ(save_in_child_crashing_at(dir.path(), point), 3);

  // The crashed save left files behind, the index still names the first generation.
  int gens = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) gens += detail::is_generation_name(e.path().filename().string());
  EXPECT_EQ(gens, 2);
  const CheckpointInfo info = read_checkpoint_info(dir.path());
  EXPECT_EQ(info.generation, first_gen);
  EXPECT_EQ(info.step, 1);
  std::vector<Owned> loaded = make_set(1);
  for (Owned& o : loaded) o.fill(500);
  load_checkpoint(*comm, dir.path(), views(loaded));
  for (size_t i = 0; i < loaded.size(); ++i) EXPECT_EQ(loaded[i].bytes(), first[i].bytes()) << loaded[i].key;

  // The next save commits and cleans the leftovers: one generation, no temporary files.
  std::vector<Owned> third = make_set(3);
  save_checkpoint(*comm, dir.path(), views(third), 3);
  std::vector<std::string> names;
  for (const auto& e : fs::recursive_directory_iterator(dir.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  const std::string gen = read_checkpoint_info(dir.path()).generation;
  EXPECT_EQ(names, (std::vector<std::string>{gen, "index.json", "rank-0.safetensors"}));
  load_checkpoint(*comm, dir.path(), views(loaded));
  for (size_t i = 0; i < loaded.size(); ++i) EXPECT_EQ(loaded[i].bytes(), third[i].bytes()) << loaded[i].key;
}

TEST(CheckpointCrash, BeforeRename) { crash_case("files_written"); }
TEST(CheckpointCrash, AfterRename) { crash_case("files_renamed"); }
TEST(CheckpointCrash, BeforeIndexCommit) { crash_case("index_written"); }

TEST(Checkpoint, SaveIoErrorNamesTheFileAndKeepsThePrevious) {
  TempDir dir;
  auto comm = make_single_communicator();
  std::vector<Owned> first = make_set(1);
  save_checkpoint(*comm, dir.path(), views(first), 1);
  const std::string gen = read_checkpoint_info(dir.path()).generation;
  CheckpointSaveOptions opt;
  opt.test_hook = [&](std::string_view p) {  // the temporary file vanishes before its rename
    if (p != "files_written") return;
    for (const auto& e : fs::recursive_directory_iterator(dir.path()))
      if (e.path().extension() == ".tmp") fs::remove(e.path());
  };
  std::vector<Owned> second = make_set(2);
  try {
    save_checkpoint(*comm, dir.path(), views(second), 2, {}, opt);
    ADD_FAILURE() << "save succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/rank-0.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_checkpoint_info(dir.path()).generation, gen);
  std::vector<Owned> loaded = make_set(1);
  for (Owned& o : loaded) o.fill(9);
  load_checkpoint(*comm, dir.path(), views(loaded));
  for (size_t i = 0; i < loaded.size(); ++i) EXPECT_EQ(loaded[i].bytes(), first[i].bytes());
}

TEST(CheckpointCrash, AfterCommitTheNewCheckpointLoads) {
  TempDir dir;
  auto comm = make_single_communicator();
  std::vector<Owned> first = make_set(1);
  save_checkpoint(*comm, dir.path(), views(first), 1);
  ASSERT_EQ(save_in_child_crashing_at(dir.path(), "committed"), 3);
  EXPECT_EQ(read_checkpoint_info(dir.path()).step, 2);
  std::vector<Owned> loaded = make_set(1);
  load_checkpoint(*comm, dir.path(), views(loaded));
  std::vector<Owned> second = make_set(2);
  for (size_t i = 0; i < loaded.size(); ++i) EXPECT_EQ(loaded[i].bytes(), second[i].bytes());
}

// ---------------------------------------------------------------------------------------------
// The trainer's tensors (ShardedParams + Optimizer) on one rank.

ParamSpec trainer_spec(std::string name, Shape shape, Role role = Role::Muon, bool expert = false) {
  ParamSpec p;
  p.name = std::move(name), p.shape = shape, p.role = role, p.expert = expert;
  return p;
}

TEST(CheckpointTrainer, TensorsKeysShapesAndRoundTrip) {
  TempDir dir;
  std::shared_ptr<Communicator> world = make_single_communicator();
  auto comms = std::make_shared<MeshCommunicators>(world);
  const std::vector<ParamSpec> specs = {trainer_spec("w", {5, 3}), trainer_spec("wide", {2, 6}),
                                        trainer_spec("experts", {2, 3, 4}, Role::Muon, true),
                                        trainer_spec("bias", {4}, Role::AdamW)};
  ShardedParams params(comms, Mesh(), specs);
  ParamGroup nor, adam;
  nor.options.normuon = true;
  nor.params = {0, 1, 2};
  adam.options.algorithm = Algorithm::AdamW;
  adam.params = {3};
  OptimizerOptions oo;
  oo.env_override = false;
  Optimizer opt(comms, params.inventory(), {nor, adam}, oo);

  const std::vector<CheckpointTensor> ts = checkpoint_tensors(params, &opt);
  std::map<std::string, Shape> shapes;
  for (const CheckpointTensor& t : ts) {
    shapes[t.key] = t.global_shape;
    EXPECT_EQ(t.data.shape, t.global_shape) << t.key;  // one rank holds everything
  }
  EXPECT_EQ(shapes.at("param/w"), Shape({5, 3}));
  EXPECT_EQ(shapes.at("optim/w/momentum_buffer"), Shape({5, 3}));
  EXPECT_EQ(shapes.at("optim/w/normuon_v"), normuon_state_shape({5, 3}, false));
  EXPECT_EQ(shapes.at("optim/wide/normuon_v"), normuon_state_shape({2, 6}, false));
  EXPECT_EQ(shapes.at("optim/experts/normuon_v"), normuon_state_shape({2, 3, 4}, true));
  EXPECT_EQ(shapes.at("optim/bias/exp_avg_sq"), Shape({4}));
  EXPECT_EQ(checkpoint_tensors(params, nullptr).size(), 4u);

  // Values in, saved, clobbered, loaded back; step counts restored.
  uint32_t k = 1;
  for (const CheckpointTensor& t : ts)
    for (int64_t i = 0; i < t.data.numel(); ++i) t.data.f32()[i] = static_cast<float>(k++) * 0.25f;
  for (size_t i = 0; i < params.size(); ++i) opt.set_step_count(i, 10 + static_cast<int64_t>(i));
  save_checkpoint(dir.path(), params, &opt, 10);
  for (const CheckpointTensor& t : ts)
    for (int64_t i = 0; i < t.data.numel(); ++i) t.data.f32()[i] = -1.0f;
  for (size_t i = 0; i < params.size(); ++i) opt.set_step_count(i, 0);
  const CheckpointInfo info = load_checkpoint(dir.path(), params, &opt);
  EXPECT_EQ(info.step, 10);
  k = 1;
  for (const CheckpointTensor& t : ts)
    for (int64_t i = 0; i < t.data.numel(); ++i) EXPECT_EQ(t.data.f32()[i], static_cast<float>(k++) * 0.25f) << t.key;
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(opt.step_count(i), 10 + static_cast<int64_t>(i));

  // A checkpoint saved without an optimizer has no step counts: loading one refuses to guess.
  save_checkpoint(dir.path(), params, nullptr, 11);
  params.param(0).f32()[0] = 123.0f;
  try {
    load_checkpoint(dir.path(), params, &opt);
    ADD_FAILURE() << "loaded step counts that are not there";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step_counts: no count for 'w'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(params.param(0).f32()[0], 123.0f);  // nothing loaded
  EXPECT_EQ(opt.step_count(0), 10);
  EXPECT_EQ(load_checkpoint(dir.path(), params, nullptr).step, 11);
  EXPECT_EQ(params.param(0).f32()[0], 0.25f);
}

TEST(CheckpointTrainer, OptimizerOfOtherParametersIsRefused) {
  std::shared_ptr<Communicator> world = make_single_communicator();
  auto comms = std::make_shared<MeshCommunicators>(world);
  ShardedParams params(comms, Mesh(), {trainer_spec("w", {5, 3})});
  Inventory inv = params.inventory();
  inv.params[0].shape = Shape({3, 5});
  ParamGroup g;
  g.params = {0};
  OptimizerOptions oo;
  oo.env_override = false;
  Optimizer opt(comms, inv, {g}, oo);
  try {
    checkpoint_tensors(params, &opt);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshmuon
