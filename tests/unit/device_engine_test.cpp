// The engine on a device backend (docs/decisions/022-engine-on-a-device-backend.md): LocalOptimizer
// on the fake device backend (tests/support/fake_device.h, whose device memory faults on any host
// access) is bitwise equal to the same run on the cpu backend; the option and per-parameter device
// errors; the negative control that fake device memory really faults; and the real cuda backend
// against the cpu one within a bound (skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../support/fake_device.h"
#include "backend/backend.h"
#include "comm/staging.h"
#include "meshmuon/comm.h"
#include "meshmuon/bf16.h"
#include "meshmuon/local_optimizer.h"
#include "meshmuon/optimizer.h"
#include "backend/select.h"
#include "test_support.h"

namespace {

using meshmuon::Algorithm;
using meshmuon::DType;
using meshmuon::GroupOptions;
using meshmuon::LocalOptimizer;
using meshmuon::LocalOptimizerOptions;
using meshmuon::ParamGroup;
using meshmuon::ParamInfo;
using meshmuon::Shape;
using meshmuon::TensorView;
using meshmuon::detail::Backend;
using meshmuon::detail::Buffer;
using meshmuon::detail::MemoryKind;
using meshmuon::test::FakeDeviceBackend;

using meshmuon::test::randn;

// Muon (tall, wide; NorMuon + cautious), an expert stack and a QK-tagged weight (heavy ball, Polar
// Express, QK-clip), AdamW (a bias and an embedding).
std::vector<ParamInfo> model_params() {
  std::vector<ParamInfo> p = {{"w_tall", {24, 10}}, {"w_wide", {10, 24}}, {"experts", {3, 12, 8}, true},
                              {"wq", {8, 12}},      {"bias", {16}},       {"embed", {20, 6}}};
  p[3].qk = meshmuon::QkTag{0, meshmuon::QkKind::Q, 2, 4};
  return p;
}

std::vector<ParamGroup> model_groups() {
  GroupOptions g0;
  g0.lr = 0.02, g0.weight_decay = 0.1, g0.normuon = true, g0.cautious_wd = true;
  GroupOptions g1;
  g1.lr = 0.01, g1.weight_decay = 0.05, g1.momentum = 0.9, g1.nesterov = false;
  g1.momentum_kind = meshmuon::MomentumKind::HeavyBall;
  g1.lr_rule = meshmuon::LrRule::MatchRmsAdamw;
  g1.ns.schedule = meshmuon::Schedule::PolarExpress;
  g1.qk_clip_threshold = 5.0;
  GroupOptions g2;
  g2.algorithm = Algorithm::AdamW, g2.lr = 3e-3, g2.weight_decay = 0.01;
  return {{g0, {0, 1}}, {g1, {2, 3}}, {g2, {4, 5}}};
}

struct RunResult {
  std::vector<std::vector<float>> params;
  std::map<std::string, std::vector<float>> state;  // "param/key"
  std::vector<bool> applied;
};

// Steps a LocalOptimizer `steps` times on `backend` (null: options.device as given, host buffers when
// that is the cpu). Parameters and gradients live in the backend's memory; gradient 0 is bf16; at
// step 2 'w_wide' and 'bias' have no gradient; at `nan_step` a gradient holds a NaN.
RunResult run(std::shared_ptr<Backend> backend, LocalOptimizerOptions options, int steps, int nan_step = -1) {
  const auto info = model_params();
  std::unique_ptr<meshmuon::detail::ScopedEngineDevice> inject;
  auto* fake = dynamic_cast<FakeDeviceBackend*>(backend.get());
  if (fake) inject = std::make_unique<meshmuon::detail::ScopedEngineDevice>(meshmuon::detail::EngineDevice{backend, fake->space()});
  if (!backend) backend = meshmuon::detail::resolve_engine_device(options.device).backend;
  const bool device = backend->capabilities().device_memory;
  const meshmuon::Device dev = backend->device();
  LocalOptimizer opt(info, model_groups(), options);
  inject.reset();  // construction is what reads the hook

  std::vector<Buffer> keep;
  std::vector<float*> p(info.size());
  for (size_t i = 0; i < info.size(); ++i) {
    const auto init = randn(static_cast<size_t>(info[i].shape.numel()), 7 + 17 * static_cast<uint32_t>(i), 0.5f);
    keep.push_back(backend->allocate(init.size() * sizeof(float), device ? MemoryKind::Device : MemoryKind::Host));
    backend->copy(keep.back().data(), init.data(), init.size() * sizeof(float));
    p[i] = keep.back().as<float>();
  }
  RunResult out;
  for (int t = 1; t <= steps; ++t) {
    std::vector<Buffer> grads;
    std::vector<TensorView> pv, gv;
    for (size_t i = 0; i < info.size(); ++i) {
      pv.emplace_back(p[i], info[i].shape);
      pv.back().device = dev;
      if (t == 2 && (i == 1 || i == 4)) {
        gv.emplace_back();  // no gradient this step
        continue;
      }
      auto g = randn(static_cast<size_t>(info[i].shape.numel()), 1000 * static_cast<uint32_t>(t) + static_cast<uint32_t>(i), 1.0f);
      if (t == nan_step && i == 3) g[5] = std::numeric_limits<float>::quiet_NaN();
      const MemoryKind kind = device ? MemoryKind::Device : MemoryKind::Host;
      if (i == 0) {
        std::vector<meshmuon::BFloat16> b(g.size());
        for (size_t j = 0; j < g.size(); ++j) b[j] = meshmuon::float_to_bf16(g[j]);
        grads.push_back(backend->allocate(b.size() * sizeof(meshmuon::BFloat16), kind));
        backend->copy(grads.back().data(), b.data(), b.size() * sizeof(meshmuon::BFloat16));
        gv.emplace_back(grads.back().as<meshmuon::BFloat16>(), info[i].shape);
      } else {
        grads.push_back(backend->allocate(g.size() * sizeof(float), kind));
        backend->copy(grads.back().data(), g.data(), g.size() * sizeof(float));
        gv.emplace_back(grads.back().as<float>(), info[i].shape);
      }
      gv.back().device = dev;
    }
    const std::map<int, std::vector<float>> logits = {{0, {3.0f, t % 2 ? 8.0f + static_cast<float>(t) : 4.0f}}};
    out.applied.push_back(opt.step(pv, gv, logits));
  }
  for (size_t i = 0; i < info.size(); ++i) {
    std::vector<float> h(static_cast<size_t>(info[i].shape.numel()));
    backend->copy(h.data(), p[i], h.size() * sizeof(float));
    out.params.push_back(std::move(h));
    for (const std::string& key : opt.state_keys(i)) {
      const TensorView v = opt.state(i, key);
      // device state gives device views; offloaded state lives in (pinned) host memory
      EXPECT_EQ(v.device, device && !options.offload_state ? dev : meshmuon::Device{}) << info[i].name << "/" << key;
      if (fake)  // the engine's state really is fake device memory (offload: pinned host home copies)
        EXPECT_EQ(fake->memory()->contains(v.data), !options.offload_state) << info[i].name << "/" << key;
      std::vector<float> h2(static_cast<size_t>(v.shape.numel()));
      backend->copy(h2.data(), v.data, h2.size() * sizeof(float));
      out.state[info[i].name + "/" + key] = std::move(h2);
    }
  }
  return out;
}

void expect_bitwise(const RunResult& a, const RunResult& b) {
  ASSERT_EQ(a.applied, b.applied);
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i)
    EXPECT_EQ(0, std::memcmp(a.params[i].data(), b.params[i].data(), a.params[i].size() * sizeof(float))) << "param " << i;
  ASSERT_EQ(a.state.size(), b.state.size());
  for (const auto& [key, v] : a.state) {
    ASSERT_TRUE(b.state.count(key)) << key;
    EXPECT_EQ(0, std::memcmp(v.data(), b.state.at(key).data(), v.size() * sizeof(float))) << key;
  }
}

