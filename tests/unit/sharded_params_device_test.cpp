// ShardedParams on a device backend at one rank (the distributed runs are in
// tests/dist/sharded_params_device_dist_test.cpp): caller tensors on the wrong device are named before
// anything changes; the device option is validated; the negative control that the host path on
// fake device memory faults (so the bitwise runs prove ShardedParams never touches it from the
// host); and the real cuda backend bitwise against the cpu one (skipped without a GPU).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../support/fake_device.h"
#include "backend/backend.h"
#include "comm/staging.h"
#include "meshmuon/comm.h"
#include "meshmuon/mesh_comms.h"
#include "meshmuon/sharded_params.h"
#include "backend/select.h"

namespace {

using meshmuon::DType;
using meshmuon::Mesh;
using meshmuon::ParamSpec;
using meshmuon::ShardedParams;
using meshmuon::ShardedParamsOptions;
using meshmuon::TensorView;
using meshmuon::detail::Backend;
using meshmuon::detail::Buffer;
using meshmuon::detail::MemoryKind;
using meshmuon::test::FakeDeviceBackend;

std::vector<ParamSpec> model() {
  std::vector<ParamSpec> ps(2);
  ps[0].name = "w", ps[0].shape = {3, 4};
  ps[1].name = "bias", ps[1].shape = {5}, ps[1].role = meshmuon::Role::AdamW;
  return ps;
}

std::shared_ptr<meshmuon::MeshCommunicators> comms(std::shared_ptr<meshmuon::detail::MemorySpace> space) {
  return std::make_shared<meshmuon::MeshCommunicators>(
      std::shared_ptr<meshmuon::Communicator>(meshmuon::make_single_communicator(std::move(space))));
}

std::unique_ptr<ShardedParams> make_on(const std::shared_ptr<Backend>& be, std::shared_ptr<meshmuon::detail::MemorySpace> space,
                                       ShardedParamsOptions o = {}) {
  const meshmuon::detail::ScopedEngineDevice inject({be, space});
  return std::make_unique<ShardedParams>(comms(space), Mesh::parse(""), model(), o);
}

std::vector<float> host_of(Backend& b, const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  if (!out.empty()) b.copy(out.data(), v.data, out.size() * 4);
  return out;
}

TEST(ShardedParamsDevice, TensorsOnTheWrongDeviceAreNamedBeforeAnythingChanges) {
  auto fake = std::make_shared<FakeDeviceBackend>();
  auto sp = make_on(fake, fake->space());
  EXPECT_EQ(sp->param(0).device, fake->device());
  EXPECT_EQ(sp->grad(1).device, fake->device());
  EXPECT_EQ(sp->full_grad(0).device, fake->device());
  const std::vector<float> ones(12, 1.0f);
  fake->copy(sp->param(0).data, ones.data(), 48);
  // Host tensors handed to a ShardedParams on the (fake) device.
  std::vector<float> w(12, 2.0f), b(5, 3.0f);
  const std::vector<TensorView> host = {TensorView(w.data(), meshmuon::Shape{3, 4}), TensorView(b.data(), meshmuon::Shape{5})};
  for (int which = 0; which < 2; ++which) {
    try {
      if (which == 0) sp->reduce_grads_from(host);
      else sp->unshard_into(host);
      FAIL() << "host tensors accepted";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("parameter 'w'"), std::string::npos) << what;
      EXPECT_NE(what.find("field 'device'"), std::string::npos) << what;
      EXPECT_NE(what.find("cpu"), std::string::npos) << what;
    }
  }
  EXPECT_EQ(w, std::vector<float>(12, 2.0f));                           // the host tensors untouched
  EXPECT_EQ(host_of(*fake, sp->grad(0)), std::vector<float>(12, 0.0f));  // nothing reduced
  EXPECT_EQ(host_of(*fake, sp->param(0)), ones);
  // Device tensors handed to a ShardedParams on the cpu backend.
  ShardedParams cpu(comms(meshmuon::detail::host_memory_space()), Mesh::parse(""), model());
  std::vector<TensorView> dev = host;
  dev[1].device = {meshmuon::DeviceKind::Cuda, 0};
  try {
    cpu.reduce_grads_from(dev);
    FAIL() << "a cuda tensor accepted by the cpu backend";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'bias'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(host_of(*meshmuon::detail::make_cpu_backend(), cpu.grad(0)), std::vector<float>(12, 0.0f));
}

TEST(ShardedParamsDevice, DeviceOptionIsValidated) {
  for (const char* bad : {"tpu", "cuda:", "cuda:x", "CPU"}) {
    ShardedParamsOptions o;
    o.device = bad;
    try {
      ShardedParams sp(comms(meshmuon::detail::host_memory_space()), Mesh::parse(""), model(), o);
      FAIL() << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("[fsdp] options.device"), std::string::npos) << e.what();
    }
  }
  ShardedParamsOptions o;
  o.device = "cuda:0";  // no device here (or no CUDA in the build): the backend's own error, on every rank
  try {
    ShardedParams sp(comms(meshmuon::detail::default_memory_space()), Mesh::parse(""), model(), o);
    SUCCEED() << "a CUDA device is present";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("[cuda]"), std::string::npos) << e.what();
  }
}

