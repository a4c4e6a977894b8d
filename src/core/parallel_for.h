// Internal: a process-wide pool of worker threads and the one loop that uses it. meshmuon's CPU products
// (backend/cpu/kernels/products.h) split their work into pieces whose shapes never depend on the thread
// count, and hand the pieces to parallel_for; which thread runs a piece is then irrelevant to the
// result, so every thread count gives the same bits.
#pragma once

#include <cstdint>
#include <functional>

namespace meshmuon::detail {

// Runs fn(i) for every i in [0, count), on up to `threads` threads: the calling thread and
// threads - 1 workers of the pool (started on first need, kept for later calls). Returns when every
// index has run. The first exception an index throws is rethrown here after the others finished or
// were skipped (indices not yet started are skipped once one has thrown).
// Thread-safe: several threads may call at once (each call's indices run on its caller and on
// whichever workers are free; the caller always takes part, so a call never waits for a busy pool).
// After fork(), the child starts with an empty pool.
void parallel_for(int64_t count, int threads, const std::function<void(int64_t)>& fn);

// Workers the pool has started so far (tests).
int parallel_pool_workers();

}  // namespace meshmuon::detail
