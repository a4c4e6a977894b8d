// A test-only orthogonalization method, registered from this test binary through the method table
// (src/backend/cpu/kernels/ns_methods.h) exactly as a new method would be: the proof of docs/architecture.md
// "How to add an orthogonalization method". "conformance_test_method" is Newton–Schulz with every
// product accumulated in double by plain loops (then rounded to fp32): slow and accurate. Whether
// it ran is observed by its run counter, not inferred from bits that differ from a built-in's.
#pragma once

#include <cstdint>

#include "meshmuon/orthogonalize.h"

namespace meshmuon::conformance {

inline constexpr const char* kTestMethodName = "conformance_test_method";
// Registers the method on first use; its id.
NsMethod test_method();
// How many matrices the method has orthogonalized in this process.
uint64_t test_method_runs();

}  // namespace meshmuon::conformance
