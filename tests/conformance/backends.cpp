// conformance_backends(): every backend of backend_registry() (src/backend/registry.h), in its
// registration order (cpu, the reference, first; cuda on a real GPU, or on the host emulation of
// tests/cuda_emu when the binary links it), then the test-only fake device (tests/support/
// fake_device.h: the cpu kernels behind PROT_NONE "device" memory). A backend missing from this
// build, or whose device this machine lacks, is skipped with the reason.
//
// The bounds: the cpu and fake-device backends run the same kernels, so every result is bitwise.
// The cuda backend's element-wise kernels, data movement and NorMuon are bitwise the cpu's (same
// operations in the same order, no contraction); its Newton–Schulz products come from cuBLAS, which
// sums each dot product in its own order (tiling, split-k), so an orthogonalized matrix is bounded,
// not bitwise: relative Frobenius distance 1e-4 with fp32 products (five steps amplify the
// per-product rounding of ~1e-6 by the polynomial's slope, ≤ ~30 on the schedules used) and 3e-2
// with bf16 products (two bf16 roundings of 2⁻⁸ per step); singular values within 1e-3 / 5e-2 of the
// cpu result's. The same bounds held in tests/unit/cuda_backend_test.cpp since the backend landed.
// A registered backend this file does not name is held to bitwise and to lacking no method, so a new
// backend fails here until its bounds and lacked methods are written down.
#include "backends.h"

#include <map>
#include <stdexcept>

#include "../support/fake_device.h"
#include "backend/registry.h"

namespace meshmuon::conformance {
namespace {

// What the suite knows of each registered backend: its bounds and the methods it lacks.
struct Declared {
  double ns_fp32 = 0, ns_bf16 = 0, sigma_fp32 = 0, sigma_bf16 = 0;
  std::set<std::string> lacks;
};

const std::map<std::string, Declared>& declared() {
  // cuda implements plain and symmetric (KernelCaps::ns_methods): `gram` and a method registered by
  // a program are refused by name at construction (issue 36).
  static const std::map<std::string, Declared> d = {
      {"cpu", {}},
      {"cuda", {1e-4, 3e-2, 1e-3, 5e-2, {"gram", "conformance_test_method"}}},
  };
  return d;
}

ConformanceBackend registered(const std::string& name) {
  auto it = declared().find(name);
  const Declared d = it == declared().end() ? Declared{} : it->second;
  auto make = [name](std::string* why) -> std::shared_ptr<detail::Backend> {
    const detail::BackendRegistry& r = detail::backend_registry();
    if (std::string missing = r.why_missing(name); !missing.empty()) {
      if (why) *why = missing;
      return nullptr;
    }
    if (!r.device_found(name)) {
      if (why) *why = "no usable " + r.label(name) + " device";
      return nullptr;
    }
    return r.make(name, 0).backend;
  };
  return {name, make, d.ns_fp32, d.ns_bf16, d.sigma_fp32, d.sigma_bf16, d.lacks};
}

}  // namespace

std::vector<ConformanceBackend> conformance_backends() {
  std::vector<ConformanceBackend> out;
  for (const std::string& name : detail::backend_registry().names()) out.push_back(registered(name));
  out.push_back({"fake_device",
                 [](std::string*) -> std::shared_ptr<detail::Backend> { return std::make_shared<test::FakeDeviceBackend>(); },
                 0, 0, 0, 0, {}});
  return out;
}

const ConformanceBackend& conformance_backend(const std::string& name) {
  static const std::vector<ConformanceBackend> all = conformance_backends();
  for (const ConformanceBackend& b : all)
    if (b.name == name) return b;
  throw std::invalid_argument("no conformance backend '" + name + "'");
}

std::vector<std::string> conformance_backend_names() {
  std::vector<std::string> names;
  for (const ConformanceBackend& b : conformance_backends()) names.push_back(b.name);
  return names;
}

}  // namespace meshmuon::conformance
