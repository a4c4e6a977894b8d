// meshmuon::Optimizer on the fake device backend (tests/support/fake_device.h: device memory the host
// cannot touch) over the mpi communicator staging that memory through the backend's memory space:
// parameters and every state tensor BITWISE equal to the same run on the cpu backend over the plain
// communicator, for several meshes (dp_shard = FSDP-style sharding, tp, ep, their mixes), fp32 and
// bf16 communication, windows 1 and 2, offload on and off, and the gram_allreduce strategy; the
// Muon / NorMuon / QK-clip / expert / AdamW groups of the fixture, a bf16 gradient and a parameter
// without gradient.
//   mpirun -n 3 --oversubscribe build/bin/optimizer_test --gtest_filter='DeviceEngineDist*'
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "fake_device_job.h"

namespace meshmuon {
namespace {

struct DeviceRun {
  std::vector<std::vector<std::vector<uint32_t>>> after;  // per step: params then state, raw bits
  int64_t device_comm_bytes = 0;                          // bytes staged by the space (fake runs)
};

// Raw bits of n floats at p, read through `b` (device or host memory).
std::vector<uint32_t> bits(detail::Backend& b, const void* p, int64_t n) {
  std::vector<uint32_t> out(static_cast<size_t>(n));
  if (n) b.copy(out.data(), p, static_cast<size_t>(n) * 4);
  return out;
}

DeviceRun run_on(bool fake_device, const std::string& parallel, const std::string& strategy, DType comm_dtype,
                 int window, bool offload, int steps) {
  Inventory inv = make_inventory(parallel);
  const size_t n = inv.params.size();
  OptimizerOptions o = options_for({"", strategy, comm_dtype});
  o.window = window;
  o.offload_state = offload;
  test::DeviceJob job(fake_device);  // collective
  const std::shared_ptr<detail::Backend>& backend = job.backend;
  auto opt = std::make_unique<Optimizer>(job.world, inv, test_groups(n, strategy != "gram_allreduce"), o);
  const detail::MemoryKind kind = fake_device ? detail::MemoryKind::Device : detail::MemoryKind::Host;
  const Device dev = backend->device();
  std::vector<detail::Buffer> w, g;
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = opt->local_shape(i).numel();
    std::vector<float> h(static_cast<size_t>(numel));
    for (int64_t j = 0; j < numel; ++j) h[static_cast<size_t>(j)] = value(static_cast<int>(i), j + 1000 * comm().rank(), 9, false);
    w.push_back(backend->allocate(h.size() * 4, kind));
    backend->copy(w.back().data(), h.data(), h.size() * 4);
    g.push_back(backend->allocate(h.size() * 4, kind));
  }
  DeviceRun out;
  for (int t = 0; t < steps; ++t) {
    std::vector<TensorView> lw, lg;
    for (size_t i = 0; i < n; ++i) {
      const int64_t numel = opt->local_shape(i).numel();
      std::vector<float> h(static_cast<size_t>(numel));
      for (int64_t j = 0; j < numel; ++j) h[static_cast<size_t>(j)] = value(static_cast<int>(i), j + 1000 * comm().rank(), t, false);
      lw.emplace_back(w[i].as<float>(), opt->local_shape(i)), lw.back().device = dev;
      if (i == 1) {  // a bf16 gradient (its buffer holds bf16 values in the first half)
        std::vector<BFloat16> b(h.size());
        for (size_t j = 0; j < h.size(); ++j) b[j] = float_to_bf16(h[j]);
        backend->copy(g[i].data(), b.data(), b.size() * 2);
        lg.emplace_back(g[i].as<BFloat16>(), opt->local_shape(i)), lg.back().device = dev;
      } else {
        backend->copy(g[i].data(), h.data(), h.size() * 4);
        lg.emplace_back(g[i].as<float>(), opt->local_shape(i)), lg.back().device = dev;
      }
      if (t == 1 && i == 0) lg.back() = TensorView();  // no gradient this step
    }
    EXPECT_TRUE(opt->step(lw, lg, {{0, {50.0f, 3.0f}}}));
    auto& snap = out.after.emplace_back();
    for (size_t i = 0; i < n; ++i) {
      snap.push_back(bits(*backend, w[i].data(), opt->local_shape(i).numel()));
      for (const std::string& k : opt->state_keys(i)) {
        const TensorView v = opt->state(i, k);
        EXPECT_EQ(v.device, fake_device && !offload ? dev : Device{}) << k;
        snap.push_back(bits(*backend, v.data, v.numel()));
      }
    }
  }
  if (job.space) out.device_comm_bytes = static_cast<int64_t>(job.space->to_host + job.space->to_device);
  return out;
}

TEST(DeviceEngineDist, FakeDeviceBitwiseEqualsCpu) {
  if (test::expected_backend() != "mpi") GTEST_SKIP() << "needs the mpi communicator";
  int64_t staged = 0;
  for (const std::string& parallel : shard_parallels())
    for (DType c : {DType::F32, DType::BF16})
      for (int window : {1, 2})
        for (bool offload : {false, true}) {
          const DeviceRun cpu = run_on(false, parallel, "auto", c, window, offload, 3);
          const DeviceRun dev = run_on(true, parallel, "auto", c, window, offload, 3);
          ASSERT_EQ(cpu.after.size(), dev.after.size());
          for (size_t t = 0; t < cpu.after.size(); ++t)
            EXPECT_TRUE(cpu.after[t] == dev.after[t]) << parallel << " comm " << to_string(c) << " window " << window
                                                      << (offload ? " offload" : "") << ": step " << t
                                                      << " parameters or state differ on the fake device";
          staged += dev.device_comm_bytes;
        }
  // the device buffers really went through the space (at np 1 nothing travels between ranks)
  if (comm().size() > 1) EXPECT_GT(staged, 0);
}

TEST(DeviceEngineDist, GramAllReduceFakeDeviceBitwiseEqualsCpu) {
  if (test::expected_backend() != "mpi") GTEST_SKIP() << "needs the mpi communicator";
  const std::string parallel = "dp_shard=" + std::to_string(comm().size());
  for (DType c : {DType::F32, DType::BF16}) {
    const DeviceRun cpu = run_on(false, parallel, "gram_allreduce", c, 1, false, 3);
    const DeviceRun dev = run_on(true, parallel, "gram_allreduce", c, 1, false, 3);
    EXPECT_TRUE(cpu.after == dev.after) << parallel << " comm " << to_string(c);
  }
}

// One rank passes a host view to the fake device engine: every rank fails the step (that rank's
// error names the parameter, the others' that rank), nothing is modified anywhere, and a correct step afterwards still works.
// An Optimizer on the fake device over the mpi communicator (dp_shard = world), its parameters and
// gradients in fake device memory: the setting of the error tests below.
struct FakeDeviceSteps {
  std::shared_ptr<test::FakeDeviceBackend> fake = std::make_shared<test::FakeDeviceBackend>();
  std::unique_ptr<Optimizer> opt;
  std::vector<detail::Buffer> keep;
  std::vector<std::vector<float>> initial;  // the parameters before any step
  std::vector<TensorView> lw, lg;
  size_t n = 0;
  FakeDeviceSteps() {
    Inventory inv = make_inventory("dp_shard=" + std::to_string(comm().size()));
    n = inv.params.size();
    auto space = fake->space();
    std::shared_ptr<Communicator> world = make_mpi_communicator(space, detail::StagingOptions{});
    {
      const detail::ScopedEngineDevice inject({fake, space});
      opt = std::make_unique<Optimizer>(world, inv, test_groups(n), options_for({"", "auto", DType::F32}));
    }
    const Device dev = fake->device();
    for (size_t i = 0; i < n; ++i) {
      std::vector<float> h(static_cast<size_t>(opt->local_shape(i).numel()), 1.0f + static_cast<float>(i));
      initial.push_back(h);
      lw.emplace_back(test::to_device(*fake, keep, h), opt->local_shape(i)), lw.back().device = dev;
      lg.emplace_back(test::to_device(*fake, keep, std::vector<float>(h.size(), 0.5f)), opt->local_shape(i));
      lg.back().device = dev;
    }
  }
  // Nothing modified since construction, then a correct step applies.
  void expect_untouched_then_a_step_runs() {
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(test::to_host(*fake, lw[i].f32(), initial[i].size()), initial[i]) << i;
    EXPECT_EQ(opt->step_count(3), 0);
    EXPECT_TRUE(opt->step(lw, lg, {{0, {50.0f, 3.0f}}}));
    EXPECT_NE(test::to_host(*fake, lw[3].f32(), initial[3].size()), initial[3]);
  }
};

TEST(DeviceEngineDist, MismatchedDeviceOnOneRankFailsEveryRank) {
  if (test::expected_backend() != "mpi") GTEST_SKIP() << "needs the mpi communicator";
  FakeDeviceSteps run;
  std::vector<float> host_w = run.initial[3];
  std::vector<TensorView> bad = run.lw;
  if (comm().rank() == comm().size() - 1) bad[3] = TensorView(host_w.data(), run.opt->local_shape(3));  // cpu view
  std::string error;
  try {
    run.opt->step(bad, run.lg, {{0, {50.0f, 3.0f}}});
  } catch (const std::exception& e) {
    error = e.what();
  }
  const int last = comm().size() - 1;
  if (comm().rank() == last)  // the rank at fault names the parameter, the others name that rank
    EXPECT_NE(error.find("parameter 'w1364' is on cpu but the optimizer runs on cuda:0"), std::string::npos) << error;
  else
    EXPECT_NE(error.find("rank " + std::to_string(last) + " rejected its step inputs"), std::string::npos) << error;
  run.expect_untouched_then_a_step_runs();
}

// A device fault on one rank before the step (its non-finite scan meets it: a fault of queued work,
// which may be the previous step's tail) fails every rank with meshmuon::Error, not the
// std::invalid_argument of rejected inputs (was: the fault read as bad inputs, and the other
// ranks blamed that rank's inputs); nothing is modified, and the next step runs.
TEST(DeviceEngineDist, DeviceFaultOnOneRankIsARuntimeErrorOnEveryRank) {
  if (test::expected_backend() != "mpi") GTEST_SKIP() << "needs the mpi communicator";
  FakeDeviceSteps run;
  const int last = comm().size() - 1;
  if (comm().rank() == last) run.fake->fail_next_scan = true;
  std::string error, kind = "none";
  try {
    run.opt->step(run.lw, run.lg, {{0, {50.0f, 3.0f}}});
  } catch (const std::invalid_argument& e) {
    error = e.what(), kind = "invalid_argument";
  } catch (const Error& e) {
    error = e.what(), kind = "meshmuon::Error";
  }
  EXPECT_EQ(kind, "meshmuon::Error") << error;
  if (comm().rank() == last)
    EXPECT_NE(error.find("an injected device fault"), std::string::npos) << error;
  else
    EXPECT_NE(error.find("rank " + std::to_string(last) + " failed before the step (a runtime error"), std::string::npos) << error;
  run.expect_untouched_then_a_step_runs();
}

// Ranks on different backends (here rank 0 on the fake device, the others on the cpu) are refused
// at construction on every rank: the backend's name is part of the agreed options (the device
// index is not: each rank may drive its own GPU).
TEST(DeviceEngineDist, RanksOnDifferentBackendsAreRefused) {
  if (test::expected_backend() != "mpi") GTEST_SKIP() << "needs the mpi communicator";
  if (comm().size() < 2) GTEST_SKIP() << "needs two ranks";
  Inventory inv = make_inventory("dp_shard=" + std::to_string(comm().size()));
  const size_t n = inv.params.size();
  auto fake = std::make_shared<test::FakeDeviceBackend>();
  std::shared_ptr<detail::MemorySpace> space = fake->space();
  if (comm().rank() != 0) space = detail::host_memory_space();
  std::shared_ptr<Communicator> world = make_mpi_communicator(space, detail::StagingOptions{});
  std::unique_ptr<detail::ScopedEngineDevice> inject;
  if (comm().rank() == 0) inject = std::make_unique<detail::ScopedEngineDevice>(detail::EngineDevice{fake, space});
  std::string error;
  try {
    Optimizer opt(world, inv, test_groups(n), options_for({"", "auto", DType::F32}));
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("ranks disagree on the optimizer options"), std::string::npos) << error;
  EXPECT_NE(error.find("backend fake-device"), std::string::npos) << error;
  EXPECT_NE(error.find("backend cpu"), std::string::npos) << error;
}

// A rank whose device cannot be used (here an invalid name; on a GPU machine a missing ordinal)
// fails construction on every rank instead of leaving the others waiting in the agreement.
TEST(DeviceEngineDist, DeviceErrorOnOneRankFailsEveryRank) {
  Inventory inv = make_inventory("dp_shard=" + std::to_string(comm().size()));
  OptimizerOptions o = options_for({"", "auto", DType::F32});
  const int last = comm().size() - 1;
  if (comm().rank() == last) o.device = "cuda:x";
  std::string error;
  try {
    Optimizer opt(shared_comm(), inv, test_groups(inv.params.size()), o);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (comm().rank() == last)
    EXPECT_NE(error.find("option 'device' must be cpu, cuda or cuda:N (got 'cuda:x')"), std::string::npos) << error;
  else
    EXPECT_NE(error.find("rank " + std::to_string(last) + " could not build the optimizer"), std::string::npos) << error;
}

}  // namespace
}  // namespace meshmuon
