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

namespace dmuon::cuda_emu {
namespace {

struct Queue {
  std::mutex run;                          // held while ops of this queue run (keeps their order)
  std::deque<std::function<bool()>> ops;   // guarded by the global mutex
  uint64_t submitted = 0, executed = 0;    // guarded by the global mutex
};

struct State {
  std::mutex mu;
  std::map<const void*, std::shared_ptr<Queue>> queues;
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

// Runs queued ops of `key` until `until` ops have run (or the queue is empty).
void run_until(const void* key, uint64_t until) {
  State& s = state();
  std::shared_ptr<Queue> q = s.get(key);
  std::lock_guard<std::mutex> running(q->run);
  for (;;) {
    std::function<bool()> op;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (q->ops.empty() || q->executed >= until) return;
      op = std::move(q->ops.front());
      q->ops.pop_front();
    }
    if (!op()) fault();
    std::lock_guard<std::mutex> lock(s.mu);
    ++q->executed;
  }
}

}  // namespace

bool deferred() {
  static const bool on = [] {
    const char* env = std::getenv("DMUON_CUDA_EMU_DEFERRED");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return on;
}

const void* queue_key(const void* stream) {
  if (stream == cudaStreamLegacy || stream == cudaStreamPerThread) return nullptr;
  return stream;
}

Mark submit_marked(const void* stream, std::function<bool()> op) {
  const void* key = queue_key(stream);
  State& s = state();
  std::shared_ptr<Queue> q = s.get(key);
  if (!deferred()) {
    if (!op()) fault();
    return {key, 0};  // nothing is ever pending
  }
  std::lock_guard<std::mutex> lock(s.mu);
  q->ops.push_back(std::move(op));
  ++q->submitted;
  return {key, q->submitted};
}

void submit(const void* stream, std::function<bool()> op) { (void)submit_marked(stream, std::move(op)); }

void drain(const void* stream) { run_until(queue_key(stream), UINT64_MAX); }

void drain_all() {
  std::vector<const void*> keys;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    for (const auto& [k, q] : state().queues) keys.push_back(k);
  }
  for (auto k = keys.rbegin(); k != keys.rend(); ++k) run_until(*k, UINT64_MAX);  // legacy (nullptr) last
}

Mark mark(const void* stream) {
  const void* key = queue_key(stream);
  std::shared_ptr<Queue> q = state().get(key);
  std::lock_guard<std::mutex> lock(state().mu);
  return {key, q->submitted};
}

bool reached(const Mark& m) {
  std::shared_ptr<Queue> q = state().get(m.key);
  std::lock_guard<std::mutex> lock(state().mu);
  return q->executed >= m.seq;
}

void drain_to(const Mark& m) { run_until(m.key, m.seq); }

int sticky_error() { return state().sticky.load(); }

}  // namespace dmuon::cuda_emu
