// Test infrastructure: the emulated GPU's memory (tests/cuda_emu, README.md there).
//
// "Device memory" is one reserved address range of this process. Outside an emulated device
// operation (a copy, a memset, a kernel, a cuBLAS call) the range is PROT_NONE: host code that
// dereferences a device pointer dies with SIGSEGV, as it would fault (or read garbage) on a GPU.
// Allocations are filled with 0xFF bytes (NaN floats), as cudaMalloc returns uninitialized memory.
#pragma once

#include <cstddef>
#include <string>

namespace meshmuon::cuda_emu {

// The allocator of the emulated device (256-byte aligned; nullptr when the range is exhausted).
void* device_alloc(size_t bytes);
bool device_free(void* p);  // false: not a live device allocation

// Pinned host memory (cudaMallocHost / cudaHostAlloc): plain host memory, remembered as pinned.
void* pinned_alloc(size_t bytes);
bool pinned_free(void* p);

size_t device_bytes_in_use();  // live device allocations, as allocated (cudaMemGetInfo)
size_t device_bytes_total();

bool is_device(const void* p);  // inside the device range (live or not)
bool is_pinned(const void* p);  // inside a live pinned allocation
// True when [p, p + bytes) lies inside one live device allocation (bytes 0: p inside or one past).
bool device_range_ok(const void* p, size_t bytes);

// Reports an emulated illegal access (stderr, with `what`) and returns false; callers turn it into
// cudaErrorIllegalAddress / CUBLAS_STATUS_EXECUTION_FAILED.
bool fail_access(const std::string& what);
bool pinned_range_ok(const void* p, size_t bytes);  // inside one live pinned allocation
// What a kernel may address: `bytes` at p inside one live device allocation or one pinned host
// allocation (mapped into the device's address space), for the operation named `what`.
bool expect_device(const void* p, size_t bytes, const char* what);

// How many resources the emulated CUDA made since the process started (never decremented), so a
// test can check that a steady state makes none: device allocations (cudaMalloc, a cuBLAS handle's
// workspace included), pinned allocations, streams, events, cuBLAS handles.
// What the runtime made, and PageableUpload: host-to-device copies from pageable memory (which CUDA
// may stage with a synchronization of the stream; a step makes none after its first); HostWait: the
// calls in which the host waits for queued device work (cudaStreamSynchronize, cudaEventSynchronize,
// cudaDeviceSynchronize, a copy that completes before returning, cudaFree, cudaFreeHost; a
// cudaEventQuery never waits and is not counted); LtDescriptor: cublasLtMatmulDescCreate calls.
enum class Made { DeviceAlloc, PinnedAlloc, Stream, Event, BlasHandle, PageableUpload, HostWait, LtDescriptor, kCount };
unsigned long long made(Made what);
// Fault injection (kernels.cpp): the next launch of the launcher named `kernel` (cuda_kernels.h, e.g.
// "ns_polynomial") faults when it runs on its stream, as a kernel that hits a bad address does on a
// GPU: the context's error becomes sticky (every later synchronization returns it).
void fault_next_launch_of(const char* kernel);
void count_made(Made what);

// Device scope: while one exists on any thread, device memory is readable and writable.
class DeviceScope {
 public:
  DeviceScope();
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
};

}  // namespace meshmuon::cuda_emu
