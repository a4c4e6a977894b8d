// Internal: the cpu backend (backend.h): today's kernels behind the device seam. Every Muon step of
// both engines goes through muon_units (the same code for every layout: bitwise layout invariance).
#include "backend/cpu/shared/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/registry.h"
#include "meshmuon/bf16.h"
#include "meshmuon/blas.h"
#include "meshmuon/error.h"
#include "backend/cpu/kernels/ns_methods.h"
#include "backend/cpu/kernels/products.h"
#include "backend/cpu/kernels/update_steps.h"

namespace meshmuon::detail {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  Device device() const override { return {}; }
  DeviceCaps device_caps() const override { return {}; }
  KernelCaps kernel_caps() const override {
    KernelCaps c;
    c.bf16_products = true;  // oneDNN's or meshmuon's widened products (backend/cpu/kernels/bf16_products.h)
    c.ns_methods = cpu::ns_methods();  // every method of the table (backend/cpu/kernels/ns_methods.h), registered ones too
    return c;
  }

  Buffer allocate(size_t bytes, MemoryKind kind) override {
    MESHMUON_CHECK(kind != MemoryKind::Device, "[cpu] the cpu backend has no device memory; allocate host memory");
    void* p = bytes ? std::calloc(bytes, 1) : nullptr;
    MESHMUON_CHECK_RUNTIME(bytes == 0 || p, "[cpu] out of host memory allocating ", bytes, " bytes");
    return Buffer(p, bytes, kind, {}, [](void* q) { std::free(q); });
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  std::unique_ptr<Stream> make_stream(bool threaded, JobEnd) override { return make_cpu_stream(threaded); }

  void pack(std::span<const PackRun> runs, std::span<std::byte* const> bases) override { cpu_pack(runs, bases); }

  int set_threads(int threads) override {
    const int before = blas_get_num_threads();  // also loads the BLAS: a missing one fails here
    if (threads > 0 && threads != before) blas_set_num_threads(threads);
    return before;
  }
  int threads() const override { return blas_get_num_threads(); }

  void momentum(const MomentumOptions& o, float* buf, const TensorView& grad, float* update) override {
    momentum_step(o, buf, grad, update);
  }
  void apply_update(const ApplyOptions& o, float* param, const float* update, int64_t n) override {
    meshmuon::apply_update(o, param, update, n);
  }
  void adamw(const AdamWOptions& o, float* param, const TensorView& grad, float* m, float* v) override {
    adamw_step(o, param, grad, m, v);
  }
  void qk_clip_rows(const QkTag& tag, std::span<const float> logits, double threshold, float* w, int64_t row_begin,
                    int64_t row_end, int64_t cols) override {
    meshmuon::qk_clip_rows(tag, logits, threshold, w, row_begin, row_end, cols);
  }
  void round_to_comm(float* x, int64_t n, DType comm) override {
    if (comm == DType::F32) return;
    for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_float(float_to_bf16(x[i]));
  }
  int64_t first_non_finite(const TensorView& g) override {
    const int64_t n = g.numel();
    if (g.dtype == DType::BF16) {  // exponent all ones: inf or NaN
      const BFloat16* x = static_cast<const BFloat16*>(g.data);
      for (int64_t i = 0; i < n; ++i)
        if ((x[i].bits & 0x7F80u) == 0x7F80u) return i;
      return -1;
    }
    const float* x = static_cast<const float*>(g.data);
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(x[i])) return i;
    return -1;
  }

