// Internal: the cuda backend (backend.h) on one CUDA device: CudaBackend itself, its buffers
// (cudaMalloc / cudaMallocHost / calloc), copies, fences and the element-wise kernels of
// cuda_kernels.cu (the cpu kernels' bits). Its other pieces: the stream (cuda_stream.h); Newton–Schulz
// batched over matrices of one shape (cuda_ns.h), its products through cuBLASLt / cuBLAS
// (batched_gemm.h: a matrix's bits do not depend on its batch), both dlopen'd at first use (libmeshmuon
// links only the static cudart, so it loads and runs its cpu paths on machines without a GPU, a
// driver or cuBLAS); the calling thread's current stream and resources (thread_resources.h); the
// device scope (device_guard.h).
//
// Stream-ordered: a kernel call enqueues on the calling thread's current stream (a CudaStream's
// while one of its jobs runs, else the legacy default stream) and returns; later calls on the same
// thread are ordered after it; synchronize() waits for it on the host, fence() / wait() order
// another stream after it on the device (the caller does one or the other before handing the
// results to a communicator, another stream or the host: backend.h). Calls that return host
// values or bytes (copy, first_non_finite) and the FSDP data movement (convert, ordered_sum,
// divide, fill_zero, whose results go straight to communicators) complete before returning. A
// CudaStream runs its host jobs in order with its own cudaStream_t current (cuda_stream.h: when its
// jobs' device work is done, JobEnd::Complete or JobEnd::Queued).
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/shared/cuda_error.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_ns.h"
#include "backend/cuda/cuda_stream.h"
#include "backend/cuda/shared/device_guard.h"
#include "backend/cuda/event_pool.h"
#include "backend/cuda/thread_resources.h"
#include "meshmuon/error.h"
#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/update_args.h"

namespace meshmuon::detail {
namespace {

// Ends a kernel call: its launch errors; the work stays queued on the thread's stream.
void finish(cudaError_t launch, const char* what) { check_cuda(launch, what); }
// Ends a call that completes before returning: launch errors, then the stream's completion.
void finish_sync(cudaError_t launch, const char* what) {
  check_cuda(launch, what);
  check_cuda(cudaStreamSynchronize(tl_stream), what);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device), events_(std::make_shared<EventPool>()) {}

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return {DeviceKind::Cuda, device_}; }
  DeviceCaps device_caps() const override { return {.device_memory = true}; }
  KernelCaps kernel_caps() const override {
    KernelCaps c;
    c.bf16_products = true;
    c.batches_units = true;
    // No Gram Newton–Schulz for a whole matrix here (cuda_ns.cpp forms symmetric products); the
    // gram_allreduce strategy's sharded form is gram_newton_schulz, which this backend has.
    c.ns_methods = {NsMethod::Plain, NsMethod::Symmetric};
    return c;
  }

