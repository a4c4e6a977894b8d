// The orthogonalization method table (ns_methods.h): the three built-in methods and registration.
#include "backend/cpu/kernels/ns_methods.h"

#include <algorithm>
#include <deque>
#include <mutex>

#include "meshmuon/error.h"
#include "backend/cpu/kernels/ns_kernels.h"

namespace meshmuon::cpu {
namespace {

// ---- plain / symmetric: standard Newton–Schulz (newton_schulz.cpp), alternating two buffers ----
bool standard_x0_in_scratch(int64_t, int64_t, int steps) { return steps % 2 == 1; }
void plain_fp32(float* x0, float* out, int64_t m, int64_t n, const std::vector<Coefficients>& k, NsScratch& ws) {
  newton_schulz(x0, out, m, n, k, /*symmetric=*/false, ws);
}
void symmetric_fp32(float* x0, float* out, int64_t m, int64_t n, const std::vector<Coefficients>& k, NsScratch& ws) {
  newton_schulz(x0, out, m, n, k, /*symmetric=*/true, ws);
}
// (the products in the order ns_flops always formed them: the same doubles)
double plain_flops(double s, double l, int steps) {
  const double s2l = s * s * l, s3 = s * s * s;
  return steps * (4 * s2l + 2 * s3);
}
double symmetric_flops(double s, double l, int steps) {
  const double s2l = s * s * l, s3 = s * s * s;
  return steps * (3 * s2l + s3);
}

// ---- gram: Gram Newton–Schulz (gram_ns.cpp) where the aspect ratio is ≥ 2, else symmetric ----
bool gram_applies(double m, double n) { return std::max(m, n) >= 2 * std::min(m, n); }
bool gram_x0_in_scratch(int64_t m, int64_t n, int steps) {
  // Gram NS writes X at its restart and once at the end
  return gram_applies(double(m), double(n)) ? steps <= kGramRestartStep + 1 : standard_x0_in_scratch(m, n, steps);
}
void gram_fp32(float* x0, float* out, int64_t m, int64_t n, const std::vector<Coefficients>& k, NsScratch& ws) {
  if (gram_applies(double(m), double(n)))
    gram_newton_schulz(x0, out, m, n, k, ws);
  else
    symmetric_fp32(x0, out, m, n, k, ws);
}
double gram_flops(double s, double l, int steps) {
  if (l < 2 * s) return symmetric_flops(s, l, steps);  // its fallback
  // Mirrors gram_ns.cpp: R = XXᵀ (SYRK); each step R² (SYRK) and Q ← Z·Q (GEMM, free while Q = I);
  // R ← Z²·R (SYRK + GEMM) between steps, or at the restart X = Q·X₀ and R = XXᵀ; finally X = Q·X₀.
  const double s2l = s * s * l, s3 = s * s * s;
  double f = s2l;
  bool q_identity = true;
  for (int t = 0; t < steps; ++t) {
    f += s3;
    if (!q_identity) f += 2 * s3;
    q_identity = false;
    if (t == steps - 1) break;
    if (t == kGramRestartStep) {
      f += 2 * s2l + s2l;
      q_identity = true;
    } else {
      f += 3 * s3;
    }
  }
  return f + 2 * s2l;
}

struct Table {
  std::mutex mu;
  std::deque<NsMethodSpec> specs;  // indexed by the NsMethod value; a deque keeps references stable
  Table() {
    // In the order of the NsMethod enumerators (their values index this table).
    specs.push_back({"plain", "three GEMMs per step", plain_fp32, standard_x0_in_scratch, true, "", plain_flops});
    specs.push_back({"symmetric", "SYRK for X·Xᵀ and for A·A", symmetric_fp32, standard_x0_in_scratch, false, "",
                     symmetric_flops});
    specs.push_back({"gram", "Gram Newton-Schulz on the small Gram matrix (aspect ratio >= 2, else symmetric)",
                     gram_fp32, gram_x0_in_scratch, false,
                     "[orth] method gram needs matmul_dtype fp32: Gram Newton-Schulz iterates on X·Xᵀ, "
                     "whose small eigenvalues bf16 cannot resolve next to its large ones (singular "
                     "values off by up to 0.5 on low-rank inputs); use method symmetric with bf16 "
                     "products, or gram with fp32",
                     gram_flops});
  }
};

Table& table() {
  static Table t;
  return t;
}

}  // namespace

NsMethod register_ns_method(NsMethodSpec spec) {
  MESHMUON_CHECK(!spec.name.empty(), "[orth] register_ns_method: the method needs a name");
  MESHMUON_CHECK(spec.fp32 != nullptr && spec.x0_in_scratch != nullptr && spec.flops != nullptr,
                 "[orth] register_ns_method: method '", spec.name, "' needs its fp32, x0_in_scratch and flops functions");
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  for (const NsMethodSpec& s : t.specs)
    MESHMUON_CHECK(s.name != spec.name, "[orth] register_ns_method: method '", spec.name, "' is already registered");
  t.specs.push_back(std::move(spec));
  return static_cast<NsMethod>(t.specs.size() - 1);
}

const NsMethodSpec& ns_method_spec(NsMethod m) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  const auto i = static_cast<size_t>(m);
  MESHMUON_CHECK(static_cast<int>(m) >= 0 && i < t.specs.size(), "[orth] unknown method id ", static_cast<int>(m),
                 "; a method is registered before it is used (register_ns_method)");
  return t.specs[i];
}

std::vector<NsMethod> ns_methods() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::vector<NsMethod> out;
  for (size_t i = 0; i < t.specs.size(); ++i) out.push_back(static_cast<NsMethod>(i));
  return out;
}

std::string ns_method_names() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::string out;
  for (size_t i = 0; i < t.specs.size(); ++i) {
    if (i > 0) out += i + 1 == t.specs.size() ? " or " : ", ";
    out += t.specs[i].name;
  }
  return out;
}

}  // namespace meshmuon::cpu
