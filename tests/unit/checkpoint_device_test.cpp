// Checkpoints of device memory on one rank (checkpoint.h: CheckpointTensor::device_copy), with the
// fake device backend (tests/support/fake_device.h: the host touching device memory faults, so a
// passing test proves every byte moved through device_copy):
// - the tensor-list API: device -> file -> cpu views and cpu -> file -> device views, bitwise;
//   a tensor larger than the host staging bound is staged in bounded pieces;
// - a device view without a device_copy is refused, naming the tensor;
// - a failed load (corrupt file) leaves device memory unchanged (read back through copies);
// - the negative control: the host path (write a device pointer, memcpy into one) faults;
// - the trainer API (ShardedParams + Optimizer on the fake device) round trips with the cpu one;
// - the real cuda backend's checkpoints (skips without a GPU; never run).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../support/fake_device.h"
#include "comm/staging.h"
#include "meshmuon/checkpoint.h"
#include "meshmuon/error.h"
#include "meshmuon/mesh_comms.h"
#include "meshmuon/optimizer.h"
#include "meshmuon/sharded_params.h"
#include "backend/select.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors_io.h"
#include "../support/corrupt_file.h"
#include "../support/temp_dir.h"

namespace meshmuon {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed at the end.
struct TempDir : test::TempDir {
  TempDir() : test::TempDir("meshmuon_ckpt_dev_") {}
};

std::vector<uint8_t> pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> v(bytes);
  uint32_t x = seed * 2654435761u + 1u;
  for (uint8_t& b : v) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

struct Spec {
  std::string key;
  Shape shape;
  DType dtype;
};

const std::vector<Spec>& specs() {
  static const std::vector<Spec> s = {{"param/w", {5, 7}, DType::F32},   {"param/emb", {3, 2, 4}, DType::BF16},
                                      {"optim/w/m", {5, 7}, DType::F32}, {"scalar", {1}, DType::F32},
                                      {"empty", {0, 4}, DType::BF16}};
  return s;
}

// One tensor per spec, in host vectors or in fake device memory (then with the backend's copy).
struct Set {
  std::vector<std::vector<uint8_t>> host;  // host tensors (empty when on the device)
  std::vector<detail::Buffer> device;
  test::FakeDeviceBackend* backend = nullptr;

