// Internal: the per-thread CUDA state of the cuda backend (thread_resources.h): the resources of
// each thread on each device, made at first use and freed when the thread ends.
#include "backend/cuda/thread_resources.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda/cublas_loader.h"
#include "backend/cuda/shared/cuda_error.h"
#include "backend/cuda/upload_ring.h"

namespace meshmuon::detail {

thread_local constinit cudaStream_t tl_stream = nullptr;

namespace {

// The calling thread's cuBLAS handle and Newton–Schulz scratch per device, freed when the thread
// ends: a pipeline runs its compute stream on a worker thread of its own each step, and resources kept
// for the process would leak a handle and a scratch every step. The main thread's go at exit before
// the runtime's own teardown (thread-local destructors run before atexit handlers); errors there are
// ignored.
struct ThreadResources {
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
    bool legacy = false;  // last used on the legacy stream (outside a CudaStream job)
  };
  struct OnDevice {
    cublasHandle_t blas = nullptr;
    Scratch scratch[2];  // ScratchSlot
    UploadRing uploads;
    Scratch readback;  // pinned host memory (download)
  };
  std::vector<OnDevice> devices;
  ~ThreadResources() {
    for (size_t d = 0; d < devices.size(); ++d) {
      OnDevice& r = devices[d];
      // a device this thread never used: setting it current would make a context there
      if (r.blas == nullptr && r.scratch[0].p == nullptr && r.scratch[1].p == nullptr && r.uploads.empty() &&
          r.readback.p == nullptr)
        continue;
      if (cudaSetDevice(static_cast<int>(d)) != cudaSuccess) continue;
      // What used the memory is done: a CudaStream synchronizes its stream before its worker thread
      // ends; a slot the thread used on the legacy stream waits for that stream here (cudaFree does
      // not wait for memory from cudaMallocAsync). A worker thread never waits for the legacy stream
      // (PyTorch's default stream, busy with unrelated work).
      if (r.scratch[0].legacy || r.scratch[1].legacy) (void)cudaStreamSynchronize(nullptr);
      r.uploads = UploadRing();  // waits for its copies, frees its memory and events
      if (r.readback.p != nullptr) (void)cudaFreeHost(r.readback.p);
      if (r.blas != nullptr) (void)cublas().destroy(r.blas);
      for (const Scratch& x : r.scratch)
        if (x.p != nullptr) (void)cudaFree(x.p);
    }
  }
  OnDevice& on(int device) {
    if (static_cast<int>(devices.size()) <= device) devices.resize(static_cast<size_t>(device) + 1);
    return devices[static_cast<size_t>(device)];
  }
};
thread_local ThreadResources tl_resources;

}  // namespace

cublasHandle_t blas_handle(int device) {
  cublasHandle_t& h = tl_resources.on(device).blas;
  if (h == nullptr) h = make_blas_handle("cublasCreate");
  check_blas(cublas().set_stream(h, tl_stream), "cublasSetStream");
  return h;
}

std::byte* thread_scratch(int device, size_t bytes, ScratchSlot slot) {
  ThreadResources::Scratch& s = tl_resources.on(device).scratch[slot];
  if (s.bytes < bytes) {
    // Stream-ordered (the slot's one stream, thread_resources.h): the old block is freed once that
    // stream's earlier work, its last user, has run; no host or device wait (cudaFree would wait for
    // the whole device, a stall of every stream mid-step when a compute thread meets a larger matrix).
    if (s.p != nullptr) check_cuda(cudaFreeAsync(s.p, tl_stream), "cudaFreeAsync (scratch)");
    s.p = nullptr, s.bytes = 0;
    check_cuda(cudaMallocAsync(&s.p, bytes, tl_stream), "cudaMallocAsync (scratch)");
    s.bytes = bytes;
  }
  s.legacy = s.legacy || tl_stream == nullptr;
  return static_cast<std::byte*>(s.p);
}

void thread_upload(int device, void* dst, const void* src, size_t bytes) {
  tl_resources.on(device).uploads.upload(dst, src, bytes, tl_stream);
}

void thread_download(int device, void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  ThreadResources::Scratch& h = tl_resources.on(device).readback;
  if (h.bytes < bytes) {
    if (h.p != nullptr) check_cuda(cudaFreeHost(h.p), "cudaFreeHost (read-back)");
    h.p = nullptr, h.bytes = 0;
    const size_t cap = std::max<size_t>(bytes, 4096);
    check_cuda(cudaMallocHost(&h.p, cap), "cudaMallocHost (read-back)");
    h.bytes = cap;
  }
  check_cuda(cudaMemcpyAsync(h.p, src, bytes, cudaMemcpyDeviceToHost, tl_stream), "cudaMemcpy to host");
  check_cuda(cudaStreamSynchronize(tl_stream), "cudaMemcpy to host");
  std::memcpy(dst, h.p, bytes);
}

}  // namespace meshmuon::detail