// ---- the negative control -------------------------------------------------------------------

TEST(FakeDeviceDeathTest, HostTouchOfDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  FakeDeviceBackend be;
  Buffer b = be.allocate(64, MemoryKind::Device);
  const std::vector<float> v = {1, 2, 3, 4};
  be.copy(b.data(), v.data(), sizeof(float) * v.size());  // through the alias: fine
  EXPECT_EQ(meshmuon::test::to_host(be, b.as<float>(), 4), v);
  float* d = b.as<float>();
  EXPECT_DEATH({ volatile float x = d[1]; (void)x; }, "");
  EXPECT_DEATH({ d[0] = 1.0f; }, "");
  // the cpu backend's kernels (what an engine forgetting the device would call) fault too
  auto cpu = meshmuon::detail::make_cpu_backend();
  EXPECT_DEATH({ cpu->round_to_comm(d, 4, DType::BF16); }, "");
}

// ---- the single communicator through a memory space ------------------------------------------

// Every op of the single communicator between fake device buffers (device to device, device to
// host, host to device) moves the right bytes through the space; without the space the same copy
// is a host memmove on device memory and faults.
TEST(FakeDeviceDeathTest, SingleCommunicatorCopiesThroughTheSpace) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  FakeDeviceBackend be;
  auto comm = meshmuon::make_single_communicator(be.space());
  std::vector<Buffer> keep;
  const std::vector<float> src = {1, 2, 3, 4, 5, 6};
  float* d_src = meshmuon::test::to_device(be, keep, src);
  float* d_dst = meshmuon::test::to_device(be, keep, std::vector<float>(6, 0.0f));
  using meshmuon::CommType;
  using meshmuon::InBuffer;
  using meshmuon::OutBuffer;
  const std::vector<int64_t> counts = {6}, displs = {0};
  comm->all_gather_v(InBuffer(d_src, CommType::F32, 6), OutBuffer(d_dst, CommType::F32, 6), counts, "ag").wait();
  EXPECT_EQ(meshmuon::test::to_host(be, d_dst, 6), src);
  float* d2 = meshmuon::test::to_device(be, keep, std::vector<float>(6, 0.0f));
  comm->reduce_scatter_v(InBuffer(d_src, CommType::F32, 6), OutBuffer(d2, CommType::F32, 6), counts, meshmuon::ReduceOp::Sum,
                         "rs").wait();
  EXPECT_EQ(meshmuon::test::to_host(be, d2, 6), src);
  std::vector<float> host(6, 0.0f);  // device -> host and host -> device
  comm->all_reduce(InBuffer(d_src, CommType::F32, 6), OutBuffer(host.data(), CommType::F32, 6), meshmuon::ReduceOp::Sum,
                   "ar").wait();
  EXPECT_EQ(host, src);
  float* d3 = meshmuon::test::to_device(be, keep, std::vector<float>(6, 0.0f));
  comm->all_to_all_v(InBuffer(host.data(), CommType::F32, 6), counts, displs, OutBuffer(d3, CommType::F32, 6), counts,
                     displs, "a2a").wait();
  EXPECT_EQ(meshmuon::test::to_host(be, d3, 6), src);
  float* d4 = meshmuon::test::to_device(be, keep, std::vector<float>(6, 0.0f));
  comm->group_begin();
  (void)comm->send(InBuffer(d_src, CommType::F32, 6), 0, "p2p");
  (void)comm->recv(OutBuffer(d4, CommType::F32, 6), 0, "p2p");
  comm->group_end("p2p").wait();
  EXPECT_EQ(meshmuon::test::to_host(be, d4, 6), src);
  auto plain = meshmuon::make_single_communicator();
  EXPECT_DEATH(
      {
        plain->all_gather_v(InBuffer(d_src, CommType::F32, 6), OutBuffer(d_dst, CommType::F32, 6), counts, "ag").wait();
      },
      "");
}

