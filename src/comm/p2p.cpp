// Communicator, point-to-point part: send / recv validation, groups (collected here, posted by the
// transport at group_end), and their byte counting. Transports only post (Transport::p2p).
#include <algorithm>
#include <vector>

#include "comm/work_impl.h"
#include "meshmuon/comm_transport.h"
#include "meshmuon/comm.h"
#include "meshmuon/error.h"

namespace meshmuon {
namespace {

// A recv buffer may not overlap any other buffer of its group (sends may share memory with each
// other). Sweep over the non-empty buffers sorted by start: O(n log n) for world-sized groups.
void check_group_overlap(std::span<const P2pOp> ops, std::string_view label) {
  struct Span {
    const std::byte* begin;
    const std::byte* end;
    size_t index;
  };
  std::vector<Span> spans;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto* b = static_cast<const std::byte*>(ops[i].buf.data);
    if (ops[i].buf.count > 0) spans.push_back({b, b + ops[i].buf.nbytes(), i});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  const std::byte *send_end = nullptr, *recv_end = nullptr;
  size_t last_send = 0, last_recv = 0;
  for (const Span& s : spans) {
    const bool is_send = ops[s.index].is_send;
    const bool hits_recv = recv_end != nullptr && s.begin < recv_end;
    const bool hits_send = !is_send && send_end != nullptr && s.begin < send_end;
    MESHMUON_CHECK(!hits_recv && !hits_send, "[comm] group '", label, "': the buffer of op ", s.index, " (",
                is_send ? "send" : "recv", " with peer ", ops[s.index].peer, ") overlaps that of op ",
                hits_recv ? last_recv : last_send, "; a recv buffer must not share memory with any other op of its group");
    if (is_send && (send_end == nullptr || s.end > send_end)) send_end = s.end, last_send = s.index;
    if (!is_send && (recv_end == nullptr || s.end > recv_end)) recv_end = s.end, last_recv = s.index;
  }
}

}  // namespace

ByteCount comm_bytes_send(int rank, int peer, int64_t count, size_t elem_size) {
  return {peer == rank ? 0 : static_cast<uint64_t>(count) * elem_size, 0};
}

ByteCount comm_bytes_recv(int rank, int peer, int64_t count, size_t elem_size) {
  return {0, peer == rank ? 0 : static_cast<uint64_t>(count) * elem_size};
}

void Communicator::check_no_group(std::string_view op, std::string_view label) const {
  MESHMUON_CHECK(!group_open_, "[comm] ", op, " '", label, "' called on communicator '", name_,
              "' inside an open group; only send and recv may be grouped: call group_end first");
}

Work Communicator::send(InBuffer buf, int peer, std::string_view label) {
  return p2p(P2pOp{true, peer, buf}, label);
}

Work Communicator::recv(OutBuffer buf, int peer, std::string_view label) {
  return p2p(P2pOp{false, peer, buf.as_input()}, label);
}

Work Communicator::p2p(P2pOp op, std::string_view label) {
  const std::string_view name = op.is_send ? "send" : "recv";
  MESHMUON_CHECK(op.peer >= 0 && op.peer < size_, "[comm] ", name, " '", label, "': peer ", op.peer,
              " is not a rank of communicator '", name_, "' (size ", size_, ")");
  MESHMUON_CHECK(op.buf.data != nullptr || op.buf.count == 0, "[comm] ", name, " '", label, "': buffer has ",
              op.buf.count, " elements but a null pointer; pass a buffer or a count of 0");
  if (group_open_) {
    group_.push_back(op);
    return Work();
  }
  Work work = post(name, label, [&] { return transport_->p2p(std::span(&op, 1)); });
  const size_t elem = comm_type_size(op.buf.type);
  const auto n = static_cast<int64_t>(op.buf.count);
  count(op.is_send ? comm_bytes_send(rank_, op.peer, n, elem) : comm_bytes_recv(rank_, op.peer, n, elem));
  return work;
}

void Communicator::group_begin() {
  MESHMUON_CHECK(!group_open_, "[comm] group_begin on communicator '", name_,
              "': a group is already open; groups do not nest (call group_end first)");
  group_open_ = true;
  group_.clear();
}

Work Communicator::group_end(std::string_view label) {
  MESHMUON_CHECK(group_open_, "[comm] group_end '", label, "' on communicator '", name_,
              "' without group_begin");
  // The group closes whatever happens below: a failed group cannot be retried piecemeal.
  std::vector<P2pOp> ops = std::move(group_);
  group_.clear();
  group_open_ = false;
  check_group_overlap(ops, label);
  ByteCount bytes;
  for (const P2pOp& op : ops) {
    const size_t elem = comm_type_size(op.buf.type);
    const auto n = static_cast<int64_t>(op.buf.count);
    const ByteCount b = op.is_send ? comm_bytes_send(rank_, op.peer, n, elem) : comm_bytes_recv(rank_, op.peer, n, elem);
    bytes.sent += b.sent;
    bytes.recv += b.recv;
  }
  Work work = ops.empty() ? Work() : post("group", label, [&] { return transport_->p2p(ops); });
  count(bytes);
  return work;
}

}  // namespace meshmuon
