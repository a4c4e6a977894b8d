// conformance_backends(): cpu (the reference), the fake device (tests/support/fake_device.h: the
// cpu kernels behind PROT_NONE "device" memory), and cuda (a real GPU, or the host emulation of
// tests/cuda_emu when the binary links it; skipped where no device is found).
//
// The bounds: the cpu and fake-device backends run the same kernels, so every result is bitwise.
// The cuda backend's element-wise kernels, data movement and NorMuon are bitwise the cpu's (same
// operations in the same order, no contraction); its Newton–Schulz products come from cuBLAS, which
// sums each dot product in its own order (tiling, split-k), so an orthogonalized matrix is bounded,
// not bitwise: relative Frobenius distance 1e-4 with fp32 products (five steps amplify the
// per-product rounding of ~1e-6 by the polynomial's slope, ≤ ~30 on the schedules used) and 3e-2
// with bf16 products (two bf16 roundings of 2⁻⁸ per step); singular values within 1e-3 / 5e-2 of the
// cpu result's. The same bounds held in tests/unit/cuda_backend_test.cpp since the backend landed.
#include "backends.h"

#include <stdexcept>

#include "../support/fake_device.h"
#if MESHMUON_CONFORMANCE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace meshmuon::conformance {

std::vector<ConformanceBackend> conformance_backends() {
  std::vector<ConformanceBackend> out;
  out.push_back({"cpu", [](std::string*) { return detail::make_cpu_backend(); }, 0, 0, 0, 0, {}});
  out.push_back({"fake_device",
                 [](std::string*) -> std::shared_ptr<detail::Backend> { return std::make_shared<test::FakeDeviceBackend>(); },
                 0, 0, 0, 0, {}});
#if MESHMUON_CONFORMANCE_CUDA
  // cuda implements plain and symmetric (KernelCaps::ns_methods): `gram` and a method registered by
  // a program are refused by name at construction (issue 36).
  out.push_back({"cuda",
                 [](std::string* why) -> std::shared_ptr<detail::Backend> {
                   if (!detail::cuda_device_available(why)) return nullptr;
                   return detail::make_cuda_backend(0);
                 },
                 1e-4, 3e-2, 1e-3, 5e-2, {"gram", "conformance_test_method"}});
#endif
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