// ---- the fake device backend against the cpu backend ------------------------------------------

struct Case {
  DType comm;
  bool offload;
  int threads;
};

class DeviceEngine : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceEngine, LocalOptimizerBitwiseEqualsCpu) {
  LocalOptimizerOptions o;
  o.comm_dtype = GetParam().comm;
  o.offload_state = GetParam().offload;
  o.threads = GetParam().threads;
  const RunResult cpu = run(nullptr, o, 4);
  auto fake = std::make_shared<FakeDeviceBackend>();
  const RunResult dev = run(fake, o, 4);
  expect_bitwise(cpu, dev);
  EXPECT_GT(fake->device_allocations, 6u);  // params, grads, and the engine's own (arenas, state / slots)
  // the run did something: parameters moved from their initial values
  EXPECT_NE(cpu.params[0], randn(cpu.params[0].size(), 7, 0.5f));
}

INSTANTIATE_TEST_SUITE_P(Cases, DeviceEngine,
                         ::testing::Values(Case{DType::F32, false, 1}, Case{DType::BF16, false, 1},
                                           Case{DType::F32, true, 1}, Case{DType::BF16, true, 2},
                                           Case{DType::F32, false, 2}),
                         [](const auto& i) {
                           return std::string(i.param.comm == DType::F32 ? "fp32" : "bf16") +
                                  (i.param.offload ? "_offload" : "") + "_threads" + std::to_string(i.param.threads);
                         });

