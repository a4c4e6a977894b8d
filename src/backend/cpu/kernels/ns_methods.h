// The orthogonalization method table: each NsMethod (plain, symmetric, gram, and any method a
// program registers) as one entry of name, cpu kernel and properties. Everything that names,
// parses, validates, runs or prices a method reads it here (to_string / parse_ns_method, the
// Orthogonalizer's checks and its fp32 iteration, ns_flops, `bench ns`'s method list), so a new
// method is one entry (docs/architecture.md "How to add an orthogonalization method").
//
// Contract of an entry's kernel: `fp32` runs the polar iteration from the normalized X₀ (x0; the
// Frobenius normalization, MuonEq and Muon+ stay the Orthogonalizer's) into `out` with the
// schedule's coefficients (one per step), in fp32, deterministically (the same bits for the same
// input on every thread count). x0 is `out` itself unless `x0_in_scratch` says the kernel wants it
// elsewhere (then the caller writes it to scratch.x): the kernels place the normalized input so
// that their last write lands in `out` without a copy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshmuon/orthogonalize.h"

namespace meshmuon::cpu {

struct NsScratch;

struct NsMethodSpec {
  std::string name;     // CLI / JSON / Python spelling; unique
  std::string summary;  // one line for --help and errors
  // fp32 iteration (contract above).
  void (*fp32)(float* x0, float* out, int64_t m, int64_t n, const std::vector<Coefficients>& coefficients,
               NsScratch& scratch) = nullptr;
  bool (*x0_in_scratch)(int64_t m, int64_t n, int steps) = nullptr;
  // matmul_dtype bf16: the bf16-product iteration (ns_bf16_products.cpp) with plain or symmetric
  // products; empty `bf16_refusal` = allowed, else the Orthogonalizer refuses bf16 products with it.
  bool bf16_plain = false;
  std::string bf16_refusal;
  // Flops of one matrix (Gram side s = min(m, n), long side l), for the planner's rates and `bench ns`.
  double (*flops)(double s, double l, int steps) = nullptr;
};

// Adds a method after the built-ins and returns its id (NsOptions::method). Throws
// std::invalid_argument on an empty or taken name or a missing function; thread-safe.
NsMethod register_ns_method(NsMethodSpec spec);
// The entry of `m`; std::invalid_argument naming the id for one never registered.
const NsMethodSpec& ns_method_spec(NsMethod m);
// Every method, built-ins first, in registration order.
std::vector<NsMethod> ns_methods();
// "plain, symmetric or gram" (every registered name), for messages.
std::string ns_method_names();

}  // namespace meshmuon::cpu