  void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) override {
    if (n <= 0) return;
    const size_t c = static_cast<size_t>(n);
    if (dst_dtype == src_dtype)
      std::memcpy(dst, src, c * dtype_size(dst_dtype));
    else if (src_dtype == DType::F32)
      float_to_bf16(static_cast<const float*>(src), static_cast<BFloat16*>(dst), c);
    else
      bf16_to_float(static_cast<const BFloat16*>(src), static_cast<float*>(dst), c);
  }
  void ordered_sum(const void* blocks, DType dtype, int64_t n, int blocks_n, float* out) override {
    if (n <= 0) return;
    const size_t c = static_cast<size_t>(n);
    if (dtype == DType::F32) {
      const auto* b = static_cast<const float*>(blocks);
      std::memcpy(out, b, c * 4);
      for (int j = 1; j < blocks_n; ++j) {
        const float* bj = b + static_cast<size_t>(j) * c;
        for (size_t x = 0; x < c; ++x) out[x] += bj[x];
      }
    } else {
      const auto* b = static_cast<const BFloat16*>(blocks);
      bf16_to_float(b, out, c);
      for (int j = 1; j < blocks_n; ++j) {
        const BFloat16* bj = b + static_cast<size_t>(j) * c;
        for (size_t x = 0; x < c; ++x) out[x] += bf16_to_float(bj[x]);
      }
    }
  }
  void divide(float* x, int64_t n, float d) override {
    for (int64_t k = 0; k < n; ++k) x[k] = x[k] / d;
  }
  void fill_zero(void* p, size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }

  std::unique_ptr<Orthogonalizer> make_orthogonalizer(const NsOptions& o) override {
    check_ns_method(name(), kernel_caps(), o);
    return std::make_unique<Orthogonalizer>(o);
  }
  void muon_units(Orthogonalizer& orth, float* u, int64_t batch, int64_t rows, int64_t cols, float* v, float* v_mean,
                  double beta2, DType comm) override {
    if (rows == 0 || cols == 0) return;
    const int64_t len = normuon_state_size(rows, cols);
    for (int64_t e = 0; e < batch; ++e) {
      float* x = u + e * rows * cols;
      orth.run(x, x, rows, cols);
      if (v != nullptr) {
        normuon_mean_square(x, rows, cols, v_mean);
        normuon_finish(x, rows, cols, v_mean, v + e * len, beta2);
      }
      round_to_comm(x, rows * cols, comm);
    }
  }

  // Gram NS: X normalized by ‖G‖ (the trace of step 0's Gram), then per step B = b·A + c·A² and
  // X ← a·X + B·X (wide) or a·X + X·B (tall); the s×s Gram A is summed over the group by `reduce`.
  void gram_newton_schulz(const NsOptions& ns, float* x, int64_t m, int64_t n, bool wide, int64_t sd,
                          const GramReduce& reduce, DType comm) override {
    const int64_t ld = wide ? n : m;  // local extent of the long dim
    const size_t numel = static_cast<size_t>(m * n);
    std::vector<float> a(static_cast<size_t>(sd * sd)), a2(a.size()), tmp(numel);
    const auto gram = [&](int step) {
      std::fill(a.begin(), a.end(), 0.0f);
      if (ld > 0)
        cpu::ssyrk_lower(!wide, static_cast<int>(sd), static_cast<int>(ld), 1.0f, x, static_cast<int>(wide ? ld : sd), 0.0f,
                         a.data(), static_cast<int>(sd));
      for (int64_t i = 0; i < sd; ++i)
        for (int64_t j = i + 1; j < sd; ++j) a[static_cast<size_t>(i * sd + j)] = a[static_cast<size_t>(j * sd + i)];
      reduce(a.data(), a.size(), step, DeviceEvent{});
    };
    const std::vector<Coefficients> coef = make_schedule(ns);
    gram(0);  // step 0's Gram of the unnormalized G also gives ‖G‖² (its trace)
    double norm2 = 0;
    for (int64_t i = 0; i < sd; ++i) norm2 += a[static_cast<size_t>(i * sd + i)];
    const double norm = std::sqrt(norm2) * ns.scale;
    const double d = ns.eps_mode == EpsMode::Add ? norm + ns.eps : std::max(norm, static_cast<double>(ns.eps));
    if (norm2 == 0 || d == 0) {  // every rank sees the same sum: all leave here together
      std::fill(x, x + numel, 0.0f);
      return;
    }
    const float inv = static_cast<float>(1.0 / d), inv2 = static_cast<float>(1.0 / (d * d));
    for (size_t i = 0; i < numel; ++i) x[i] *= inv;
    for (float& v : a) v *= inv2;
    const int M = static_cast<int>(m), N = static_cast<int>(n), S = static_cast<int>(sd);
    for (size_t t = 0; t < coef.size(); ++t) {
      if (t > 0) gram(static_cast<int>(t));
      cpu::sgemm(false, false, S, S, S, static_cast<float>(coef[t].c), a.data(), S, a.data(), S, 0.0f, a2.data(), S);
      for (size_t i = 0; i < a.size(); ++i) a2[i] += static_cast<float>(coef[t].b) * a[i];
      if (numel == 0) continue;
      std::memcpy(tmp.data(), x, numel * sizeof(float));
      if (wide) cpu::sgemm(false, false, M, N, S, 1.0f, a2.data(), S, tmp.data(), N, static_cast<float>(coef[t].a), x, N);
      else cpu::sgemm(false, false, M, N, S, 1.0f, tmp.data(), N, a2.data(), S, static_cast<float>(coef[t].a), x, N);
    }
    round_to_comm(x, static_cast<int64_t>(numel), comm);
  }
};

}  // namespace

std::shared_ptr<Backend> make_cpu_backend() {
  static const std::shared_ptr<Backend> cpu = std::make_shared<CpuBackend>();  // stateless: one for all
  return cpu;
}

void register_cpu_backend(BackendRegistry& r) {
  r.add("cpu", [](int) { return EngineDevice{make_cpu_backend(), host_memory_space()}; });
}

}  // namespace meshmuon::detail
