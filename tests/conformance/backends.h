// The backends the conformance suite runs over, and what each declares about itself. One function,
// conformance_backends(), lists them: every backend of backend_registry() and the test-only fake
// device; the methods a backend lacks must equal its own declaration (KernelCaps::ns_methods).
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace meshmuon::conformance {

struct ConformanceBackend {
  std::string name;  // the gtest parameter: cases are <Suite>.<Case>/<name>
  // The backend, or null with `why` set where this machine cannot make it (the case is skipped).
  std::function<std::shared_ptr<detail::Backend>(std::string* why)> make;
  // Bound on the relative Frobenius distance of an orthogonalized result to the cpu backend's, fp32
  // and bf16 products (0: bitwise), and on each singular value's distance to the cpu result's.
  double ns_fp32 = 0, ns_bf16 = 0, sigma_fp32 = 0, sigma_bf16 = 0;
  // Orthogonalization methods (NsMethod names) the backend does not implement: refused by name.
  std::set<std::string> lacks;
};

std::vector<ConformanceBackend> conformance_backends();
const ConformanceBackend& conformance_backend(const std::string& name);
std::vector<std::string> conformance_backend_names();

}  // namespace meshmuon::conformance
