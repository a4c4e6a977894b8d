// Internal: `meshmuon bench ns --device cuda` (cuda_bench.h). The orthogonalization is the backend's own
// (Backend::muon_units, stream-ordered on the legacy stream, as the events); the GEMM baseline calls cuBLAS on a
// handle of its own in the backend's configuration (make_blas_handle, gemm: fp32 without TF32), timed by events.
#include "backend/cuda/shared/cuda_bench.h"

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "backend/backend.h"
#include "backend/registry.h"
#include "backend/cuda/cublas_loader.h"
#include "backend/cuda/cuda_kernels.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_error(concat("[cuda] bench ns: ", what, ": ", cudaGetErrorString(e)));
}

class EventTimer {
 public:
  EventTimer() {
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  template <class F>
  double time(F&& f) {
    check(cudaEventRecord(start_, nullptr), "cudaEventRecord");
    f();
    check(cudaEventRecord(stop_, nullptr), "cudaEventRecord");
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms * 1e-3;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

double cuda_ns_flops_done(int64_t m, int64_t n, const NsOptions& options) {
  const int64_t s = std::min(m, n), l = std::max(m, n);
  const double full_gram = 2.0 * double(s) * double(s) * double(l), full_square = 2.0 * double(s) * double(s) * double(s);
  const bool symmetric = options.method != NsMethod::Plain;
  const double per_step = (symmetric ? cuda::lower_product_flops(s, l) : full_gram) +
                          (symmetric ? cuda::lower_product_flops(s, s) : full_square) + full_gram;
  return options.steps * per_step;
}

CudaNsTiming time_ns_cuda(const NsOptions& options, const float* g, int64_t m, int64_t n, int warmup, int repeats,
                          int64_t batch) {
  MESHMUON_CHECK(m > 0 && n > 0 && m <= INT32_MAX && n <= INT32_MAX, "[bench] shape ", m, "x", n, " out of range");
  MESHMUON_CHECK(repeats >= 1 && warmup >= 0, "[bench] repeats must be >= 1 and warmup >= 0");
  MESHMUON_CHECK(batch >= 1, "[bench] --batch must be >= 1, got ", batch);
  auto be = make_cuda_backend(0);  // throws "[cuda] no CUDA device: ..." without one
  CudaNsTiming out;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  out.device = prop.name;

  const size_t numel = static_cast<size_t>(m * n), bytes = numel * sizeof(float);
  Buffer src = be->allocate(bytes, MemoryKind::Device), work = be->allocate(bytes, MemoryKind::Device);
  check(cudaMemcpy(src.data(), g, bytes, cudaMemcpyHostToDevice), "upload");
  auto orth = be->make_orthogonalizer(options);
  for (int r = 0; r < warmup + repeats; ++r) {
    check(cudaMemcpy(work.data(), src.data(), bytes, cudaMemcpyDeviceToDevice), "copy");
    check(cudaDeviceSynchronize(), "synchronize");
    EventTimer t;
    const double sec = t.time([&] {
      be->muon_units(*orth, work.as<float>(), 1, m, n, nullptr, nullptr, 0.0, DType::F32);
    });
    if (r >= warmup) out.ns_seconds.push_back(sec);
  }
  out.result.resize(numel);
  check(cudaMemcpy(out.result.data(), work.data(), bytes, cudaMemcpyDeviceToHost), "download");

  // `batch` copies: one call (batched products) against one call per matrix, same run.
  out.batch = batch;
  if (batch > 1) {
    Buffer many = be->allocate(bytes * static_cast<size_t>(batch), MemoryKind::Device),
           each = be->allocate(bytes * static_cast<size_t>(batch), MemoryKind::Device);
    const auto fill = [&](Buffer& b) {
      for (int64_t e = 0; e < batch; ++e)
        check(cudaMemcpy(b.as<float>() + e * static_cast<int64_t>(numel), src.data(), bytes, cudaMemcpyDeviceToDevice), "copy");
      check(cudaDeviceSynchronize(), "synchronize");
    };
    for (int r = 0; r < warmup + repeats; ++r) {
      fill(many), fill(each);
      EventTimer t;
      const double tb = t.time([&] { be->muon_units(*orth, many.as<float>(), batch, m, n, nullptr, nullptr, 0.0, DType::F32); });
      const double to = t.time([&] {
        for (int64_t e = 0; e < batch; ++e)
          be->muon_units(*orth, each.as<float>() + e * static_cast<int64_t>(numel), 1, m, n, nullptr, nullptr, 0.0, DType::F32);
      });
      if (r >= warmup) out.batched_seconds.push_back(tb), out.one_at_a_time_seconds.push_back(to);
    }
    std::vector<float> a(numel * static_cast<size_t>(batch)), b(a.size());
    check(cudaMemcpy(a.data(), many.data(), a.size() * 4, cudaMemcpyDeviceToHost), "download");
    check(cudaMemcpy(b.data(), each.data(), b.size() * 4, cudaMemcpyDeviceToHost), "download");
    for (size_t i = 0; i < a.size() && out.batch_bitwise; ++i)
      out.batch_bitwise = std::memcmp(&a[i], &b[i], 4) == 0 && std::memcmp(&a[i], &out.result[i % numel], 4) == 0;
  }

  // The baseline: the two GEMM shapes of one step, as the backend issues them for a wide matrix
  // (row-major X s×l is column-major Xᵀ with ld l).
  const bool bf16 = options.matmul_dtype == DType::BF16;
  const int s = static_cast<int>(std::min(m, n)), l = static_cast<int>(std::max(m, n));
  const size_t elem = bf16 ? 2 : 4;
  Buffer x = be->allocate(size_t(s) * l * elem, MemoryKind::Device), z = be->allocate(size_t(s) * s * elem, MemoryKind::Device);
  Buffer c = be->allocate(size_t(s) * s * sizeof(float), MemoryKind::Device),
         d = be->allocate(size_t(s) * l * sizeof(float), MemoryKind::Device);
  // Operands of moderate magnitude (each byte 0x3C: bf16 ≈ 0.0115, fp32 ≈ 0.0115), finite products.
  check(cudaMemset(x.data(), 0x3C, size_t(s) * l * elem), "cudaMemset");
  check(cudaMemset(z.data(), 0x3C, size_t(s) * s * elem), "cudaMemset");
  // the backend's handle configuration (make_blas_handle) on the legacy stream
  struct Handle {
    cublasHandle_t h = make_blas_handle("cublasCreate (bench)");
    ~Handle() { (void)cublas().destroy(h); }
  } handle;
  const cublasHandle_t h = handle.h;
  check_blas(cublas().set_stream(h, nullptr), "cublasSetStream (bench)");
  EventTimer t;
  for (int r = 0; r < warmup + repeats; ++r) {
    const double tg = t.time([&] { gemm(h, true, false, s, s, l, x.data(), l, x.data(), l, c.as<float>(), s, bf16, 1.0f, 0.0f, "cuBLAS GEMM (bench)"); });
    const double ta = t.time([&] { gemm(h, false, false, l, s, s, x.data(), l, z.data(), s, d.as<float>(), l, bf16, 1.0f, 0.0f, "cuBLAS GEMM (bench)"); });
    if (r >= warmup) out.gram_gemm_seconds.push_back(tg), out.apply_gemm_seconds.push_back(ta);
  }
  return out;
}

}  // namespace meshmuon::detail
