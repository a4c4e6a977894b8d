// Orthogonalizer: validation, MuonEq (equilibrate.cpp), Frobenius normalization, buffer placement
// and batching around the Newton–Schulz kernels in newton_schulz.cpp and gram_ns.cpp, then Muon+.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "meshmuon/blas.h"
#include "meshmuon/error.h"
#include "meshmuon/orthogonalize.h"
#include "backend/cpu/kernels/bf16_products.h"
#include "backend/cpu/kernels/ns_kernels.h"
#include "backend/cpu/kernels/ns_methods.h"
#include "backend/cpu/kernels/products.h"

namespace meshmuon {

struct Orthogonalizer::Workspace : cpu::NsScratch {};

namespace {

bool overlaps(const void* a, const void* b, size_t bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bytes && pb < pa + bytes;
}

}  // namespace

Orthogonalizer::Orthogonalizer(NsOptions options)
    : options_(std::move(options)), coefficients_(make_schedule(options_)) {
  (void)cpu::ns_method_spec(options_.method);  // an unregistered method id fails here, naming it
  if (options_.matmul_dtype == DType::BF16) {  // checked before any allocation
    MESHMUON_CHECK(!options_.bf16_rounding,
                "[orth] matmul_dtype bf16 and bf16_rounding (torch's bf16 emulation) exclude each "
                "other; choose one");
    const std::string& refusal = cpu::ns_method_spec(options_.method).bf16_refusal;  // the method's own reason
    MESHMUON_CHECK(refusal.empty(), refusal);
  }
  const cpu::Bf16ProductPath path = options_.matmul_dtype == DType::BF16
                                        ? cpu::require_bf16_products("Orthogonalizer").path
                                        : cpu::Bf16ProductPath::Widened;
  ws_ = new Workspace;
  ws_->bf16_path = path;
}

Orthogonalizer::~Orthogonalizer() { delete ws_; }

Orthogonalizer::Orthogonalizer(Orthogonalizer&& other) noexcept
    : options_(std::move(other.options_)),
      coefficients_(std::move(other.coefficients_)),
      ws_(std::exchange(other.ws_, nullptr)) {}

Orthogonalizer& Orthogonalizer::operator=(Orthogonalizer&& other) noexcept {
  if (this != &other) {
    delete ws_;
    options_ = std::move(other.options_);
    coefficients_ = std::move(other.coefficients_);
    ws_ = std::exchange(other.ws_, nullptr);
  }
  return *this;
}

void Orthogonalizer::run(const float* in, float* out, int64_t m, int64_t n) {
  MESHMUON_CHECK(m >= 0 && n >= 0, "[orth] matrix shape must be non-negative, got ", m, "x", n);
  MESHMUON_CHECK(m <= INT_MAX && n <= INT_MAX, "[orth] matrix ", m, "x", n,
              " exceeds the BLAS int range; split it or orthogonalize per expert");
  if (m == 0 || n == 0) return;
  const size_t bytes = static_cast<size_t>(m * n) * sizeof(float);
  MESHMUON_CHECK(in != nullptr && out != nullptr, "[orth] null data pointer for a ", m, "x", n, " matrix");
  MESHMUON_CHECK(in == out || !overlaps(in, out, bytes),
              "[orth] 'in' and 'out' overlap without being equal; pass the same pointer for in-place");
  if (ws_ == nullptr) {  // a moved-from Orthogonalizer stays usable
    ws_ = new Workspace;
    if (options_.matmul_dtype == DType::BF16) ws_->bf16_path = cpu::require_bf16_products("Orthogonalizer").path;
  }
  if (options_.bf16_rounding) return cpu::newton_schulz_bf16(in, out, m, n, options_, coefficients_, *ws_);
  if (options_.muon_eq) {  // equilibrated into `out`, which then serves as the input (in place from here)
    cpu::muon_eq_rows(in, out, m, n, ws_->row_sq);
    in = out;
  }
  polar(in, out, m, n);
  if (options_.muon_plus) cpu::muon_plus(out, m, n);
}

void Orthogonalizer::polar(const float* in, float* out, int64_t m, int64_t n) {
  const size_t bytes = static_cast<size_t>(m * n) * sizeof(float);
  const double norm = cpu::frobenius_norm(in, m * n);
  const double scaled = norm * options_.scale;
  const double denom = options_.eps_mode == EpsMode::Add ? scaled + options_.eps
                                                         : std::max(scaled, double(options_.eps));
  if (norm == 0 || denom == 0) {  // all zeros: the polar factor is taken as 0 (never NaN)
    std::memset(out, 0, bytes);
    return;
  }
  const int steps = static_cast<int>(coefficients_.size());
  const cpu::NsMethodSpec& method = cpu::ns_method_spec(options_.method);  // ns_methods.h
  if (options_.matmul_dtype == DType::BF16)
    return cpu::newton_schulz_bf16_products(in, static_cast<float>(1.0 / denom), out, m, n,
                                            coefficients_, method.bf16_plain,
                                            blas_get_num_threads(), *ws_);
  // Place the normalized X₀ so that the method's last write lands in `out` without a final copy.
  float* x0 = out;
  if (method.x0_in_scratch(m, n, steps)) x0 = ws_->ensure(ws_->x, m * n);
  const float inv = static_cast<float>(1.0 / denom);
  cpu::parallel_rows(m, n, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0 * n; i < r1 * n; ++i) x0[i] = in[i] * inv;
  });
  method.fp32(x0, out, m, n, coefficients_, *ws_);
}

void Orthogonalizer::run(const TensorView& in, const TensorView& out) {
  MESHMUON_CHECK(in.dtype == DType::F32 && out.dtype == DType::F32,
              "[orth] orthogonalization is fp32 only; got in ", to_string(in.dtype), ", out ",
              to_string(out.dtype), " (convert bf16 gradients to fp32 first)");
  MESHMUON_CHECK(in.ndim() == 2 || in.ndim() == 3, "[orth] input must be [m, n] or [B, m, n], got shape ",
              in.shape.to_string());
  MESHMUON_CHECK(in.shape == out.shape, "[orth] in and out shapes differ: ", in.shape.to_string(), " vs ",
              out.shape.to_string());
  MESHMUON_CHECK(in.is_contiguous() && out.is_contiguous(),
              "[orth] in and out must be contiguous row-major views; copy strided views first");
  const bool batched = in.ndim() == 3;
  const int64_t batch = batched ? in.shape[0] : 1;
  const int64_t m = in.shape[batched ? 1 : 0], n = in.shape[batched ? 2 : 1];
  const float* src = static_cast<const float*>(in.data);
  float* dst = static_cast<float*>(out.data);
  if (batch * m * n == 0) return;
  MESHMUON_CHECK(src == dst || !overlaps(src, dst, in.nbytes()),
              "[orth] 'in' and 'out' overlap without being equal; pass the same view for in-place");
  for (int64_t b = 0; b < batch; ++b) run(src + b * m * n, dst + b * m * n, m, n);
}

}  // namespace meshmuon
