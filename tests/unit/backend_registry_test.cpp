// The backend registry (src/backend/registry.h) and the two backend interfaces as a plug-in point:
// the built-in registrations (cpu always, cuda available or missing with its reason), the device
// names select_device accepts, a test-only backend (tests/support/delegate_backend.h) registered at
// run time that an engine finds by name and that gives the cpu backend's bits, and the refusal by
// name of an orthogonalization method a backend does not declare (never a substitution).
// Run: build/bin/backend_registry_test
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "backend/select.h"
#include "comm/transport_registry.h"
#include "../support/delegate_backend.h"
#include "meshmuon/comm_nccl.h"
#include "meshmuon/error.h"
#include "meshmuon/local_optimizer.h"
#include "test_support.h"

namespace meshmuon::detail {
namespace {

using meshmuon::test::DelegateBackend;
using meshmuon::test::randn;
using meshmuon::test::ScopedDelegateBackend;

bool has(const std::vector<std::string>& names, const std::string& n) {
  return std::find(names.begin(), names.end(), n) != names.end();
}

TEST(BackendRegistry, BuiltInBackendsAreRegisteredOrSayWhyNot) {
  const BackendRegistry& r = backend_registry();
  const std::vector<std::string> names = r.names();
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[0], "cpu");
  EXPECT_TRUE(has(names, "cuda")) << "the cuda unit pair registers cuda either way (cuda_backend.cpp or no_cuda.cpp)";
  EXPECT_EQ(r.why_missing("cpu"), "");
  EXPECT_FALSE(r.indexed("cpu"));
  EXPECT_TRUE(r.indexed("cuda"));
  EXPECT_EQ(r.label("cuda"), "CUDA");  // in messages: "no usable CUDA device"
  EXPECT_EQ(r.label("cpu"), "cpu");
  const std::string cuda_why = r.why_missing("cuda");
  if (!cuda_why.empty()) {  // a build without CUDA: the reason and what to do
    EXPECT_NE(cuda_why.find("built without CUDA"), std::string::npos) << cuda_why;
    try {
      (void)r.make("cuda", 0);
      FAIL() << "a missing backend must not be made";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "[cuda] " + cuda_why);
    }
  }
  EXPECT_EQ(r.why_missing("tpu").rfind("not registered (registered: cpu, cuda", 0), 0u) << r.why_missing("tpu");
  EXPECT_THROW((void)r.make("tpu", 0), std::invalid_argument);
  EXPECT_EQ(r.device_names().rfind("cpu, cuda or cuda:N", 0), 0u) << r.device_names();
  EngineDevice cpu = r.make("cpu", 0);
  EXPECT_EQ(cpu.backend->name(), "cpu");
  EXPECT_EQ(cpu.space.get(), host_memory_space().get());
}

TEST(BackendRegistry, BuiltInTransportsAreRegisteredOrSayWhyNot) {
  const TransportRegistry& r = transport_registry();
  const std::vector<std::string> names = r.names();
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names[0], "single");
  EXPECT_EQ(names[1], "mpi");
  EXPECT_EQ(names[2], "nccl");
  EXPECT_EQ(r.why_missing("single"), "");
  EXPECT_EQ(r.why_missing("mpi").empty(), mpi_available()) << r.why_missing("mpi");
  EXPECT_EQ(r.why_missing("nccl").empty(), nccl_available()) << r.why_missing("nccl");
  auto world = r.make_world("single");
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->backend(), "single");
  EXPECT_THROW((void)r.make_world("gloo"), std::invalid_argument);
}

TEST(BackendRegistry, DeviceNamesGoThroughTheRegistry) {
  EXPECT_EQ(select_device("cpu").backend->name(), "cpu");
  for (const char* bad : {"tpu", "cpu:0", "cuda:x", "cuda:-1", ":0", ""}) {
    try {
      (void)select_device(bad);
      FAIL() << "'" << bad << "' accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("option 'device' must be cpu, cuda or cuda:N (got '" + std::string(bad) + "')"),
                std::string::npos)
          << e.what();
    }
  }
  {
    ScopedDelegateBackend reg("delegate");
    EXPECT_TRUE(has(backend_registry().names(), "delegate"));
    EXPECT_EQ(select_device("delegate").backend->name(), "delegate");
    EXPECT_THROW((void)select_device("delegate:1"), std::invalid_argument);  // registered without an index
    EXPECT_NE(backend_registry().device_names().find("delegate"), std::string::npos);
  }
  EXPECT_FALSE(has(backend_registry().names(), "delegate")) << "removed with its scope";
  EXPECT_THROW((void)select_device("delegate"), std::invalid_argument);
}

