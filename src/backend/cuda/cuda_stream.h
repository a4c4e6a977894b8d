// Internal: the cuda backend's stream (Backend::make_stream): host jobs in order on the cpu stream's
// worker, each running with the stream's own cudaStream_t current on its thread.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace meshmuon::detail {

// A CudaStream on `device`: its host jobs run in order (on a worker thread when `threaded`, else on
// the caller's thread) with its cudaStream_t as the thread's current stream (tl_stream,
// thread_resources.h). JobEnd::Complete: it synchronizes that stream when each job ends, so its
// Events (the cpu stream's) mean the jobs' device work is in memory. JobEnd::Queued: a job ends once
// its work is queued, between two timing events (the stream's busy_seconds is device time); readers
// of its results wait for a fence the job records.
std::unique_ptr<Stream> make_cuda_stream(int device, bool threaded, JobEnd end);

}  // namespace meshmuon::detail
