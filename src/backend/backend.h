// Internal: the device seam. A Backend is one device's two interfaces together: the DEVICE INTERFACE
// (device_services.h: memory, copies, streams, fences; what communicators, memory spaces and the state
// store depend on) and the KERNEL INTERFACE (kernels.h: the update kernels, FSDP data movement,
// orthogonalization and thread control; what the optimizer step calls). Backends are found by name
// through the registry (registry.h); the executor and LocalOptimizer call only these interfaces.
// Implementations: `cpu` (cpu/: OpenBLAS, oneDNN), `cuda` (cuda/: cuBLAS and meshmuon's kernels; a
// build without CUDA compiles no_cuda.cpp instead, which registers why it is missing).
// docs/architecture.md "How to add a backend" lists the files a new one touches.
//
// Contract: pointers passed to a kernel are the backend's device memory (host memory for cpu).
// Kernels run on the calling thread (cpu) unless submitted to a Stream. Numerics are those of the
// kernels in update.h / orthogonalize.h; for a given backend the results do not depend on the
// stream, the thread or the thread count (the basis of bitwise layout invariance).
// Completion: a device backend's kernels (momentum, apply_update, adamw and their _multi forms, qk_clip_rows,
// round_to_comm, pack, zero, muon_units, gram_newton_schulz) are ordered on the calling thread's
// stream and may still run when they return: later calls on the same thread see their results,
// anything else (a communicator, another Stream, the host, a state hook, the caller after a step)
// only after the thread's synchronize(), or on the device after a wait for its fence(). copy,
// first_non_finite(_of) and the FSDP data movement (convert, ordered_sum, divide, fill_zero)
// complete before returning. A Stream's job ends with its work complete (its Events mean the
// results are in memory) unless the stream was made JobEnd::Queued. On the cpu backend everything
// completes before returning.
// Device order without the host: fence() records a point in a stream's work and wait() makes another
// stream (or, through Communicator::order_after, a communicator) wait for it on the device; the
// pipeline hands a chunk's arena to the communicators and to the compute stream, and the compute
// stream's results back, this way.
#pragma once

#include <memory>

#include "backend/device_services.h"
#include "backend/kernels.h"

namespace meshmuon::detail {

// Both sides at once (the fields of DeviceCaps and KernelCaps), as the executor reads them.
struct BackendCaps : DeviceCaps, KernelCaps {};

// A backend: the device interface and the kernel interface of one device, made by the factory its
// registry entry names (registry.h). Components that only move memory take a DeviceServices&.
class Backend : public DeviceServices, public Kernels {
 public:
  BackendCaps capabilities() const {
    BackendCaps c;
    static_cast<DeviceCaps&>(c) = device_caps();
    static_cast<KernelCaps&>(c) = kernel_caps();
    return c;
  }
};

std::shared_ptr<Backend> make_cpu_backend();

}  // namespace meshmuon::detail