// Two parameters of one Muon group (a tall and a wide matrix) and an AdamW bias, `steps` steps;
// `bump` is added to the tall matrix's first gradient element at step 1 (the negative control).
std::vector<std::vector<float>> run(const std::string& device, NsMethod method, int steps, float bump = 0.0f) {
  const std::vector<ParamInfo> info = {{"w_tall", {24, 10}}, {"w_wide", {10, 24}}, {"bias", {16}}};
  GroupOptions muon;
  muon.lr = 0.02, muon.weight_decay = 0.1, muon.normuon = true;
  muon.ns.method = method;
  GroupOptions adamw;
  adamw.algorithm = Algorithm::AdamW, adamw.lr = 3e-3;
  LocalOptimizerOptions o;
  o.device = device;
  LocalOptimizer opt(info, {ParamGroup{muon, {0, 1}}, ParamGroup{adamw, {2}}}, o);
  std::vector<std::vector<float>> p, g(info.size());
  for (size_t i = 0; i < info.size(); ++i)
    p.push_back(randn(static_cast<size_t>(info[i].shape.numel()), 5 + 11 * static_cast<uint32_t>(i), 0.5f));
  for (int t = 1; t <= steps; ++t) {
    std::vector<TensorView> pv, gv;
    for (size_t i = 0; i < info.size(); ++i) {
      g[i] = randn(p[i].size(), 100 * static_cast<uint32_t>(t) + static_cast<uint32_t>(i), 1.0f);
      if (t == 1 && i == 0) g[i][0] += bump;
      pv.emplace_back(p[i].data(), info[i].shape);
      gv.emplace_back(g[i].data(), info[i].shape);
    }
    EXPECT_TRUE(opt.step(pv, gv));
  }
  return p;
}

TEST(BackendRegistry, AnEngineRunsOnARegisteredTestBackendWithTheCpuBits) {
  ScopedDelegateBackend reg("delegate");
  for (NsMethod m : {NsMethod::Symmetric, NsMethod::Gram}) {
    const auto want = run("cpu", m, 3);
    const auto got = run("delegate", m, 3);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0)
          << "parameter " << i << " differs from the cpu backend's bits (" << to_string(m) << ")";
  }
  // Negative control: the comparison sees a difference where one is made (one gradient element
  // moved by 1.0 at step 1). Not another method: plain and symmetric can round alike on a core.
  const auto want = run("cpu", NsMethod::Symmetric, 3), moved = run("delegate", NsMethod::Symmetric, 3, 1.0f);
  EXPECT_NE(std::memcmp(moved[0].data(), want[0].data(), want[0].size() * sizeof(float)), 0);
}

TEST(BackendRegistry, AMethodTheBackendLacksIsRefusedByNameAtConstruction) {
  ScopedDelegateBackend few("nogram", std::vector<NsMethod>{NsMethod::Plain, NsMethod::Symmetric});
  try {
    (void)run("nogram", NsMethod::Gram, 0);
    FAIL() << "an engine asking the backend for a method it does not declare must be refused";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[nogram] orthogonalization method 'gram' is not implemented by the nogram backend "
                        "(it implements: plain, symmetric)"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("(Python: ns_method)"), std::string::npos) << what;
  }
  // What it declares runs, with the cpu's bits.
  const auto want = run("cpu", NsMethod::Symmetric, 2);
  const auto got = run("nogram", NsMethod::Symmetric, 2);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0) << i;
  // A backend that declares nothing refuses every method (no default that claims them all).
  DelegateBackend none("none", std::vector<NsMethod>{});
  try {
    (void)none.make_orthogonalizer(NsOptions{});
    FAIL() << "refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("(it implements: none)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshmuon::detail