  static Set make(test::FakeDeviceBackend* backend, uint32_t seed) {
    Set s;
    s.backend = backend;
    for (size_t i = 0; i < specs().size(); ++i) {
      const Spec& sp = specs()[i];
      const std::vector<uint8_t> v = pattern(static_cast<size_t>(sp.shape.numel()) * dtype_size(sp.dtype), seed + i);
      if (backend == nullptr) {
        s.host.push_back(v);
      } else {
        s.device.push_back(backend->allocate(v.size(), detail::MemoryKind::Device));
        if (!v.empty()) backend->copy(s.device.back().data(), v.data(), v.size());
      }
    }
    return s;
  }
  std::vector<CheckpointTensor> tensors(bool with_copy = true) {
    std::vector<CheckpointTensor> out;
    for (size_t i = 0; i < specs().size(); ++i) {
      const Spec& sp = specs()[i];
      CheckpointTensor t{sp.key, sp.shape, sp.dtype, Mesh(), {}, {}};
      if (backend == nullptr) {
        t.data = TensorView(host[i].data(), sp.dtype, sp.shape);
      } else {
        t.data = TensorView(device[i].data(), sp.dtype, sp.shape);
        t.data.device = backend->device();
        if (with_copy) t.device_copy = [b = backend](void* d, const void* s, size_t n) { b->copy(d, s, n); };
      }
      out.push_back(std::move(t));
    }
    return out;
  }
  // Every tensor's bytes, device ones read back through the backend's copy.
  std::vector<std::vector<uint8_t>> bytes() const {
    if (backend == nullptr) return host;
    std::vector<std::vector<uint8_t>> out;
    for (size_t i = 0; i < specs().size(); ++i) {
      std::vector<uint8_t> v(device[i].bytes());
      if (!v.empty()) backend->copy(v.data(), device[i].data(), v.size());
      out.push_back(std::move(v));
    }
    return out;
  }
};

TEST(CheckpointDevice, DeviceToCpuAndCpuToDeviceBitwise) {
  auto fb = std::make_shared<test::FakeDeviceBackend>();
  auto comm = make_single_communicator();
  {
    TempDir dir;
    Set saved = Set::make(fb.get(), 1);
    save_checkpoint(*comm, dir.path(), saved.tensors(), 7);
    Set loaded = Set::make(nullptr, 99);
    ASSERT_NE(loaded.bytes(), saved.bytes());  // the load must change them
    load_checkpoint(*comm, dir.path(), loaded.tensors());
    EXPECT_EQ(loaded.bytes(), saved.bytes());
    Set on_device = Set::make(fb.get(), 98);  // device -> device too
    load_checkpoint(*comm, dir.path(), on_device.tensors());
    EXPECT_EQ(on_device.bytes(), saved.bytes());
  }
  {
    TempDir dir;
    Set saved = Set::make(nullptr, 2);
    save_checkpoint(*comm, dir.path(), saved.tensors(), 8);
    Set loaded = Set::make(fb.get(), 97);
    ASSERT_NE(loaded.bytes(), saved.bytes());
    load_checkpoint(*comm, dir.path(), loaded.tensors());
    EXPECT_EQ(loaded.bytes(), saved.bytes());
  }
}

// A tensor larger than the staging bound: saved in pieces of at most kSafetensorsStagingBytes.
TEST(CheckpointDevice, SaveStagesThroughABoundedBuffer) {
  auto fb = std::make_shared<test::FakeDeviceBackend>();
  auto comm = make_single_communicator();
  TempDir dir;
  const int64_t n = static_cast<int64_t>(detail::kSafetensorsStagingBytes / 4) * 2 + 12345;
  const Shape shape({n});
  const std::vector<uint8_t> v = pattern(static_cast<size_t>(n) * 4, 5);
  detail::Buffer d = fb->allocate(v.size(), detail::MemoryKind::Device);
  fb->copy(d.data(), v.data(), v.size());
  size_t calls = 0, largest = 0;
  CheckpointTensor t{"big", shape, DType::F32, Mesh(), {}, TensorView(d.data(), DType::F32, shape)};
  t.data.device = fb->device();
  t.device_copy = [&](void* dst, const void* src, size_t bytes) {
    ++calls, largest = std::max(largest, bytes);
    fb->copy(dst, src, bytes);
  };
  save_checkpoint(*comm, dir.path(), std::span<const CheckpointTensor>(&t, 1), 1);
  EXPECT_EQ(calls, 3u);
  EXPECT_EQ(largest, detail::kSafetensorsStagingBytes);
  std::vector<uint8_t> back(v.size(), 0);
  CheckpointTensor h{"big", shape, DType::F32, Mesh(), {}, TensorView(back.data(), DType::F32, shape)};
  load_checkpoint(*comm, dir.path(), std::span<const CheckpointTensor>(&h, 1));
  EXPECT_TRUE(back == v);
}

TEST(CheckpointDevice, DeviceViewWithoutCopyIsRefusedNamingTheTensor) {
  auto fb = std::make_shared<test::FakeDeviceBackend>();
  auto comm = make_single_communicator();
  TempDir dir;
  Set set = Set::make(fb.get(), 3);
  for (int load = 0; load < 2; ++load) {
    try {
      if (load) load_checkpoint(*comm, dir.path(), set.tensors(false));
      else save_checkpoint(*comm, dir.path(), set.tensors(false), 1);
      ADD_FAILURE() << "a device view without device_copy was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("tensor 'param/w'"), std::string::npos) << m;
      EXPECT_NE(m.find("cuda:0 memory and has no device_copy"), std::string::npos) << m;
    }
  }
  EXPECT_FALSE(fs::exists(dir.path() + "/index.json"));
}

TEST(CheckpointDevice, FailedLoadLeavesDeviceMemoryUnchanged) {
  auto fb = std::make_shared<test::FakeDeviceBackend>();
  auto comm = make_single_communicator();
  TempDir dir;
  Set saved = Set::make(fb.get(), 4);
  save_checkpoint(*comm, dir.path(), saved.tensors(), 1);
  const std::string file = dir.path() + "/" + read_checkpoint_info(dir.path()).generation + "/rank-0.safetensors";
  test::flip_bits_near_end(file, 2, 0x10);
  Set target = Set::make(fb.get(), 50);
  const auto before = target.bytes();
  try {
    load_checkpoint(*comm, dir.path(), target.tensors());
    ADD_FAILURE() << "loaded a corrupt file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CRC-32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tensor '"), std::string::npos) << e.what();
  }
  EXPECT_EQ(target.bytes(), before);
}

