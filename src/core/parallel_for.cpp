// The worker pool behind parallel_for (parallel_for.h): jobs wait in a queue until enough workers
// joined them; every participant claims indices from the job's atomic counter.
#include "core/parallel_for.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

namespace meshmuon::detail {
namespace {

constexpr int kMaxWorkers = 255;

struct Job {
  int64_t count = 0;
  const std::function<void(int64_t)>* fn = nullptr;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;  // the first one; written under `error_mutex`
  std::mutex error_mutex;
  int helpers_wanted = 0;    // workers still to join (pool mutex)
  int active = 0;            // workers inside run_indices (pool mutex)
};

void run_indices(Job& job) {
  for (int64_t i = job.next.fetch_add(1); i < job.count; i = job.next.fetch_add(1)) {
    if (job.failed.load(std::memory_order_relaxed)) continue;  // skip what is left after a throw
    try {
      (*job.fn)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
      job.failed.store(true);
    }
  }
}

class Pool {
 public:
  void run(int64_t count, int threads, const std::function<void(int64_t)>& fn) {
    Job job;
    job.count = count;
    job.fn = &fn;
    job.helpers_wanted = static_cast<int>(std::min<int64_t>(std::min(threads, kMaxWorkers + 1), count)) - 1;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (workers_ < job.helpers_wanted) {
        std::thread([this] { work(); }).detach();
        ++workers_;
      }
      queue_.push_back(&job);
    }
    work_cv_.notify_all();
    run_indices(job);
    {  // every index is claimed: take the job off the queue, wait for the workers still inside it
      std::unique_lock<std::mutex> lock(mutex_);
      const auto it = std::find(queue_.begin(), queue_.end(), &job);
      if (it != queue_.end()) queue_.erase(it);
      done_cv_.wait(lock, [&] { return job.active == 0; });
    }
    if (job.error) std::rethrow_exception(job.error);
  }

  int workers() {
    std::lock_guard<std::mutex> lock(mutex_);
    return workers_;
  }

 private:
  void work() {
    for (;;) {
      Job* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_cv_.wait(lock, [&] { return !queue_.empty(); });
        job = queue_.front();
        if (--job->helpers_wanted <= 0) queue_.pop_front();
        ++job->active;
      }
      run_indices(*job);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --job->active;
      }
      done_cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job*> queue_;
  int workers_ = 0;
};

// Never destroyed: detached workers wait on it until the process ends. A forked child has none of
// the parent's workers (and perhaps a mutex held by one), so it starts a new pool.
std::atomic<Pool*> g_pool{nullptr};
std::once_flag g_pool_once;

void reset_pool_in_child() { g_pool.store(new Pool); }

Pool& pool() {
  std::call_once(g_pool_once, [] {
    g_pool.store(new Pool);
    pthread_atfork(nullptr, nullptr, reset_pool_in_child);
  });
  return *g_pool.load();
}

}  // namespace

void parallel_for(int64_t count, int threads, const std::function<void(int64_t)>& fn) {
  if (count <= 0) return;
  if (threads <= 1 || count == 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  pool().run(count, threads, fn);
}

int parallel_pool_workers() { return pool().workers(); }

}  // namespace meshmuon::detail