TEST(DeviceEngine, NonFiniteSkipBitwiseEqualsCpu) {
  LocalOptimizerOptions o;
  o.policy = meshmuon::NonFinitePolicy::Skip;
  const RunResult cpu = run(nullptr, o, 3, 2);
  const RunResult dev = run(std::make_shared<FakeDeviceBackend>(), o, 3, 2);
  EXPECT_EQ(cpu.applied, (std::vector<bool>{true, false, true}));
  expect_bitwise(cpu, dev);
}

// ---- errors ---------------------------------------------------------------------------------

TEST(DeviceEngine, ParameterOnAnotherDeviceIsNamedBeforeAnythingChanges) {
  auto fake = std::make_shared<FakeDeviceBackend>();
  std::vector<ParamInfo> info = {{"w0", {4, 6}}, {"w1", {6, 4}}};
  GroupOptions muon;
  std::unique_ptr<LocalOptimizer> opt;
  {
    meshmuon::detail::ScopedEngineDevice inject({fake, fake->space()});
    opt = std::make_unique<LocalOptimizer>(info, std::vector<ParamGroup>{{muon, {0, 1}}});
  }
  std::vector<Buffer> keep;
  const std::vector<float> w0 = randn(24, 1, 1.0f), w1 = randn(24, 2, 1.0f), g = randn(24, 3, 1.0f);
  float* d0 = meshmuon::test::to_device(*fake, keep, w0);
  float* dg0 = meshmuon::test::to_device(*fake, keep, g);
  std::vector<float> h1 = w1, hg1 = g;  // parameter 1 given in host memory
  std::vector<TensorView> pv = {TensorView(d0, info[0].shape), TensorView(h1.data(), info[1].shape)};
  std::vector<TensorView> gv = {TensorView(dg0, info[0].shape), TensorView(hg1.data(), info[1].shape)};
  pv[0].device = gv[0].device = {meshmuon::DeviceKind::Cuda, 0};
  try {
    opt->step(pv, gv);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'w1' is on cpu but the optimizer runs on cuda:0"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(meshmuon::test::to_host(*fake, d0, 24), w0);  // nothing modified
  EXPECT_EQ(h1, w1);
  EXPECT_EQ(opt->step_count(0), 0);
  pv[1].device = {meshmuon::DeviceKind::Cuda, 0};  // now the gradient alone is wrong
  pv[1].data = meshmuon::test::to_device(*fake, keep, w1);
  try {
    opt->step(pv, gv);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("gradient of 'w1' is on cpu but the optimizer runs on cuda:0"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(meshmuon::test::to_host(*fake, d0, 24), w0);
}

TEST(DeviceEngine, DeviceOptionIsValidated) {
  const std::vector<ParamInfo> info = {{"w", {4, 6}}};
  const std::vector<ParamGroup> groups = {{GroupOptions{}, {0}}};
  for (const char* bad : {"tpu", "cuda:", "cuda:-1", "cuda:x", "CPU"}) {
    LocalOptimizerOptions o;
    o.device = bad;
    try {
      LocalOptimizer opt(info, groups, o);
      FAIL() << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("option 'device' must be cpu, cuda or cuda:N"), std::string::npos) << e.what();
    }
  }
  LocalOptimizerOptions o;
  o.device = "cuda:0";  // no device here (or no CUDA in the build): the backend's own error
  try {
    LocalOptimizer opt(info, groups, o);
    SUCCEED() << "a CUDA device is present";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("[cuda]"), std::string::npos) << e.what();
  }
  // the cpu backend rejects device views (a caller passing cuda tensors to a cpu optimizer)
  LocalOptimizer opt(info, groups);
  std::vector<float> w(24), g(24, 1.0f);
  std::vector<TensorView> pv = {TensorView(w.data(), info[0].shape)}, gv = {TensorView(g.data(), info[0].shape)};
  pv[0].device = {meshmuon::DeviceKind::Cuda, 0};
  EXPECT_THROW(opt.step(pv, gv), std::invalid_argument);
}

// An engine on a device backend refuses a communicator that moves host memory only (its copies
// would dereference device memory on the host), naming the fix; the same engine with a
// communicator made for the device's memory is accepted (the control).
TEST(DeviceEngine, HostOnlyCommunicatorIsRefused) {
  auto fake = std::make_shared<FakeDeviceBackend>();
  const meshmuon::detail::ScopedEngineDevice inject({fake, fake->space()});
  const auto inventory = [] {
    meshmuon::Inventory inv;
    inv.model = "t";
    inv.mesh_names = {"dense"};
    inv.meshes = {meshmuon::Mesh::parse("")};
    inv.params.resize(1);
    inv.params[0].name = "w", inv.params[0].shape = {4, 6};
    return inv;
  };
  const std::vector<ParamGroup> groups = {{GroupOptions{}, {0}}};
  std::shared_ptr<meshmuon::Communicator> host_only = meshmuon::make_single_communicator();
  EXPECT_FALSE(host_only->device_buffers());
  try {
    meshmuon::Optimizer opt(host_only, inventory(), groups);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[optim] the engine runs on cuda "), std::string::npos) << m;
    EXPECT_NE(m.find("communicator 'world' (backend 'single') carries host memory only"), std::string::npos) << m;
    EXPECT_NE(m.find("make_single_communicator(\"cuda\")"), std::string::npos) << m;
  }
  std::shared_ptr<meshmuon::Communicator> on_device = meshmuon::make_single_communicator(fake->space());
  EXPECT_TRUE(on_device->device_buffers());
  EXPECT_TRUE(on_device->split(0, 0, "sub")->device_buffers());  // inherited by split
  EXPECT_NO_THROW(meshmuon::Optimizer(on_device, inventory(), groups));
}

// ---- the real cuda backend (skipped without a GPU) ----------------------------------------------

// Bound: AdamW and the element-wise kernels are meant to be bitwise the cpu's; Newton–Schulz runs as
// cuBLAS GEMMs in another summation order, so Muon parameters differ by rounding: after 4 steps of
// fp32 communication every parameter is within 1e-4 of the cpu run's (the updates are lr × O(1)
// with lr ≤ 0.02, their relative differences ~1e-5).
TEST(CudaEngine, LocalOptimizerMatchesCpuWithinBound) {
  std::shared_ptr<Backend> cuda;
  try {
    cuda = meshmuon::detail::make_cuda_backend(0);
  } catch (const std::exception& e) {
    GTEST_SKIP() << e.what();
  }
  LocalOptimizerOptions o;
  const RunResult cpu = run(nullptr, o, 4);
  o.device = "cuda:0";
  const RunResult dev = run(nullptr, o, 4);
  ASSERT_EQ(cpu.applied, dev.applied);
  for (size_t i = 0; i < cpu.params.size(); ++i)
    for (size_t j = 0; j < cpu.params[i].size(); ++j)
      ASSERT_NEAR(cpu.params[i][j], dev.params[i][j], 1e-4) << "param " << i << " element " << j;
}

}  // namespace