// Negative control: what the checkpoint did before device views had a copy (write the view's
// pointer and CRC its bytes, memcpy the staging into it) fails on fake device memory.
TEST(CheckpointDeviceDeathTest, HostPathFaultsOnDeviceMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto fb = std::make_shared<test::FakeDeviceBackend>();
  detail::Buffer d = fb->allocate(64, detail::MemoryKind::Device);
  // The death statements first: a threadsafe death test re-runs this test in a child up to the
  // statement, and a child that dies leaves behind whatever it made (the temporary directory).
  EXPECT_DEATH(detail::crc32_update(0, d.data(), 64), "");
  std::vector<uint8_t> staging(64, 1);
  EXPECT_DEATH(std::memcpy(d.data(), staging.data(), staging.size()), "");
  TempDir dir;
  const detail::SafetensorsTensor t{"x", DType::F32, Shape({16}), d.data()};
  const std::string path = dir.path() + "/x.safetensors";
  // The save wrote the view's bytes (the kernel refuses to read PROT_NONE memory: EFAULT) and
  // computed their CRC (the host reading device memory: a fault); the load copied into the view.
  try {
    detail::write_safetensors(path, std::span<const detail::SafetensorsTensor>(&t, 1), {});
    ADD_FAILURE() << "wrote device memory from the host";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Bad address"), std::string::npos) << e.what();
  }
  // The same tensor with its device copy writes.
  std::function<void(void*, const void*, size_t)> copy = [&](void* a, const void* b, size_t n) { fb->copy(a, b, n); };
  detail::SafetensorsTensor staged = t;
  staged.device_copy = &copy;
  EXPECT_NO_THROW(detail::write_safetensors(path, std::span<const detail::SafetensorsTensor>(&staged, 1), {}));
}

// ---------------------------------------------------------------------------------------------
// The trainer API on one rank: ShardedParams + Optimizer on the fake device vs the cpu.

ParamSpec pspec(std::string name, Shape shape, Role role = Role::Muon) {
  ParamSpec p;
  p.name = std::move(name), p.shape = shape, p.role = role;
  return p;
}

// An engine's backend and the communicators' memory space: the cpu (host space), the fake device
// (its space) or cuda (default_memory_space(), cudart's on a GPU machine).
detail::EngineDevice cpu_device() { return {detail::make_cpu_backend(), detail::host_memory_space()}; }
detail::EngineDevice fake_device() {
  auto fb = std::make_shared<test::FakeDeviceBackend>();
  return {fb, fb->space()};
}

// ShardedParams + Optimizer on one rank, built on `d` (injected: the engines take the test's
// backend); every access to their memory goes through the backend's copy.
struct Trainer {
  std::shared_ptr<detail::Backend> backend;
  std::unique_ptr<ShardedParams> params;
  std::unique_ptr<Optimizer> opt;