  Buffer allocate(size_t bytes, MemoryKind kind) override {
    const DeviceGuard guard = enter();
    if (bytes == 0) return Buffer(nullptr, 0, kind, device(), nullptr);
    void* p = nullptr;
    switch (kind) {
      case MemoryKind::Host:
        p = std::calloc(bytes, 1);
        MESHMUON_CHECK_RUNTIME(p, "[cuda] out of host memory allocating ", bytes, " bytes");
        return Buffer(p, bytes, kind, {}, [](void* q) { std::free(q); });
      case MemoryKind::PinnedHost:
        check_cuda(cudaMallocHost(&p, bytes), concat("cudaMallocHost of ", bytes, " bytes").c_str());
        std::memset(p, 0, bytes);
        return Buffer(p, bytes, kind, {}, [](void* q) { cudaFreeHost(q); });
      case MemoryKind::Device: {
        check_cuda(cudaMalloc(&p, bytes), concat("cudaMalloc of ", bytes, " bytes").c_str());
        Buffer b(p, bytes, kind, device(), [](void* q) { cudaFree(q); });
        check_cuda(cudaMemsetAsync(p, 0, bytes, tl_stream), "cudaMemset");
        check_cuda(cudaStreamSynchronize(tl_stream), "cudaMemset");
        return b;
      }
    }
    return {};
  }
  // cudaMemcpyDefault: unified addressing tells host, pinned host and device memory apart.
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    const DeviceGuard guard = enter();
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, tl_stream), "cudaMemcpy (copy)");
    check_cuda(cudaStreamSynchronize(tl_stream), "cudaMemcpy (copy)");
  }
  void copy_queued(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    const DeviceGuard guard = enter();
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, tl_stream), "cudaMemcpyAsync (queued copy)");
  }
  std::unique_ptr<Stream> make_stream(bool threaded, JobEnd end) override {
    return make_cuda_stream(device_, threaded, end);
  }

  void synchronize() override {
    const DeviceGuard guard = enter();
    check_cuda(cudaStreamSynchronize(tl_stream), "synchronize");
  }

  Fence fence(void* stream) override {
    const DeviceGuard guard = enter();
    cudaEvent_t e = events_->take();
    const cudaError_t r = cudaEventRecord(e, stream ? static_cast<cudaStream_t>(stream) : tl_stream);
    if (r != cudaSuccess) events_->put(e);
    check_cuda(r, "cudaEventRecord (fence)");
    return Fence(std::shared_ptr<void>(e, [pool = events_](void* q) { pool->put(static_cast<cudaEvent_t>(q)); }));
  }
  void wait(DeviceEvent e, void* stream) override {
    if (e.empty()) return;
    const DeviceGuard guard = enter();
    check_cuda(cudaStreamWaitEvent(stream ? static_cast<cudaStream_t>(stream) : tl_stream, static_cast<cudaEvent_t>(e.handle), 0),
               "cudaStreamWaitEvent");
  }

  int set_threads(int) override { return 1; }
  int threads() const override { return 1; }

  void pack(std::span<const PackRun> runs, std::span<std::byte* const> bases) override {
    const DeviceGuard guard = enter();
    std::vector<PackRun> live;
    std::vector<int64_t> prefix{0};
    for (const PackRun& r : runs)
      if (r.len > 0 && r.rows > 0) live.push_back(r), prefix.push_back(prefix.back() + r.len * r.rows);
    if (live.empty()) return;
    const size_t runs_bytes = live.size() * sizeof(PackRun), prefix_bytes = prefix.size() * sizeof(int64_t);
    const size_t bases_bytes = bases.size() * sizeof(std::byte*);
    std::vector<std::byte> table(runs_bytes + prefix_bytes + bases_bytes);  // one upload
    std::memcpy(table.data(), live.data(), runs_bytes);
    std::memcpy(table.data() + runs_bytes, prefix.data(), prefix_bytes);
    std::memcpy(table.data() + runs_bytes + prefix_bytes, bases.data(), bases_bytes);
    std::byte* d = thread_scratch(device_, table.size(), kAuxScratch);
    thread_upload(device_, d, table.data(), table.size());
    finish(cuda::pack(reinterpret_cast<const PackRun*>(d), reinterpret_cast<const int64_t*>(d + runs_bytes),
                      static_cast<int>(live.size()), reinterpret_cast<std::byte* const*>(d + runs_bytes + prefix_bytes),
                      prefix.back(), tl_stream),
           "pack");
  }

  // ---- element-wise kernels: the cpu kernels' argument checks, then the same arithmetic ----

  // The single-tensor forms are the multi-tensor kernels on a table of one (one device code path,
  // the one tests/unit/cuda_kernels_host_test.cpp runs on the host).
  void momentum(const MomentumOptions& o, float* buf, const TensorView& grad, float* update) override {
    const MomentumTensor one{o, buf, grad, update};
    momentum_multi(std::span<const MomentumTensor>(&one, 1), DType::F32);
  }
  void apply_update(const ApplyOptions& o, float* param, const float* update, int64_t n) override {
    const ApplyTensor one{o, param, update, n};
    apply_multi(std::span<const ApplyTensor>(&one, 1));
  }
  void adamw(const AdamWOptions& o, float* p, const TensorView& grad, float* m, float* v) override {
    const AdamWTensor one{o, p, grad, m, v};
    adamw_multi(std::span<const AdamWTensor>(&one, 1));
  }

  // A multi-tensor table to the device through the pinned ring, then its launch.
  template <class Item, class Launch>
  void launch_table(const std::vector<Item>& items, int64_t blocks, Launch launch, const char* what) {
    if (items.empty()) return;
    MESHMUON_CHECK(blocks <= INT_MAX && items.size() <= INT_MAX, "[cuda] ", what, ": ", items.size(), " tensors need ", blocks,
                " blocks; at most ", INT_MAX);
    const DeviceGuard guard = enter();
    const size_t bytes = items.size() * sizeof(Item);
    auto* d = reinterpret_cast<Item*>(thread_scratch(device_, bytes, kAuxScratch));
    thread_upload(device_, d, items.data(), bytes);  // no host wait
    finish(launch(d, static_cast<int>(items.size()), blocks, tl_stream), what);
  }

  void momentum_multi(std::span<const MomentumTensor> tensors, DType comm) override {
    std::vector<cuda::MomentumItem> items;
    items.reserve(tensors.size());
    int64_t blocks = 0;
    for (const MomentumTensor& t : tensors) {  // every tensor checked before the launch
      MESHMUON_CHECK(t.grad.is_contiguous(), "[momentum] gradient view is not contiguous");
      const int64_t n = t.grad.numel();
      cpu::check_momentum_args(t.o, t.buf, t.grad.data, t.update, n);
      if (n == 0) continue;
      cuda::MomentumItem it{};
      it.buf = t.buf, it.grad = t.grad.data, it.update = t.update, it.n = n, it.block0 = blocks;
      it.w_grad = cpu::to_scalar(1.0 - t.o.momentum), it.mu = cpu::to_scalar(t.o.momentum);
      it.grad_bf16 = t.grad.dtype == DType::BF16;
      it.heavy_ball = t.o.kind != MomentumKind::Ema, it.nesterov = t.o.nesterov, it.round_bf16 = comm != DType::F32;
      items.push_back(it);
      blocks += cuda::multi_tensor_blocks(n);
    }
    launch_table(items, blocks, cuda::momentum_multi, "momentum (multi-tensor)");
  }

  void apply_multi(std::span<const ApplyTensor> tensors) override {
    std::vector<cuda::ApplyItem> items;
    items.reserve(tensors.size());
    int64_t blocks = 0;
    for (const ApplyTensor& t : tensors) {
      cpu::check_apply_args(t.o, t.param, t.update, t.n);
      if (t.n == 0) continue;
      cuda::ApplyItem it{};
      it.p = t.param, it.u = t.update, it.n = t.n, it.block0 = blocks, it.cautious = t.o.cautious;
      // as apply_update's scalars: cautious (adjusted lr, lr·wd), decoupled (1 − lr·wd, −adjusted lr)
      const double lr_wd = decay_lr_value(t.o) * t.o.weight_decay;  // decay_lr: unadjusted or adjusted lr
      it.a = cpu::to_scalar(t.o.cautious ? t.o.adjusted_lr : 1.0 - lr_wd);
      it.b = cpu::to_scalar(t.o.cautious ? lr_wd : -t.o.adjusted_lr);
      items.push_back(it);
      blocks += cuda::multi_tensor_blocks(t.n);
    }
    launch_table(items, blocks, cuda::apply_multi, "apply_update (multi-tensor)");
  }

  void adamw_multi(std::span<const AdamWTensor> tensors) override {
    std::vector<cuda::AdamWItem> items;
    items.reserve(tensors.size());
    int64_t blocks = 0;
    for (const AdamWTensor& t : tensors) {  // every tensor checked before the launch
      MESHMUON_CHECK(t.grad.is_contiguous(), "[adamw] gradient view is not contiguous");
      const int64_t n = t.grad.numel();
      const cpu::AdamScalars sc = cpu::adamw_args(t.o, t.param, t.grad.data, t.exp_avg, t.exp_avg_sq, n);
      if (n == 0) continue;
      items.push_back({sc, t.param, t.grad.data, t.exp_avg, t.exp_avg_sq, n, blocks, t.grad.dtype == DType::BF16, 0});
      blocks += cuda::multi_tensor_blocks(n);
    }
    launch_table(items, blocks, cuda::adamw_multi, "adamw (multi-tensor)");
  }

  void qk_clip_rows(const QkTag& tag, std::span<const float> logits, double tau, float* w, int64_t row_begin,
                    int64_t row_end, int64_t cols) override {
    validate_qk_tag(tag, "<unnamed>");
    validate_qk_logits(tag, logits, "<unnamed>");
    MESHMUON_CHECK(std::isfinite(tau) && tau > 0, "[qk_clip] threshold ", tau, " must be finite and > 0");
    MESHMUON_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= qk_tag_rows(tag), "[qk_clip] row range [",
                row_begin, ", ", row_end, ") is outside the ", qk_tag_rows(tag), " rows of the tagged parameter");
    MESHMUON_CHECK(cols >= 0, "[qk_clip] cols ", cols, " is negative");
    MESHMUON_CHECK(w != nullptr || row_begin == row_end || cols == 0, "[qk_clip] rows is null");
    const int64_t rows = row_end - row_begin;
    if (rows == 0 || cols == 0) return;
    std::vector<float> f(static_cast<size_t>(rows));  // the factors on the host (double math, as the cpu)
    bool any = false;
    for (int64_t r = 0; r < rows; ++r) {
      f[static_cast<size_t>(r)] = qk_clip_row_factor(tag, logits, tau, row_begin + r);
      any = any || f[static_cast<size_t>(r)] != 1.0f;
    }
    if (!any) return;
    const DeviceGuard guard = enter();
    auto* d = reinterpret_cast<float*>(thread_scratch(device_, f.size() * sizeof(float), kAuxScratch));
    thread_upload(device_, d, f.data(), f.size() * sizeof(float));
    finish(cuda::scale_rows(w, d, rows, cols, tl_stream), "qk_clip_rows");
  }

  void round_to_comm(float* x, int64_t n, DType comm) override {
    if (comm == DType::F32 || n <= 0) return;
    const DeviceGuard guard = enter();
    finish(cuda::round_bf16(x, n, tl_stream), "round_to_comm");
  }

  // ---- FSDP data movement: one launch each, complete before returning (communicators read them) ----
  void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) override {
    if (n <= 0) return;
    if (dst_dtype == src_dtype) return copy(dst, src, static_cast<size_t>(n) * dtype_size(dst_dtype));
    const DeviceGuard guard = enter();
    if (src_dtype == DType::F32)
      finish_sync(cuda::to_bf16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n, tl_stream), "convert to bf16");
    else
      finish_sync(cuda::from_bf16(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n, tl_stream), "convert to fp32");
  }
  void ordered_sum(const void* blocks, DType dtype, int64_t n, int blocks_n, float* out) override {
    if (n <= 0) return;
    const DeviceGuard guard = enter();
    finish_sync(cuda::ordered_sum(blocks, dtype == DType::BF16, n, blocks_n, out, tl_stream), "ordered_sum");
  }
  void divide(float* x, int64_t n, float d) override {
    if (n <= 0) return;
    const DeviceGuard guard = enter();
    finish_sync(cuda::divide(x, n, d, tl_stream), "divide");
  }
  void fill_zero(void* p, size_t bytes) override {
    if (bytes == 0) return;
    const DeviceGuard guard = enter();
    finish_sync(cudaMemsetAsync(p, 0, bytes, tl_stream), "fill_zero");
  }
  void zero(void* p, size_t bytes) override {
    if (bytes == 0) return;
    const DeviceGuard guard = enter();
    finish(cudaMemsetAsync(p, 0, bytes, tl_stream), "zero");
  }

  // One flag per view (the index of its first non-finite element, ~0 for none), all views scanned by
  // one multi-tensor launch, read back by one copy: one host synchronization for the step's gradients.
  std::vector<unsigned long long> non_finite_flags(std::span<const TensorView> views) {
    std::vector<unsigned long long> idx(views.size(), ~0ull);
    if (views.empty()) return idx;
    std::vector<cuda::NonFiniteItem> items;  // one multi-tensor launch over every view
    int64_t blocks = 0;
    for (size_t i = 0; i < views.size(); ++i) {
      const TensorView& g = views[i];
      if (g.is_none() || g.numel() == 0) continue;
      items.push_back({g.data, g.numel(), blocks, g.dtype == DType::BF16, static_cast<int32_t>(i)});
      blocks += cuda::multi_tensor_blocks(g.numel());
    }
    MESHMUON_CHECK(blocks <= INT_MAX && views.size() <= INT_MAX, "[cuda] non-finite scan: ", views.size(), " tensors need ",
                blocks, " blocks; at most ", INT_MAX);
    const DeviceGuard guard = enter();
    // the flags, then the table (256-byte aligned), in the thread's scratch
    const size_t flag_bytes = views.size() * sizeof(unsigned long long), table_at = (flag_bytes + 255) / 256 * 256;
    std::byte* scratch = thread_scratch(device_, table_at + items.size() * sizeof(cuda::NonFiniteItem), kAuxScratch);
    auto* flags = reinterpret_cast<unsigned long long*>(scratch);
    auto* table = reinterpret_cast<cuda::NonFiniteItem*>(scratch + table_at);
    check_cuda(cudaMemsetAsync(flags, 0xFF, flag_bytes, tl_stream), "cudaMemset");
    if (!items.empty()) {
      thread_upload(device_, table, items.data(), items.size() * sizeof(cuda::NonFiniteItem));
      check_cuda(cuda::first_non_finite_multi(table, static_cast<int>(items.size()), blocks, flags, tl_stream), "first_non_finite");
    }
    thread_download(device_, idx.data(), flags, flag_bytes);  // the one synchronization
    return idx;
  }
  int64_t first_non_finite_of(std::span<const TensorView> views) override {
    const std::vector<unsigned long long> idx = non_finite_flags(views);
    for (size_t i = 0; i < idx.size(); ++i)
      if (idx[i] != ~0ull) return static_cast<int64_t>(i);
    return -1;
  }
  int64_t first_non_finite(const TensorView& g) override {
    const unsigned long long idx = non_finite_flags(std::span<const TensorView>(&g, 1))[0];
    return idx == ~0ull ? -1 : static_cast<int64_t>(idx);
  }

  // ---- orthogonalization ----

  // The Orthogonalizer carries the options and the schedule (validated as on the cpu); its run() is
  // the cpu kernel, so on this backend only muon_units uses it.
  std::unique_ptr<Orthogonalizer> make_orthogonalizer(const NsOptions& o) override {
    check_ns_method(name(), kernel_caps(), o);
    MESHMUON_CHECK(!o.bf16_rounding,
                "[cuda] bf16_rounding (torch's bf16 emulation) is not implemented on the cuda backend; use "
                "matmul_dtype bf16 or the cpu backend");
    return std::make_unique<Orthogonalizer>(o);
  }

  void muon_units(Orthogonalizer& orth, float* u, int64_t batch, int64_t rows, int64_t cols, float* v, float* v_mean,
                  double beta2, DType comm) override {
    const UnitRef one{u, batch, v};
    muon_batch(orth, std::span<const UnitRef>(&one, 1), rows, cols, v_mean, beta2, comm);
  }

  // Newton–Schulz on the matrices of every unit together (cuda_ns.h).
  void muon_batch(Orthogonalizer& orth, std::span<const UnitRef> units, int64_t rows, int64_t cols, float* v_mean,
                  double beta2, DType comm) override {
    cuda_muon_batch(*this, device_, orth, units, rows, cols, v_mean, beta2, comm);
  }

  // The gram_allreduce strategy's iteration (cuda_ns.h).
  void gram_newton_schulz(const NsOptions& ns, float* x, int64_t m, int64_t n, bool wide, int64_t sd,
                          const GramReduce& reduce, DType comm) override {
    cuda_gram_newton_schulz(*this, device_, ns, x, m, n, wide, sd, reduce, comm);
  }

 private:
  // This backend's device, current for the calling scope; the caller's current device comes back
  // at its end (torch's current device on the caller's thread is left as it was).
  DeviceGuard enter() const { return DeviceGuard(device_); }

  int device_;
  std::shared_ptr<EventPool> events_;  // shared with the fences, which may outlive the backend
};

}  // namespace

std::shared_ptr<Backend> make_cuda_backend(int device) {
  std::string why;
  if (!cuda_device_available(&why)) throw_error(concat("[cuda] no CUDA device: ", why));
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  MESHMUON_CHECK_RUNTIME(device >= 0 && device < count, "[cuda] device ", device, " requested but only ", count,
                      " CUDA device(s) are visible");
  const DeviceGuard guard(device);  // creates the device's context, leaves the caller's device current
  return std::make_shared<CudaBackend>(device);
}

}  // namespace meshmuon::detail
