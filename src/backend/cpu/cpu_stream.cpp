// Internal: the cpu backend's stream: an ordered queue run by one worker thread (the compute thread
// of a step), or by the caller's thread at submit when not threaded.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "backend/cpu/shared/cpu_backend.h"

namespace meshmuon::detail {
namespace {

using Clock = std::chrono::steady_clock;

class CpuStream final : public Stream {
 public:
  explicit CpuStream(bool threaded) : threaded_(threaded) {
    if (threaded_) thread_ = std::thread([this] { loop(); });
  }
  ~CpuStream() override {
    if (!threaded_) return;
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(std::function<void()> job, Fence after = {}) override {
    (void)after;  // the cpu backend's fences are empty: what came before is in memory
    if (!threaded_) {
      if (!error_) run(job);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(m_);
      jobs_.push_back(std::move(job));
      busy_ = true;
    }
    cv_.notify_all();
  }
  Event record() override {
    auto done = std::make_shared<std::atomic<bool>>(false);
    submit([done] { done->store(true, std::memory_order_release); });
    return Event(done);
  }
  bool busy() override {
    std::lock_guard<std::mutex> lk(m_);
    return busy_;
  }
  void synchronize() override {
    std::unique_lock<std::mutex> lk(m_);
    idle_.wait(lk, [&] { return !busy_; });
    if (error_) std::rethrow_exception(error_);
  }
  void rethrow() override {
    std::lock_guard<std::mutex> lk(m_);
    if (error_) std::rethrow_exception(error_);
  }
  double busy_seconds() const override { return seconds_.load(); }

 private:
  void run(const std::function<void()>& job) {
    const auto t = Clock::now();
    try {
      job();
    } catch (...) {
      std::lock_guard<std::mutex> lk(m_);
      if (!error_) error_ = std::current_exception();
    }
    seconds_.store(seconds_.load() + std::chrono::duration<double>(Clock::now() - t).count());
  }
  void loop() {
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      const bool failed = static_cast<bool>(error_);
      lk.unlock();
      if (!failed) run(job);  // after a failure the queue drains without running (events stay unset)
      lk.lock();
      busy_ = !jobs_.empty();
      if (!busy_) idle_.notify_all();
    }
  }
  bool threaded_;
  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_, idle_;
  std::deque<std::function<void()>> jobs_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::atomic<double> seconds_{0};
};

}  // namespace

std::unique_ptr<Stream> make_cpu_stream(bool threaded) { return std::make_unique<CpuStream>(threaded); }

}  // namespace meshmuon::detail
