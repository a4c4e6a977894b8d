// The Communicator over its Transport (meshmuon/comm_transport.h): posting a validated operation,
// the broken-after-timeout state a root shares with its splits, split's agreement, order_after, and
// make_communicator. The same for every backend; the transports only move data.
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend/memory_space.h"
#include "comm/work_impl.h"
#include "meshmuon/comm_transport.h"
#include "meshmuon/error.h"

namespace meshmuon {

TransportOp::~TransportOp() = default;
Transport::~Transport() = default;
void Transport::order_after(void* event) { detail::wait_on_host({event}, backend()); }

Communicator::Communicator(std::shared_ptr<Transport> transport, std::shared_ptr<detail::CommRoot> root, int rank,
                           int size, std::string name)
    : transport_(std::move(transport)),
      root_(std::move(root)),
      rank_(rank),
      size_(size),
      name_(std::move(name)),
      default_timeout_(detail::default_timeout_from_env()) {}

Communicator::~Communicator() = default;

std::string_view Communicator::backend() const { return root_->backend; }
bool Communicator::device_buffers() const { return transport_->device_buffers(); }

Work Communicator::post(std::string_view op, std::string_view label,
                        const std::function<std::unique_ptr<TransportOp>()>& call) {
  MESHMUON_CHECK_RUNTIME(!root_->broken && transport_->usable(), "[", root_->backend, "] rank ", root_->world_rank,
                      ": cannot post ", op, " '", label, "' on communicator '", name_,
                      "': an earlier collective timed out and communication is unusable; end the job "
                      "(meshmuon::abort_all)");
  detail::WorkInfo info{root_->backend, op, std::string(label), name_, root_->world_rank, rank_, size_, default_timeout_};
  std::unique_ptr<TransportOp> handle;
  try {
    handle = call();
  } catch (const Error&) {
    throw;
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {
    detail::throw_error(detail::concat("[", root_->backend, "] rank ", root_->world_rank, ": posting ", op, " '", label,
                                       "' on communicator '", name_, "' failed: ", e.what()));
  }
  return Work(std::make_unique<detail::WorkImpl>(std::move(info), root_, transport_, std::move(handle)));
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, std::string_view name) {
  check_no_group("split", name);
  std::string n = name.empty() ? detail::concat(name_, "/", color) : std::string(name);
  color = color < 0 ? -1 : color;
  // pass 1: all-gather (color, key) under the deadline, so a missing rank is a timeout error
  // naming "split", never a hang in the transport's blocking group creation of pass 2.
  const int mine[2] = {color, key};
  std::vector<int> all(2 * static_cast<size_t>(size_));
  const std::vector<int64_t> counts(static_cast<size_t>(size_), 2);
  const std::vector<int64_t> displs = packed_displs(counts);
  post("split", n, [&] {
    return transport_->all_gather_v(InBuffer(mine, CommType::I32, 2), OutBuffer(all.data(), CommType::I32, all.size()),
                                    counts, displs);
  }).wait();
  std::vector<int> colors(static_cast<size_t>(size_)), keys(static_cast<size_t>(size_));
  for (size_t i = 0; i < colors.size(); ++i) colors[i] = all[2 * i], keys[i] = all[2 * i + 1];
  // the new rank and size, as MPI_Comm_split orders them: by (key, rank) within a color
  int new_rank = 0, new_size = 0;
  for (int j = 0; j < size_; ++j) {
    const auto u = static_cast<size_t>(j);
    if (color < 0 || colors[u] != color) continue;
    new_size += 1;
    if (keys[u] < key || (keys[u] == key && j < rank_)) new_rank += 1;
  }
  // pass 2: the transport's own group (every rank calls it: group creation may be collective)
  std::shared_ptr<Transport> sub;
  try {
    sub = transport_->split(colors, keys, n);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    detail::throw_error(detail::concat("[", root_->backend, "] rank ", root_->world_rank, ": split '", n,
                                       "' of communicator '", name_, "' failed: ", e.what()));
  }
  if (color < 0) return nullptr;
  MESHMUON_CHECK_RUNTIME(sub != nullptr, "[", root_->backend, "] rank ", root_->world_rank, ": split '", n,
                      "': the transport returned no group for color ", color);
  auto out = std::make_unique<Communicator>(std::move(sub), root_, new_rank, new_size, std::move(n));
  out->set_default_timeout(default_timeout_);
  return out;
}

void Communicator::order_after(DeviceEvent ready) {
  if (ready.empty()) return;
  MESHMUON_CHECK_RUNTIME(!root_->broken, "[", root_->backend, "] rank ", root_->world_rank, ": cannot order communicator '",
                      name_, "' after device work: an earlier collective timed out and communication is unusable; "
                      "end the job (meshmuon::abort_all)");
  try {
    transport_->order_after(ready.handle);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    detail::throw_error(detail::concat("[", root_->backend, "] rank ", root_->world_rank, ": ordering communicator '",
                                       name_, "' after device work failed: ", e.what()));
  }
}

std::unique_ptr<Communicator> make_communicator(std::shared_ptr<Transport> transport, int rank, int size, std::string name,
                                                int world_rank) {
  MESHMUON_CHECK(transport != nullptr, "[comm] make_communicator: the transport is null");
  MESHMUON_CHECK(size > 0 && rank >= 0 && rank < size, "[comm] make_communicator: rank ", rank, " is not in [0, ", size, ")");
  auto root = std::make_shared<detail::CommRoot>();
  root->backend = std::string(transport->backend());
  MESHMUON_CHECK(!root->backend.empty(), "[comm] make_communicator: the transport names no backend");
  root->world_rank = world_rank >= 0 ? world_rank : rank;
  return std::make_unique<Communicator>(std::move(transport), std::move(root), rank, size, std::move(name));
}

}  // namespace meshmuon
