// The emulated CUDA runtime (tests/cuda_emu, README.md there): the cudart entry points meshmuon and its
// tests call, on the host. One device (MESHMUON_CUDA_EMU_DEVICES sets the count); work on a stream is
// queued and runs when the host synchronizes with it (streams.h); an event is a point in its
// stream's queue. Copies check
// their direction against where the pointers live and their ranges against live allocations, as a
// GPU's memory protection would fault on a wrong one.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "device_memory.h"
#include "streams.h"

struct CUstream_st {
  int id;
};
struct CUevent_st {
  // when the recorded point ran (shared with the queued record op, which may outlive the event)
  std::shared_ptr<std::chrono::steady_clock::time_point> at = std::make_shared<std::chrono::steady_clock::time_point>();
  bool recorded = false;
  meshmuon::cuda_emu::Mark mark;  // the point of its stream's queue it recorded
};

namespace {

using namespace meshmuon::cuda_emu;

thread_local cudaError_t tl_last = cudaSuccess;
thread_local int tl_device = 0;

int device_count() {
  const char* env = std::getenv("MESHMUON_CUDA_EMU_DEVICES");
  return env ? std::max(0, std::atoi(env)) : 1;
}

cudaError_t fail(cudaError_t e) {
  tl_last = e;
  return e;
}

bool stream_ok(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread || s->id == 0x5EA; }

// Where `bytes` at p may be read or written by a copy of `kind`: device memory must be one live
// allocation; host memory must not be inside the device range.
bool side_ok(const void* p, size_t bytes, bool device, const char* what) {
  if (device) return expect_device(p, bytes, what);
  if (is_device(p)) return fail_access(std::string(what) + ": a device pointer where the copy's kind says host");
  return true;
}

// A synchronization's result: the sticky error of a queued op that faulted, else success.
cudaError_t synced() {
  const int e = sticky_error();
  return e != 0 ? fail(static_cast<cudaError_t>(e)) : cudaSuccess;
}

// cudaMemcpy (sync: on the legacy stream, complete when it returns) and cudaMemcpyAsync (queued on
// s). As CUDA does with pageable host memory: a copy from it takes the source at the call (the
// caller may reuse it at once), a copy into it completes before returning (after the stream's
// earlier work). Pinned memory and device-to-device copies stay queued.
cudaError_t do_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s, bool sync) {
  if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  bool dst_dev = is_device(dst), src_dev = is_device(src);
  switch (kind) {
    case cudaMemcpyHostToHost: dst_dev = src_dev = false; break;
    case cudaMemcpyHostToDevice: dst_dev = true, src_dev = false; break;
    case cudaMemcpyDeviceToHost: dst_dev = false, src_dev = true; break;
    case cudaMemcpyDeviceToDevice: dst_dev = src_dev = true; break;
    case cudaMemcpyDefault: break;  // unified addressing: where they are
    default: return fail(cudaErrorInvalidMemcpyDirection);
  }
  if (!side_ok(dst, bytes, dst_dev, "cudaMemcpy destination") || !side_ok(src, bytes, src_dev, "cudaMemcpy source"))
    return fail(cudaErrorInvalidValue);
  const bool dst_pageable = !dst_dev && !is_pinned(dst), src_pageable = !src_dev && !is_pinned(src);
  if (src_pageable && dst_dev) count_made(Made::PageableUpload);
  if (src_pageable && !dst_pageable) {  // the source is taken now
    auto copy = std::make_shared<std::vector<std::byte>>(static_cast<const std::byte*>(src),
                                                         static_cast<const std::byte*>(src) + bytes);
    submit(s, [dst, copy] {
      DeviceScope scope;
      std::memcpy(dst, copy->data(), copy->size());
      return true;
    });
  } else {
    submit(s, [dst, src, bytes] {
      DeviceScope scope;
      std::memmove(dst, src, bytes);
      return true;
    });
  }
  // Complete on return: a synchronous copy that touches host memory (device to device is not
  // waited for), a copy into pageable memory, a copy between host memories.
  if ((sync && !(dst_dev && src_dev)) || dst_pageable || (!dst_dev && !src_dev)) {
    count_made(Made::HostWait);
    drain(s);
    return synced();
  }
  return cudaSuccess;
}

cudaError_t do_memset(void* p, int value, size_t bytes, cudaStream_t s) {
  if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (!expect_device(p, bytes, "cudaMemset")) return fail(cudaErrorInvalidValue);
  submit(s, [p, value, bytes] {
    DeviceScope scope;
    std::memset(p, value, bytes);
    return true;
  });
  return cudaSuccess;
}

}  // namespace

extern "C" {

const char* CUDARTAPI cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error (cuda_emu)";
    case cudaErrorInvalidValue: return "invalid argument (cuda_emu)";
    case cudaErrorMemoryAllocation: return "out of memory (cuda_emu)";
    case cudaErrorInvalidDevice: return "invalid device ordinal (cuda_emu)";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle (cuda_emu)";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (cuda_emu)";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (cuda_emu)";
    case cudaErrorNotReady: return "device not ready (cuda_emu)";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy (cuda_emu)";
    default: return "unknown error (cuda_emu)";
  }
}

cudaError_t CUDARTAPI cudaGetLastError(void) {
  if (sticky_error() != 0) return static_cast<cudaError_t>(sticky_error());  // the context is dead
  const cudaError_t e = tl_last;
  tl_last = cudaSuccess;
  return e;
}

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = device_count();
  return *count == 0 ? fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  tl_device = device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  *device = tl_device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "cuda_emu (host emulation, no GPU)");
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = size_t{16} << 30;
  prop->multiProcessorCount = 1;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  count_made(Made::HostWait);
  drain_device(tl_device);
  return synced();
}

