// Internal: the calling thread's CUDA state for the cuda backend: its current stream and, per
// device, its cuBLAS handle, its scratch slots, its pinned upload ring and its pinned read-back
// buffer (thread_resources.cpp frees them when the thread ends).
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace meshmuon::detail {

// The current stream of this thread (nullptr: the legacy default stream): a CudaStream's while one
// of its jobs runs on the thread (cuda_stream.cpp sets it), else the legacy default stream.
extern thread_local constinit cudaStream_t tl_stream;

// This thread's handle on `device` (make_blas_handle: fp32 products in true fp32, bf16 on tensor
// cores), on the thread's current stream.
cublasHandle_t blas_handle(int device);

// Scratch of the calling thread on `device` that grows to the largest request and is kept while the
// thread lives: muon_units runs once per chunk on each compute stream's thread, and a cudaMalloc /
// cudaFree pair per call would synchronize the device every time (cudaFree waits for all of its
// work, NCCL's included). Two slots: Newton–Schulz's work (NsWork, muon_units) and the small tables
// and work of the other calls (pack, qk_clip_rows, first_non_finite, gram_newton_schulz), which
// never nest with each other or with muon_units on one thread. Valid until the thread's next
// request for the same slot. Kernels are stream-ordered, so a slot is safe to reuse on the stream
// that last used it, and the engine keeps each slot to one stream per thread: a thread that runs
// compute jobs on a compute stream's cudaStream_t (a stream that is not threaded runs them on its
// caller's thread) uses the NS slot only there (the engine calls muon_units / muon_batch only in
// compute jobs), the aux slot only for its own calls on its current stream outside the jobs. A
// caller that uses a slot from two streams (the bench runs everything on one) orders the second
// after the first.
enum ScratchSlot { kNsScratch = 0, kAuxScratch = 1 };
std::byte* thread_scratch(int device, size_t bytes, ScratchSlot slot);

// A host table to device memory on the thread's stream, through its pinned upload ring (no host
// wait); `src` may be reused when it returns.
void thread_upload(int device, void* dst, const void* src, size_t bytes);

// Device bytes to host memory on the thread's stream, through the thread's pinned read-back buffer
// (a copy into pageable memory is staged by CUDA and waits on its own): one host wait.
void thread_download(int device, void* dst, const void* src, size_t bytes);

}  // namespace meshmuon::detail
