// Test support: a test-only backend, registered through the backend registry the way a new backend
// would be (docs/architecture.md "How to add a backend"), that runs every call on an inner backend (the cpu's).
// It proves the plug-in point: an engine constructed with OptimizerOptions::device = its name finds
// it through select_device, runs on it, and gets the cpu's bits; and a backend that declares fewer
// orthogonalization methods (KernelCaps::ns_methods) is refused by name at engine construction.
//
//   ScopedDelegateBackend reg("delegate");                     // registered while it lives
//   ScopedDelegateBackend few("nogram", {NsMethod::Plain});    // declares plain only
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "meshmuon/error.h"

namespace meshmuon::test {

class DelegateBackend final : public detail::Backend {
 public:
  DelegateBackend(std::string name, std::optional<std::vector<NsMethod>> methods = std::nullopt)
      : name_(std::move(name)), methods_(std::move(methods)), inner_(detail::make_cpu_backend()) {}

  // ---- the device interface ----
  std::string_view name() const override { return name_; }
  Device device() const override { return inner_->device(); }
  detail::DeviceCaps device_caps() const override { return inner_->device_caps(); }
  detail::Buffer allocate(size_t bytes, detail::MemoryKind kind) override { return inner_->allocate(bytes, kind); }
  void copy(void* dst, const void* src, size_t bytes) override { inner_->copy(dst, src, bytes); }
  void copy_queued(void* dst, const void* src, size_t bytes) override { inner_->copy_queued(dst, src, bytes); }
  std::unique_ptr<detail::Stream> make_stream(bool threaded, detail::JobEnd end) override {
    return inner_->make_stream(threaded, end);
  }
  void synchronize() override { inner_->synchronize(); }
  detail::Fence fence(void* stream) override { return inner_->fence(stream); }
  void wait(DeviceEvent e, void* stream) override { inner_->wait(e, stream); }

  // ---- the kernel interface ----
  detail::KernelCaps kernel_caps() const override {
    detail::KernelCaps c = inner_->kernel_caps();
    if (methods_) c.ns_methods = *methods_;
    return c;
  }
  int set_threads(int threads) override { return inner_->set_threads(threads); }
  int threads() const override { return inner_->threads(); }
  void pack(std::span<const detail::PackRun> runs, std::span<std::byte* const> bases) override { inner_->pack(runs, bases); }
  void momentum(const MomentumOptions& o, float* buf, const TensorView& grad, float* update) override {
    inner_->momentum(o, buf, grad, update);
  }
  void apply_update(const ApplyOptions& o, float* param, const float* update, int64_t n) override {
    inner_->apply_update(o, param, update, n);
  }
  void adamw(const AdamWOptions& o, float* param, const TensorView& grad, float* exp_avg, float* exp_avg_sq) override {
    inner_->adamw(o, param, grad, exp_avg, exp_avg_sq);
  }
  void momentum_multi(std::span<const MomentumTensor> tensors, DType comm) override { inner_->momentum_multi(tensors, comm); }
  void apply_multi(std::span<const ApplyTensor> tensors) override { inner_->apply_multi(tensors); }
  void adamw_multi(std::span<const AdamWTensor> tensors) override { inner_->adamw_multi(tensors); }
  void qk_clip_rows(const QkTag& tag, std::span<const float> logits, double threshold, float* w, int64_t row_begin,
                    int64_t row_end, int64_t cols) override {
    inner_->qk_clip_rows(tag, logits, threshold, w, row_begin, row_end, cols);
  }
  void round_to_comm(float* x, int64_t n, DType comm) override { inner_->round_to_comm(x, n, comm); }
  int64_t first_non_finite(const TensorView& g) override { return inner_->first_non_finite(g); }
  int64_t first_non_finite_of(std::span<const TensorView> views) override { return inner_->first_non_finite_of(views); }
  void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) override {
    inner_->convert(dst, dst_dtype, src, src_dtype, n);
  }
  void ordered_sum(const void* blocks, DType dtype, int64_t n, int blocks_n, float* out) override {
    inner_->ordered_sum(blocks, dtype, n, blocks_n, out);
  }
  void divide(float* x, int64_t n, float d) override { inner_->divide(x, n, d); }
  void fill_zero(void* p, size_t bytes) override { inner_->fill_zero(p, bytes); }
  void zero(void* p, size_t bytes) override { inner_->zero(p, bytes); }
  std::unique_ptr<Orthogonalizer> make_orthogonalizer(const NsOptions& o) override {
    detail::check_ns_method(name(), kernel_caps(), o);  // the contract: refuse what is not declared
    return inner_->make_orthogonalizer(o);
  }
  void muon_units(Orthogonalizer& orth, float* u, int64_t batch, int64_t rows, int64_t cols, float* v, float* v_mean,
                  double beta2, DType comm) override {
    inner_->muon_units(orth, u, batch, rows, cols, v, v_mean, beta2, comm);
  }
  void muon_batch(Orthogonalizer& orth, std::span<const UnitRef> units, int64_t rows, int64_t cols, float* v_mean,
                  double beta2, DType comm) override {
    inner_->muon_batch(orth, units, rows, cols, v_mean, beta2, comm);
  }
  void gram_newton_schulz(const NsOptions& o, float* x, int64_t local_rows, int64_t local_cols, bool wide, int64_t s,
                          const detail::GramReduce& reduce, DType comm) override {
    inner_->gram_newton_schulz(o, x, local_rows, local_cols, wide, s, reduce, comm);
  }

 private:
  std::string name_;
  std::optional<std::vector<NsMethod>> methods_;
  std::shared_ptr<detail::Backend> inner_;
};

// Registers a DelegateBackend under `name` while it lives (the registry's add / remove).
class ScopedDelegateBackend {
 public:
  explicit ScopedDelegateBackend(std::string name, std::optional<std::vector<NsMethod>> methods = std::nullopt)
      : name_(std::move(name)) {
    detail::backend_registry().add(name_, [n = name_, methods](int) {
      return detail::EngineDevice{std::make_shared<DelegateBackend>(n, methods), detail::host_memory_space()};
    });
  }
  ~ScopedDelegateBackend() { detail::backend_registry().remove(name_); }
  ScopedDelegateBackend(const ScopedDelegateBackend&) = delete;
  ScopedDelegateBackend& operator=(const ScopedDelegateBackend&) = delete;

 private:
  std::string name_;
};

}  // namespace meshmuon::test