cudaError_t CUDARTAPI cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return fail(cudaErrorInvalidValue);
  *p = device_alloc(bytes);
  return *p == nullptr ? fail(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t CUDARTAPI cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  count_made(Made::HostWait);
  drain_device(tl_device);  // cudaFree synchronizes the device
  if (!device_free(p)) {
    fail_access("cudaFree of a pointer that is not a live device allocation");
    return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

// Stream-ordered allocation: the memory is there at once (CUDA's is usable by work queued after the
// call on the stream); the free runs when the stream reaches it.
cudaError_t CUDARTAPI cudaMallocAsync(void** p, size_t bytes, cudaStream_t) {
  if (p == nullptr) return fail(cudaErrorInvalidValue);
  *p = device_alloc(bytes);
  return *p == nullptr ? fail(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t CUDARTAPI cudaFreeAsync(void* p, cudaStream_t stream) {
  if (p == nullptr) return cudaSuccess;
  if (!device_range_ok(p, 0)) {
    fail_access("cudaFreeAsync of a pointer that is not a live device allocation");
    return fail(cudaErrorInvalidValue);
  }
  submit(stream, [p] { return device_free(p) || fail_access("cudaFreeAsync: freed twice"); });
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  if (free_bytes == nullptr || total == nullptr) return fail(cudaErrorInvalidValue);
  *total = device_bytes_total();
  *free_bytes = *total - device_bytes_in_use();
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMallocHost(void** p, size_t bytes) {
  if (p == nullptr) return fail(cudaErrorInvalidValue);
  *p = pinned_alloc(bytes);
  return *p == nullptr ? fail(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t CUDARTAPI cudaHostAlloc(void** p, size_t bytes, unsigned int) { return cudaMallocHost(p, bytes); }

cudaError_t CUDARTAPI cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  count_made(Made::HostWait);
  drain_device(tl_device);  // as cudaFree (CUDA may wait for more; this is the weaker choice)
  if (!pinned_free(p)) {
    fail_access("cudaFreeHost of a pointer that is not pinned memory");
    return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  if (a == nullptr) return fail(cudaErrorInvalidValue);
  *a = cudaPointerAttributes{};
  if (is_device(p)) {
    a->type = cudaMemoryTypeDevice;
    a->device = 0;
    a->devicePointer = const_cast<void*>(p);
  } else if (is_pinned(p)) {
    a->type = cudaMemoryTypeHost;
    a->devicePointer = a->hostPointer = const_cast<void*>(p);
  } else {
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
    a->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return do_copy(dst, src, bytes, kind, nullptr, true);
}
cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  return do_copy(dst, src, bytes, kind, s, false);
}
cudaError_t CUDARTAPI cudaMemset(void* p, int value, size_t bytes) { return do_memset(p, value, bytes, nullptr); }
cudaError_t CUDARTAPI cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  return do_memset(p, value, bytes, s);
}

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* s) {
  if (s == nullptr) return fail(cudaErrorInvalidValue);
  *s = new CUstream_st{0x5EA};
  set_queue_device(*s, tl_device);
  count_made(Made::Stream);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) { return cudaStreamCreate(s); }
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr || !stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
  s->id = 0;  // its queued work still runs, at a later synchronization (CUDA returns at once too)  // a use after destruction fails stream_ok
  delete s;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t s) {
  if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
  count_made(Made::HostWait);
  drain(s);
  return synced();
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* e) {
  if (e == nullptr) return fail(cudaErrorInvalidValue);
  *e = new CUevent_st;
  count_made(Made::Event);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { return cudaEventCreate(e); }
cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t e) {
  delete e;  // a queued record writes into its shared time stamp, not into the event
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
  e->mark = submit_marked(s, [at = e->at] {
    *at = std::chrono::steady_clock::now();
    return true;
  });
  e->recorded = true;
  return cudaSuccess;
}
// The stream's later work waits for the point the event recorded (taken now, as CUDA does: a later
// record of the same event does not move it). The wait is an op of the stream that, when it comes
// up, runs the event's stream up to that point (streams.h advance_to); an event never recorded is
// complete.
cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  if (e == nullptr || !stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
  if (!e->recorded) return cudaSuccess;
  submit_op(s, [m = e->mark] { return advance_to(m) ? OpStatus::Done : OpStatus::Blocked; });
  return cudaSuccess;
}

// Not reached yet: cudaErrorNotReady, and the queue runs up to the event, as a GPU gets on with its
// work, so a caller that polls sees it complete next time. NotReady is also left as the thread's
// last error, as CUDA runtimes have done (PyTorch clears it after every query): a caller that does
// not clear it sees its next kernel launch report "device not ready".
cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t e) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (!e->recorded || reached(e->mark)) return synced();
  (void)try_drain_to(e->mark);  // never waits (a collective's peers may not have come yet)
  return fail(cudaErrorNotReady);
}
cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t e) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  count_made(Made::HostWait);
  if (e->recorded) drain_to(e->mark);
  return synced();
}
cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return fail(cudaErrorInvalidValue);
  if (!start->recorded || !end->recorded) return fail(cudaErrorInvalidResourceHandle);
  if (!reached(start->mark) || !reached(end->mark)) return fail(cudaErrorNotReady);  // as cudaEventQuery
  *ms = std::chrono::duration<float, std::milli>(*end->at - *start->at).count();
  return cudaSuccess;
}

}  // extern "C"
