// A fake device backend for testing the engines' device paths on a machine without a GPU.
// - FakeDeviceMemory: "device" memory is a PROT_NONE mapping of a memfd; a second, writable mapping
//   of the same file (the alias) is reachable only through alias(). The host touching a device
//   pointer faults (SIGSEGV), so a test that passes proves nobody but the backend's own kernels and
//   copies touched device memory.
// - FakeDeviceSpace: the comm MemorySpace over it (single / mpi communicators stage through it).
// - FakeDeviceBackend: the cpu backend behind a translation layer. allocate(Device) hands out
//   PROT_NONE pointers; every kernel, pack table, copy and Gram reduce buffer is translated to the
//   alias and forwarded to the cpu backend, so results are bitwise the cpu backend's.
//   device() reports cuda:0 (no test-only DeviceKind in the public enum): the engine's device
//   checks then run exactly as they would on a GPU; device_caps().device_memory is true.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "comm/staging.h"

namespace meshmuon::test {

class FakeDeviceMemory {
 public:
  explicit FakeDeviceMemory(size_t capacity = size_t{512} << 20) : capacity_(capacity) {
    const int fd = memfd_create("meshmuon-fake-device-backend", 0);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(capacity)) != 0) throw std::runtime_error("memfd");
    device_ = static_cast<std::byte*>(mmap(nullptr, capacity, PROT_NONE, MAP_SHARED, fd, 0));
    alias_ = static_cast<std::byte*>(mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    if (device_ == MAP_FAILED || alias_ == MAP_FAILED) throw std::runtime_error("mmap");
  }
  ~FakeDeviceMemory() {
    munmap(device_, capacity_);
    munmap(alias_, capacity_);
  }
  FakeDeviceMemory(const FakeDeviceMemory&) = delete;
  FakeDeviceMemory& operator=(const FakeDeviceMemory&) = delete;

  bool contains(const void* p) const {
    const auto* b = static_cast<const std::byte*>(p);
    return b >= device_ && b < device_ + capacity_;
  }
  // Zero-filled device memory, 256-byte aligned; bump allocation (fresh memfd pages are zero), freed
  // with the memory. Engines reuse their buffers, so a test's total stays small.
  void* allocate(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    used_ = (used_ + 255) / 256 * 256;
    if (used_ + bytes > capacity_) throw std::runtime_error("fake device memory full");
    void* p = device_ + used_;
    used_ += std::max<size_t>(bytes, 1);
    return p;
  }
  // The writable alias of a device pointer; any other pointer unchanged.
  template <class T>
  T* alias(T* p) const {
    if (p == nullptr || !contains(p)) return p;
    const auto* b = reinterpret_cast<const std::byte*>(p);
    return reinterpret_cast<T*>(alias_ + (b - device_));
  }
  size_t used() const { return used_; }

 private:
  size_t capacity_, used_ = 0;
  std::mutex mu_;
  std::byte* device_ = nullptr;
  std::byte* alias_ = nullptr;
};

class FakeDeviceSpace final : public detail::MemorySpace {
 public:
  explicit FakeDeviceSpace(std::shared_ptr<FakeDeviceMemory> mem) : mem_(std::move(mem)) {}
  std::string_view name() const override { return "fake device backend (test)"; }
  bool has_devices() const override { return true; }
  bool is_device(const void* p) const override { return mem_->contains(p); }
  void* alloc_pinned(size_t bytes) override {
    void* p = std::malloc(std::max<size_t>(bytes, 1));
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void free_pinned(void* p) noexcept override { std::free(p); }
  void copy_to_host(void* host, const void* device, size_t bytes) override {
    std::memcpy(host, mem_->alias(device), bytes);
    ++to_host;
  }
  void copy_to_device(void* device, const void* host, size_t bytes) override {
    std::memcpy(mem_->alias(device), host, bytes);
    ++to_device;
  }
  size_t to_host = 0, to_device = 0;

 private:
  std::shared_ptr<FakeDeviceMemory> mem_;
};

class FakeDeviceBackend final : public detail::Backend {
 public:
  explicit FakeDeviceBackend(std::shared_ptr<FakeDeviceMemory> mem = std::make_shared<FakeDeviceMemory>())
      : mem_(std::move(mem)), cpu_(detail::make_cpu_backend()) {}
  const std::shared_ptr<FakeDeviceMemory>& memory() const { return mem_; }
  std::shared_ptr<FakeDeviceSpace> space() const { return std::make_shared<FakeDeviceSpace>(mem_); }

  std::string_view name() const override { return "fake-device"; }
  Device device() const override { return {DeviceKind::Cuda, 0}; }
  detail::DeviceCaps device_caps() const override { return {.device_memory = true}; }
  detail::KernelCaps kernel_caps() const override { return cpu_->kernel_caps(); }
  detail::Buffer allocate(size_t bytes, detail::MemoryKind kind) override {
    if (kind != detail::MemoryKind::Device) return cpu_->allocate(bytes, kind);
    ++device_allocations;
    return detail::Buffer(mem_->allocate(bytes), bytes, kind, device(), [](void*) {});
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memmove(mem_->alias(dst), mem_->alias(src), bytes);
  }
  std::unique_ptr<detail::Stream> make_stream(bool threaded, detail::JobEnd end) override {
    return cpu_->make_stream(threaded, end);
  }
  int set_threads(int threads) override { return cpu_->set_threads(threads); }
  int threads() const override { return cpu_->threads(); }

