// Test infrastructure: the emulated GPU's streams (tests/cuda_emu, README.md there).
//
// Two modes. Immediate (MESHMUON_CUDA_EMU_DEFERRED=0): every operation runs at once on the calling
// thread. Deferred (the default): operations on a stream are queued and run only when the host
// synchronizes with them: cudaStreamSynchronize, cudaEventSynchronize / cudaEventQuery up to the
// event, cudaDeviceSynchronize, a synchronous copy on the legacy stream, a copy into pageable host
// memory, cudaFree / cudaFreeHost / cudaStreamDestroy. Code that reads a result (or reuses a
// buffer) without the synchronization CUDA requires sees the memory as it was, and a stream that
// uses another's results without waiting for them reads stale data: the tests' bitwise comparisons
// then fail, deterministically. A fault found while a queued operation runs is sticky, as on a
// GPU: every later synchronization returns cudaErrorIllegalAddress.
#pragma once

#include <cstdint>
#include <functional>

namespace meshmuon::cuda_emu {

bool deferred();  // the mode, read once from MESHMUON_CUDA_EMU_DEFERRED

// nullptr, cudaStreamLegacy and cudaStreamPerThread name the legacy stream of the calling thread's
// current device (one per device, as CUDA's).
// A stream's device (cudaStreamCreate tells it; the legacy queues know theirs).
void set_queue_device(const void* stream, int device);

// Runs `op` on `stream` (at once, or queued in the deferred mode). `op` returns false when it
// faulted (it reported what on stderr); that makes the sticky error.
void submit(const void* stream, std::function<bool()> op);
// An op that may have to wait for something outside its stream (a peer of an emulated NCCL
// collective): Blocked leaves it at the head of its queue, to be run again. A blocking wait
// (stream / event / device synchronization) retries it until it is Done; a query stops there.
enum class OpStatus { Done, Fault, Blocked };
void submit_op(const void* stream, std::function<OpStatus()> op);

// Runs everything queued on `stream` so far; on every stream of `device` (cudaDeviceSynchronize,
// cudaFree), the legacy one last, so work another stream does without waiting for the legacy
// stream's runs first, as it may on a GPU.
void drain(const void* stream);
void drain_device(int device);
// A point in a stream's queue (what an event records) and running the queue up to it.
struct Mark {
  const void* key = nullptr;
  uint64_t seq = 0;  // the op count the stream had submitted
};
// submit, and the mark just after `op`, in one step (no other thread's op slips in between).
Mark submit_marked(const void* stream, std::function<bool()> op);
bool reached(const Mark& m);  // every op before the mark has run
void drain_to(const Mark& m);
// Runs the queue up to the mark without waiting on a Blocked op: true when the mark is reached.
bool try_drain_to(const Mark& m);
// What a stream waiting for an event (cudaStreamWaitEvent) does when its wait comes up: runs the
// event's queue up to the mark if no other thread is running it, without waiting on a Blocked op
// there (a GPU runs the other stream on its own). True when the mark is reached.
bool advance_to(const Mark& m);
// cudaErrorIllegalAddress (as an int) once a queued op faulted, else 0.
int sticky_error();

}  // namespace meshmuon::cuda_emu