  explicit Trainer(const detail::EngineDevice& d) : backend(d.backend) {
    const detail::ScopedEngineDevice inject(d);
    // The single communicator stages device buffers through the space.
    auto comms = std::make_shared<MeshCommunicators>(std::shared_ptr<Communicator>(make_single_communicator(d.space)));
    params = std::make_unique<ShardedParams>(comms, Mesh::parse("dp_shard=1"),
                                             std::vector<ParamSpec>{pspec("w", {6, 5}), pspec("b", {5}, Role::AdamW)});
    ParamGroup muon, adam;
    muon.options.normuon = true, muon.params = {0};
    adam.options.algorithm = Algorithm::AdamW, adam.params = {1};
    OptimizerOptions oo;
    oo.env_override = false;
    opt = std::make_unique<Optimizer>(comms, params->inventory(), std::vector<ParamGroup>{muon, adam}, oo);
    EXPECT_EQ(params->param(0).device, backend->device());
    for (size_t i = 0; i < params->size(); ++i) write(params->param(i), pattern_f(params->param(i).numel(), 10 + i));
  }
  static std::vector<float> pattern_f(int64_t n, uint32_t seed) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) v[static_cast<size_t>(j)] = static_cast<float>((seed * 31 + j * 7) % 23) / 8.0f - 1.0f;
    return v;
  }
  void write(const TensorView& v, const std::vector<float>& h) { backend->copy(v.data, h.data(), h.size() * 4); }
  std::vector<float> read(const TensorView& v) {
    std::vector<float> h(static_cast<size_t>(v.numel()));
    backend->copy(h.data(), v.data, h.size() * 4);
    return h;
  }
  void step(int s) {
    for (size_t i = 0; i < params->size(); ++i) write(params->full_grad(i), pattern_f(params->full_grad(i).numel(), 100 * s + i));
    params->reduce_grads();
    opt->step(params->params(), params->grads());
  }
  std::vector<std::vector<float>> everything() {
    std::vector<std::vector<float>> out;
    for (const CheckpointTensor& t : checkpoint_tensors(*params, opt.get())) out.push_back(read(t.data));
    return out;
  }
};

TEST(CheckpointDevice, TrainerCrossBackendResumesBitwise) {
  Trainer ref(cpu_device());
  for (int s = 0; s < 5; ++s) ref.step(s);
  for (const auto& [save_fake, load_fake] : {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
    TempDir dir;
    Trainer a(save_fake ? fake_device() : cpu_device());
    for (int s = 0; s < 3; ++s) a.step(s);
    save_checkpoint(dir.path(), *a.params, a.opt.get(), 3);
    Trainer b(load_fake ? fake_device() : cpu_device());
    ASSERT_NE(b.everything(), a.everything());
    load_checkpoint(dir.path(), *b.params, b.opt.get());
    EXPECT_EQ(b.everything(), a.everything()) << save_fake << " -> " << load_fake;
    for (int s = 3; s < 5; ++s) b.step(s);
    EXPECT_EQ(b.everything(), ref.everything()) << save_fake << " -> " << load_fake;
    EXPECT_EQ(b.opt->step_count(0), 5);
  }
}

// The real cuda backend (skips without a GPU): trained on cuda, saved, loaded into fresh cuda and
// cpu engines, every parameter and state tensor bitwise the saved one (the steps themselves differ
// from the cpu's: Newton–Schulz is cuBLAS GEMMs in another order).
TEST(CudaCheckpoint, SavedOnCudaLoadsOnCudaAndCpuBitwise) {
  std::shared_ptr<detail::Backend> cuda;
  try {
    cuda = detail::make_cuda_backend(0);
  } catch (const std::exception& e) {
    GTEST_SKIP() << e.what();
  }
  const detail::EngineDevice on_cuda{cuda, detail::default_memory_space()};
  TempDir dir;
  Trainer a(on_cuda);
  for (int s = 0; s < 3; ++s) a.step(s);
  save_checkpoint(dir.path(), *a.params, a.opt.get(), 3);
  for (const detail::EngineDevice& d : {on_cuda, cpu_device()}) {
    Trainer b(d);
    load_checkpoint(dir.path(), *b.params, b.opt.get());
    EXPECT_EQ(b.everything(), a.everything()) << b.backend->name();
  }
}

}  // namespace
}  // namespace meshmuon
