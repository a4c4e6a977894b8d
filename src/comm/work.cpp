// Work: the handle of one posted operation; the wait loop with its deadline lives here, shared by
// every transport, so every backend times out and words the error the same way.
#include <fmt/format.h>

#include <thread>

#include "comm/poll.h"
#include "comm/work_impl.h"
#include "meshmuon/error.h"

namespace meshmuon {
namespace detail {
namespace {

std::string timeout_message(const WorkInfo& w, std::chrono::milliseconds waited) {
  const bool p2p = w.op == "send" || w.op == "recv" || w.op == "group";
  return fmt::format(
      "[{}] rank {}: {} '{}' timed out after {:g} s on communicator '{}' (rank {} of {}); a peer "
      "died or did not post {}; communication is now unusable: end the job (meshmuon::abort_all)",
      w.backend, w.world_rank, w.op, w.label, static_cast<double>(waited.count()) / 1000.0, w.comm_name,
      w.comm_rank, w.comm_size, p2p ? "the matching send or recv" : "this collective");
}

}  // namespace

WorkImpl::WorkImpl(WorkInfo info, std::shared_ptr<CommRoot> root, std::shared_ptr<Transport> transport,
                   std::unique_ptr<TransportOp> op)
    : info_(std::move(info)), root_(std::move(root)), transport_(std::move(transport)), op_(std::move(op)) {
  done = op_ == nullptr;  // the transport finished it during the call
}

WorkImpl::~WorkImpl() {
  // An op the transport may still write through (after a timeout) is leaked, like an MPI request.
  if (!done && op_ && root_->broken) (void)op_.release();
}

bool WorkImpl::poll() {
  if (!op_) return true;
  bool complete = false;
  try {
    complete = op_->test();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw_error(concat("[", info_.backend, "] rank ", info_.world_rank, ": ", info_.op, " '", info_.label,
                       "' failed on communicator '", info_.comm_name, "' (rank ", info_.comm_rank, " of ",
                       info_.comm_size, "): ", e.what()));
  }
  if (complete) op_.reset();  // let go of the transport's state (tensors, handles) now
  return complete;
}

void WorkImpl::on_timeout() {
  const bool breaks = !op_ || op_->on_timeout();
  if (breaks && !root_->broken) {
    root_->broken = true;
    if (transport_) transport_->on_timeout();
  }
}

bool WorkImpl::destructor_may_wait() const {
  return !root_->broken && (!transport_ || transport_->usable()) && (!op_ || op_->destructor_may_wait());
}

bool WorkImpl::abandon() {
  if (!op_ || !op_->abandon()) return false;
  op_.reset();
  return true;
}

}  // namespace detail

Work::Work() = default;
Work::Work(std::unique_ptr<detail::WorkImpl> impl) : impl_(std::move(impl)) {}
Work::Work(Work&&) noexcept = default;

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    Work old(std::move(*this));  // finishes (or abandons) what this handle held
    impl_ = std::move(other.impl_);
  }
  return *this;
}

Work::~Work() {
  if (!impl_ || impl_->done) return;
  if (impl_->destructor_may_wait()) {
    try {
      wait();
      return;
    } catch (...) {
      // Destructors never throw; the timeout already marked the process broken.
    }
  }
  if (impl_->abandon()) return;  // the backend let go of the buffers (single backend's unmatched p2p)
  // The backend may still read or write through this state (MPI requests cannot be freed while a
  // collective is active): leak it on purpose. The job is going to be aborted.
  (void)impl_.release();
}

bool Work::completed() const { return !impl_ || impl_->done; }
std::string_view Work::op() const { return impl_ ? impl_->info().op : std::string_view{}; }
std::string_view Work::label() const { return impl_ ? std::string_view(impl_->info().label) : std::string_view{}; }

bool Work::test() {
  if (!impl_ || impl_->done) return true;
  impl_->done = impl_->poll();
  return impl_->done;
}

void Work::wait() {
  if (!impl_ || impl_->done) return;
  wait(impl_->info().default_timeout);
}

void Work::wait(std::chrono::milliseconds timeout) {
  if (!impl_ || impl_->done) return;
  wait_until(CommClock::now() + timeout, timeout);
}

void Work::wait(Deadline deadline) {
  if (!impl_ || impl_->done) return;
  wait_until(deadline, std::chrono::round<std::chrono::milliseconds>(deadline - CommClock::now()));
}

void Work::wait_until(Deadline deadline, std::chrono::milliseconds budget) {
  detail::PollBackoff backoff;  // spin, yield, then short sleeps (poll.h)
  while (!test()) {
    if (CommClock::now() >= deadline) {
      impl_->on_timeout();
      detail::throw_error(detail::timeout_message(impl_->info(), std::max(budget, std::chrono::milliseconds(0))));
    }
    backoff.idle(deadline);
  }
}

}  // namespace meshmuon
