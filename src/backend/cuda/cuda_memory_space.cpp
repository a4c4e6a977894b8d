// cudart's MemorySpace (memory_space.h), in CUDA builds: device pointers are those
// cudaPointerGetAttributes calls device or managed memory; pinned buffers from cudaHostAlloc;
// copies on a stream of this space's own, synchronized before returning; host waits for the cuda
// backend's events. Registered as the cuda backend's space probe (cuda_backend.cpp): without a
// usable device (no driver, no GPU) cuda_memory_space() returns nullptr and the host space is used:
// the failing probe never breaks a CPU-only run.
#include <cuda_runtime_api.h>

#include <mutex>

#include "backend/cuda/cuda_backend.h"
#include "backend/memory_space.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_error(concat("[comm] staging through pinned memory: ", what, ": ", cudaGetErrorString(e)));
}

class CudaMemorySpace final : public MemorySpace {
 public:
  std::string_view name() const override { return "cuda"; }
  bool has_devices() const override { return true; }

  bool is_device(const void* p) const override {
    if (p == nullptr) return false;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();  // a plain host pointer on old runtimes: clear the sticky-free error
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }

  void* alloc_pinned(size_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    return p;
  }
  void free_pinned(void* p) noexcept override {
    if (p != nullptr) (void)cudaFreeHost(p);
  }

  void copy_to_host(void* host, const void* device, size_t bytes) override { copy(host, device, bytes); }
  void copy_to_device(void* device, const void* host, size_t bytes) override { copy(device, host, bytes); }

  void check_device_index(int index, std::string_view who) const override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) (void)cudaGetLastError(), count = 0;
    MESHMUON_CHECK(index < count, who, ": this process sees ", count, " CUDA device", count == 1 ? "" : "s",
                   " (cuda:0 to cuda:", count - 1, "); name one of them (CUDA_VISIBLE_DEVICES renumbers them from 0)");
  }

  void wait_on_host(DeviceEvent e, std::string_view who) override {
    if (e.empty()) return;
    const cudaError_t r = cudaEventSynchronize(static_cast<cudaEvent_t>(e.handle));
    if (r != cudaSuccess)
      throw_error(concat("[", who, "] waiting for the device work a communication follows: ", cudaGetErrorString(r)));
  }

 private:
  // cudaMemcpyDefault: the runtime infers the direction (unified addressing) and the device.
  void copy(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_ == nullptr) check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  std::mutex mu_;
  cudaStream_t stream_ = nullptr;  // never destroyed: destroying it after the runtime at exit is not safe
};

}  // namespace

std::shared_ptr<MemorySpace> cuda_memory_space() {
  static const std::shared_ptr<MemorySpace> space = []() -> std::shared_ptr<MemorySpace> {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return std::make_shared<CudaMemorySpace>();
  }();
  return space;
}

}  // namespace meshmuon::detail