// On a device backend, a communicator that moves host memory only is refused through the
// agreement (so every rank fails alike), naming the fix; the fake device's own space is accepted.
TEST(ShardedParamsDevice, HostOnlyCommunicatorIsRefused) {
  auto fake = std::make_shared<FakeDeviceBackend>();
  try {
    make_on(fake, meshmuon::detail::host_memory_space());
    FAIL() << "expected an error";
  } catch (const meshmuon::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[fsdp] rank 0: backend 'fake-device' refused: the engine runs on cuda "), std::string::npos) << m;
    EXPECT_NE(m.find("carries host memory only"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(make_on(fake, fake->space()));
}

// The negative control: the host path (the cpu backend's kernels, what ShardedParams ran before
// it went through its backend) and any host touch of a ShardedParams buffer fault on fake device
// memory, so the bitwise fake-device runs prove every touch went through the backend.
TEST(ShardedParamsDeviceDeathTest, HostPathOnFakeDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto fake = std::make_shared<FakeDeviceBackend>();
  auto sp = make_on(fake, fake->space());
  float* p = sp->param(0).f32();
  float* g = sp->full_grad(0).f32();
  EXPECT_DEATH({ volatile float x = p[0]; (void)x; }, "");
  EXPECT_DEATH({ g[0] = 1.0f; }, "");
  auto cpu = meshmuon::detail::make_cpu_backend();
  EXPECT_DEATH({ cpu->ordered_sum(g, DType::F32, 4, 3, p); }, "");
  EXPECT_DEATH({ cpu->convert(g, DType::BF16, p, DType::F32, 4); }, "");
  EXPECT_DEATH({ cpu->divide(p, 4, 3.0f); }, "");
  // ... while the same operations through the fake backend are fine
  fake->divide(p, 4, 3.0f);
  fake->ordered_sum(g, DType::F32, 4, 3, p);
}

// The real cuda backend: copies, conversions, fixed-order sums and the division are the cpu's
// per-element operations, so a one-rank run is bitwise the cpu backend's.
TEST(CudaShardedParams, BitwiseEqualsCpu) {
  std::shared_ptr<Backend> cuda;
  try {
    cuda = meshmuon::detail::make_cuda_backend(0);
  } catch (const std::exception& e) {
    GTEST_SKIP() << e.what();
  }
  std::vector<std::vector<float>> results[2];
  for (int on_cuda = 0; on_cuda < 2; ++on_cuda) {
    std::shared_ptr<Backend> be = on_cuda ? cuda : meshmuon::detail::make_cpu_backend();
    ShardedParamsOptions o;
    o.param_dtype = DType::BF16, o.reduce_dtype = DType::BF16, o.grad_divisor = 3;
    auto sp = make_on(be, on_cuda ? meshmuon::detail::default_memory_space() : meshmuon::detail::host_memory_space(), o);
    for (size_t i = 0; i < sp->size(); ++i) {
      std::vector<float> h(static_cast<size_t>(sp->param(i).numel()));
      for (size_t j = 0; j < h.size(); ++j) h[j] = 0.1f * static_cast<float>(j) - 0.37f * static_cast<float>(i);
      be->copy(sp->param(i).data, h.data(), h.size() * 4);
      be->copy(sp->full_grad(i).data, h.data(), h.size() * 4);
    }
    sp->reduce_grads();
    sp->unshard();
    for (size_t i = 0; i < sp->size(); ++i) {
      results[on_cuda].push_back(host_of(*be, sp->grad(i)));
      std::vector<float> f(static_cast<size_t>(sp->full_param(i).numel()) / 2 + 1, 0.0f);  // bf16 bits
      be->copy(f.data(), sp->full_param(i).data, static_cast<size_t>(sp->full_param(i).numel()) * 2);
      results[on_cuda].push_back(f);
    }
  }
  for (size_t k = 0; k < results[0].size(); ++k)
    EXPECT_EQ(std::memcmp(results[0][k].data(), results[1][k].data(), results[0][k].size() * 4), 0) << k;
}

}  // namespace