  void pack(std::span<const detail::PackRun> runs, std::span<std::byte* const> bases) override {
    std::vector<std::byte*> b(bases.begin(), bases.end());
    for (std::byte*& p : b) p = mem_->alias(p);
    cpu_->pack(runs, b);
  }
  void momentum(const MomentumOptions& o, float* buf, const TensorView& grad, float* update) override {
    cpu_->momentum(o, mem_->alias(buf), host(grad), mem_->alias(update));
  }
  void apply_update(const ApplyOptions& o, float* param, const float* update, int64_t n) override {
    cpu_->apply_update(o, mem_->alias(param), mem_->alias(update), n);
  }
  void adamw(const AdamWOptions& o, float* param, const TensorView& grad, float* exp_avg, float* exp_avg_sq) override {
    cpu_->adamw(o, mem_->alias(param), host(grad), mem_->alias(exp_avg), mem_->alias(exp_avg_sq));
  }
  void qk_clip_rows(const QkTag& tag, std::span<const float> logits, double threshold, float* w, int64_t row_begin,
                    int64_t row_end, int64_t cols) override {
    cpu_->qk_clip_rows(tag, logits, threshold, mem_->alias(w), row_begin, row_end, cols);
  }
  void round_to_comm(float* x, int64_t n, DType comm) override { cpu_->round_to_comm(mem_->alias(x), n, comm); }
  int64_t first_non_finite(const TensorView& g) override {
    if (fail_next_scan.exchange(false))  // a device fault that the step's first device read meets
      detail::throw_error("[fake device] an injected device fault (fail_next_scan)");
    return cpu_->first_non_finite(host(g));
  }
  void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) override {
    cpu_->convert(mem_->alias(dst), dst_dtype, mem_->alias(src), src_dtype, n);
  }
  void ordered_sum(const void* blocks, DType dtype, int64_t n, int blocks_n, float* out) override {
    cpu_->ordered_sum(mem_->alias(blocks), dtype, n, blocks_n, mem_->alias(out));
  }
  void divide(float* x, int64_t n, float d) override { cpu_->divide(mem_->alias(x), n, d); }
  void fill_zero(void* p, size_t bytes) override { cpu_->fill_zero(mem_->alias(p), bytes); }
  std::unique_ptr<Orthogonalizer> make_orthogonalizer(const NsOptions& o) override { return cpu_->make_orthogonalizer(o); }
  void muon_units(Orthogonalizer& orth, float* u, int64_t batch, int64_t rows, int64_t cols, float* v, float* v_mean,
                  double beta2, DType comm) override {
    cpu_->muon_units(orth, mem_->alias(u), batch, rows, cols, mem_->alias(v), mem_->alias(v_mean), beta2, comm);
  }
  // The cpu kernel hands its reduce host memory; the engine's reduce gets a device buffer instead,
  // as it would from a GPU backend (so the communicator must stage it).
  void gram_newton_schulz(const NsOptions& o, float* x, int64_t local_rows, int64_t local_cols, bool wide, int64_t s,
                          const detail::GramReduce& reduce, DType comm) override {
    const detail::GramReduce on_device = [&](float* a, size_t count, int step, DeviceEvent ready) {
      float* d = gram_scratch(count);
      std::memcpy(mem_->alias(d), a, count * sizeof(float));
      reduce(d, count, step, ready);
      std::memcpy(a, mem_->alias(d), count * sizeof(float));
    };
    cpu_->gram_newton_schulz(o, mem_->alias(x), local_rows, local_cols, wide, s, on_device, comm);
  }

  size_t device_allocations = 0;
  std::atomic<bool> fail_next_scan{false};  // the next non-finite scan throws meshmuon::Error

 private:
  TensorView host(TensorView v) const {
    v.data = mem_->alias(v.data);
    return v;
  }
  // One scratch per calling thread (threads may run Gram NS at once, as the cuda backend allows).
  float* gram_scratch(size_t count) {
    std::lock_guard<std::mutex> lock(gram_mu_);
    auto& [gram, gram_count] = gram_[std::this_thread::get_id()];
    if (gram_count < count) gram = static_cast<float*>(mem_->allocate(count * sizeof(float))), gram_count = count;
    return gram;
  }

  std::shared_ptr<FakeDeviceMemory> mem_;
  std::shared_ptr<detail::Backend> cpu_;
  std::mutex gram_mu_;
  std::map<std::thread::id, std::pair<float*, size_t>> gram_;
};

// Device buffers on a fake device backend, filled from / read back to host vectors.
template <class T>
T* to_device(detail::Backend& b, std::vector<detail::Buffer>& keep, const std::vector<T>& host) {
  keep.push_back(b.allocate(host.size() * sizeof(T), detail::MemoryKind::Device));
  b.copy(keep.back().data(), host.data(), host.size() * sizeof(T));
  return keep.back().template as<T>();
}
template <class T>
std::vector<T> to_host(detail::Backend& b, const T* device, size_t n) {
  std::vector<T> out(n);
  b.copy(out.data(), device, n * sizeof(T));
  return out;
}

}  // namespace meshmuon::test
