// The emulated GPU's streams (streams.h).
#include "streams.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#include <chrono>

namespace meshmuon::cuda_emu {
namespace {

struct Queue {
  std::mutex run;                              // held while ops of this queue run (keeps their order)
  std::deque<std::function<OpStatus()>> ops;   // guarded by the global mutex
  uint64_t submitted = 0, executed = 0;    // guarded by the global mutex
};

struct State {
  std::mutex mu;
  std::map<const void*, std::shared_ptr<Queue>> queues;
  std::map<const void*, int> devices;  // each queue's device (guarded by mu)
  std::atomic<int> sticky{0};
  std::shared_ptr<Queue> get(const void* key) {
    std::lock_guard<std::mutex> lock(mu);
    auto& q = queues[key];
    if (!q) q = std::make_shared<Queue>();
    return q;
  }
};

State& state() {
  static State* s = new State;  // never destroyed: threads may still sync at exit
  return *s;
}

void fault() { state().sticky.store(static_cast<int>(cudaErrorIllegalAddress)); }

enum class Run { Reached, Blocked, Busy };  // Busy: another thread is running that queue

void help_others(const void* except);

// Runs queued ops of `key` until `until` ops have run (or the queue is empty). A Blocked op stays
// at the head. With `wait` it is retried, and between tries this thread runs the other queues as
// far as they go without waiting (a GPU runs every stream on its own: a collective's peer op may
// sit on a stream nobody synchronizes yet); without `wait` this returns Blocked. `try_only`: a
// queue another thread is running is left alone (Busy).
Run run_until(const void* key, uint64_t until, bool wait = true, bool try_only = false) {
  State& s = state();
  std::shared_ptr<Queue> q = s.get(key);
  std::unique_lock<std::mutex> running(q->run, std::defer_lock);
  if (try_only) {
    if (!running.try_lock()) return Run::Busy;
  } else {
    running.lock();
  }
  for (;;) {
    std::function<OpStatus()> op;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (q->ops.empty() || q->executed >= until) return Run::Reached;
      op = std::move(q->ops.front());
      q->ops.pop_front();
    }
    const OpStatus st = op();
    if (st == OpStatus::Blocked) {
      {
        std::lock_guard<std::mutex> lock(s.mu);
        q->ops.push_front(std::move(op));
      }
      if (!wait) return Run::Blocked;
      running.unlock();
      help_others(key);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      running.lock();
      continue;
    }
    if (st == OpStatus::Fault) fault();
    std::lock_guard<std::mutex> lock(s.mu);
    ++q->executed;
  }
}

// The queues (of `device`; -1: all), the legacy ones last when walked in reverse.
std::vector<const void*> keys(int device = -1) {
  std::vector<const void*> out;
  std::lock_guard<std::mutex> lock(state().mu);
  for (const auto& [k, q] : state().queues) {
    const auto d = state().devices.find(k);
    if (device < 0 || (d != state().devices.end() ? d->second : 0) == device) out.push_back(k);
  }
  return out;
}

constexpr uintptr_t kLegacyBase = 0x100;  // legacy queue of device d: kLegacyBase + d (no pointer)

void help_others(const void* except) {
  const std::vector<const void*> ks = keys();
  for (auto k = ks.rbegin(); k != ks.rend(); ++k)
    if (*k != except) (void)run_until(*k, UINT64_MAX, false, true);
}

}  // namespace

bool deferred() {
  static const bool on = [] {
    const char* env = std::getenv("MESHMUON_CUDA_EMU_DEFERRED");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return on;
}

namespace {
const void* queue_key(const void* stream) {
  if (stream != nullptr && stream != cudaStreamLegacy && stream != cudaStreamPerThread) return stream;
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) d = 0;
  const void* key = reinterpret_cast<const void*>(kLegacyBase + static_cast<uintptr_t>(d));
  std::lock_guard<std::mutex> lock(state().mu);
  state().devices[key] = d;
  return key;
}
}  // namespace

void set_queue_device(const void* stream, int device) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().devices[stream] = device;
}

namespace {
Mark enqueue(const void* stream, std::function<OpStatus()> op) {
  const void* key = queue_key(stream);
  State& s = state();
  std::shared_ptr<Queue> q = s.get(key);
  if (!deferred()) {  // at once: a Blocked op is retried until it is done
    OpStatus st;
    while ((st = op()) == OpStatus::Blocked) std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (st == OpStatus::Fault) fault();
    return {key, 0};  // nothing is ever pending
  }
  std::lock_guard<std::mutex> lock(s.mu);
  q->ops.push_back(std::move(op));
  ++q->submitted;
  return {key, q->submitted};
}
std::function<OpStatus()> plain(std::function<bool()> op) {
  return [op = std::move(op)] { return op() ? OpStatus::Done : OpStatus::Fault; };
}
}  // namespace

Mark submit_marked(const void* stream, std::function<bool()> op) { return enqueue(stream, plain(std::move(op))); }
void submit_op(const void* stream, std::function<OpStatus()> op) { (void)enqueue(stream, std::move(op)); }

void submit(const void* stream, std::function<bool()> op) { (void)submit_marked(stream, std::move(op)); }

void drain(const void* stream) { run_until(queue_key(stream), UINT64_MAX); }

void drain_device(int device) {
  // Every queue of the device until each is empty; a queue blocked on another is left and come
  // back to (the legacy one last in each round).
  for (;;) {
    bool all = true;
    const std::vector<const void*> ks = keys(device);
    for (auto k = ks.rbegin(); k != ks.rend(); ++k) all = run_until(*k, UINT64_MAX, false) == Run::Reached && all;
    if (all) return;
    help_others(nullptr);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

bool reached(const Mark& m) {
  std::shared_ptr<Queue> q = state().get(m.key);
  std::lock_guard<std::mutex> lock(state().mu);
  return q->executed >= m.seq;
}

void drain_to(const Mark& m) { run_until(m.key, m.seq); }
bool try_drain_to(const Mark& m) { return run_until(m.key, m.seq, false) == Run::Reached && reached(m); }

bool advance_to(const Mark& m) {
  if (reached(m)) return true;
  (void)run_until(m.key, m.seq, false, true);
  return reached(m);
}

int sticky_error() { return state().sticky.load(); }

}  // namespace meshmuon::cuda_emu
