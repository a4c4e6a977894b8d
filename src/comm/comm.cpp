// Communicator, collectives: argument validation (before anything is posted), byte counters,
// default timeout, sub-communicator helpers, backend selection. Transports only post
// (comm_transport.cpp hands them the validated calls).
#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <string>

#include "comm/staging.h"
#include "comm/work_impl.h"
#include "meshmuon/comm_transport.h"
#include "meshmuon/comm.h"
#include "meshmuon/comm_nccl.h"
#include "meshmuon/error.h"

namespace meshmuon {

std::chrono::milliseconds detail::default_timeout_from_env() {
  const char* env = std::getenv("MESHMUON_TIMEOUT_S");
  if (env == nullptr || *env == '\0') return std::chrono::milliseconds(300'000);
  char* end = nullptr;
  const double s = std::strtod(env, &end);
  MESHMUON_CHECK(end != env && *end == '\0' && s > 0 && s < 1e9, "[comm] MESHMUON_TIMEOUT_S='", env,
              "' is not a positive number of seconds; unset it for the default (300)");
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(s * 1000.0)));
}

namespace {

// Names the collective and label in every validation message.
struct Op {
  std::string_view op;
  std::string_view label;
};

std::string where(const Op& o) { return detail::concat("[comm] ", o.op, " '", o.label, "': "); }

void check_buffer(const Op& o, std::string_view what, const void* data, size_t count) {
  MESHMUON_CHECK(data != nullptr || count == 0, where(o), what, " has ", count,
              " elements but a null pointer; pass a buffer or a count of 0");
}

void check_same_type(const Op& o, CommType send, CommType recv) {
  MESHMUON_CHECK(send == recv, where(o), "send buffer is ", to_string(send), " but receive buffer is ",
              to_string(recv), "; both sides of a collective use one element type");
}

void check_no_overlap(const Op& o, const InBuffer& send, const OutBuffer& recv) {
  const auto* s = static_cast<const std::byte*>(send.data);
  const auto* r = static_cast<const std::byte*>(recv.data);
  const bool overlap = send.count > 0 && recv.count > 0 && s < r + recv.nbytes() && r < s + send.nbytes();
  MESHMUON_CHECK(!overlap, where(o), "send and receive buffers overlap; use separate buffers");
}

void check_counts(const Op& o, std::string_view what, std::span<const int64_t> counts, int size) {
  MESHMUON_CHECK(counts.size() == static_cast<size_t>(size), where(o), what, " has ", counts.size(),
              " entries; give one per rank (", size, ")");
  for (size_t j = 0; j < counts.size(); ++j) {
    MESHMUON_CHECK(counts[j] >= 0, where(o), what, "[", j, "] = ", counts[j], " is negative");
  }
}

// Block j (displ, count) must lie inside a buffer of `capacity` elements (written so as not to overflow).
void check_blocks(const Op& o, std::string_view what, size_t capacity, std::span<const int64_t> displs,
                  std::span<const int64_t> counts) {
  for (size_t j = 0; j < counts.size(); ++j) {
    const auto cap = static_cast<uint64_t>(capacity), c = static_cast<uint64_t>(counts[j]);
    MESHMUON_CHECK(c <= cap && static_cast<uint64_t>(displs[j]) <= cap - c, where(o), what, " block ", j,
                " (displacement ", displs[j], ", count ", counts[j], ") runs past the end of the ", capacity,
                "-element buffer");
  }
}

// Sum of non-negative counts, saturating at INT64_MAX (callers compare it with a buffer size).
int64_t total(std::span<const int64_t> counts) {
  int64_t sum = 0;
  for (int64_t c : counts) sum = c > INT64_MAX - sum ? INT64_MAX : sum + c;
  return sum;
}

}  // namespace

void Communicator::set_default_timeout(std::chrono::milliseconds timeout) {
  MESHMUON_CHECK(timeout.count() > 0, "[comm] default timeout must be positive (got ", timeout.count(), " ms)");
  default_timeout_ = timeout;
}

void Communicator::count(ByteCount b) {
  counters_.bytes_sent += b.sent;
  counters_.bytes_recv += b.recv;
  counters_.collectives += 1;
}

Work Communicator::all_to_all_v(InBuffer send, std::span<const int64_t> send_counts,
                                std::span<const int64_t> send_displs, OutBuffer recv,
                                std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                                std::string_view label) {
  check_no_group("all_to_all", label);
  const Op o{"all_to_all", label};
  check_same_type(o, send.type, recv.type);
  check_buffer(o, "send buffer", send.data, send.count);
  check_buffer(o, "receive buffer", recv.data, recv.count);
  check_counts(o, "send_counts", send_counts, size_);
  check_counts(o, "send_displs", send_displs, size_);
  check_counts(o, "recv_counts", recv_counts, size_);
  check_counts(o, "recv_displs", recv_displs, size_);
  check_blocks(o, "send", send.count, send_displs, send_counts);
  check_blocks(o, "receive", recv.count, recv_displs, recv_counts);
  const size_t r = static_cast<size_t>(rank_);
  MESHMUON_CHECK(send_counts[r] == recv_counts[r], where(o), "rank ", rank_, " sends itself ", send_counts[r],
              " elements but expects ", recv_counts[r], "; send_counts[rank] must equal recv_counts[rank]");
  check_no_overlap(o, send, recv);
  Work work = post("all_to_all", label, [&] {
    return transport_->all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs);
  });
  count(comm_bytes_all_to_all_v(rank_, send_counts, recv_counts, comm_type_size(send.type)));
  return work;
}

Work Communicator::all_to_all(InBuffer send, OutBuffer recv, std::string_view label) {
  check_no_group("all_to_all", label);
  const Op o{"all_to_all", label};
  MESHMUON_CHECK(send.count == recv.count && send.count % static_cast<size_t>(size_) == 0, where(o),
              "equal blocks need send and receive counts equal and divisible by the size ", size_, " (got ",
              send.count, " and ", recv.count, "); use all_to_all_v");
  const int64_t block = static_cast<int64_t>(send.count) / size_;
  const std::vector<int64_t> counts(static_cast<size_t>(size_), block);
  const std::vector<int64_t> displs = packed_displs(counts);
  return all_to_all_v(send, counts, displs, recv, counts, displs, label);
}

Work Communicator::all_gather_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts,
                                std::span<const int64_t> recv_displs, std::string_view label) {
  check_no_group("all_gather", label);
  const Op o{"all_gather", label};
  check_same_type(o, send.type, recv.type);
  check_buffer(o, "send buffer", send.data, send.count);
  check_buffer(o, "receive buffer", recv.data, recv.count);
  check_counts(o, "recv_counts", recv_counts, size_);
  check_counts(o, "recv_displs", recv_displs, size_);
  check_blocks(o, "receive", recv.count, recv_displs, recv_counts);
  MESHMUON_CHECK(static_cast<int64_t>(send.count) == recv_counts[static_cast<size_t>(rank_)], where(o), "rank ",
              rank_, " sends ", send.count, " elements but recv_counts[", rank_, "] = ",
              recv_counts[static_cast<size_t>(rank_)]);
  check_no_overlap(o, send, recv);
  Work work = post("all_gather", label, [&] { return transport_->all_gather_v(send, recv, recv_counts, recv_displs); });
  count(comm_bytes_all_gather_v(rank_, recv_counts, comm_type_size(send.type)));
  return work;
}

Work Communicator::all_gather_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts,
                                std::string_view label) {
  check_no_group("all_gather", label);
  check_counts(Op{"all_gather", label}, "recv_counts", recv_counts, size_);
  const std::vector<int64_t> displs = packed_displs(recv_counts);
  return all_gather_v(send, recv, recv_counts, displs, label);
}

Work Communicator::all_gather(InBuffer send, OutBuffer recv, std::string_view label) {
  check_no_group("all_gather", label);
  MESHMUON_CHECK(recv.count == send.count * static_cast<size_t>(size_), where(Op{"all_gather", label}),
              "equal blocks need a receive count of size x send count (", size_, " x ", send.count, "), got ",
              recv.count, "; use all_gather_v");
  const std::vector<int64_t> counts(static_cast<size_t>(size_), static_cast<int64_t>(send.count));
  return all_gather_v(send, recv, counts, label);
}

Work Communicator::reduce_scatter_v(InBuffer send, OutBuffer recv, std::span<const int64_t> recv_counts,
                                    ReduceOp op, std::string_view label) {
  check_no_group("reduce_scatter", label);
  const Op o{"reduce_scatter", label};
  check_same_type(o, send.type, recv.type);
  check_buffer(o, "send buffer", send.data, send.count);
  check_buffer(o, "receive buffer", recv.data, recv.count);
  check_counts(o, "recv_counts", recv_counts, size_);
  MESHMUON_CHECK(static_cast<int64_t>(send.count) == total(recv_counts), where(o), "send buffer has ", send.count,
              " elements but the blocks in recv_counts add up to ", total(recv_counts));
  MESHMUON_CHECK(static_cast<int64_t>(recv.count) >= recv_counts[static_cast<size_t>(rank_)], where(o),
              "receive buffer has ", recv.count, " elements, fewer than recv_counts[", rank_, "] = ",
              recv_counts[static_cast<size_t>(rank_)]);
  check_no_overlap(o, send, recv);
  Work work = post("reduce_scatter", label, [&] { return transport_->reduce_scatter_v(send, recv, recv_counts, op); });
  count(comm_bytes_reduce_scatter_v(rank_, recv_counts, comm_type_size(send.type)));
  return work;
}

Work Communicator::reduce_scatter(InBuffer send, OutBuffer recv, ReduceOp op, std::string_view label) {
  check_no_group("reduce_scatter", label);
  MESHMUON_CHECK(send.count == recv.count * static_cast<size_t>(size_), where(Op{"reduce_scatter", label}),
              "equal blocks need a send count of size x receive count (", size_, " x ", recv.count, "), got ",
              send.count, "; use reduce_scatter_v");
  const std::vector<int64_t> counts(static_cast<size_t>(size_), static_cast<int64_t>(recv.count));
  return reduce_scatter_v(send, recv, counts, op, label);
}

Work Communicator::all_reduce(InBuffer send, OutBuffer recv, ReduceOp op, std::string_view label) {
  check_no_group("all_reduce", label);
  const Op o{"all_reduce", label};
  check_same_type(o, send.type, recv.type);
  check_buffer(o, "send buffer", send.data, send.count);
  check_buffer(o, "receive buffer", recv.data, recv.count);
  MESHMUON_CHECK(send.count == recv.count, where(o), "send has ", send.count, " elements but receive has ",
              recv.count, "; they must match");
  if (send.data != recv.data) check_no_overlap(o, send, recv);
  Work work = post("all_reduce", label, [&] { return transport_->all_reduce(send, recv, op); });
  count(comm_bytes_all_reduce(rank_, size_, static_cast<int64_t>(send.count), comm_type_size(send.type)));
  return work;
}

Work Communicator::all_reduce(OutBuffer inout, ReduceOp op, std::string_view label) {
  return all_reduce(inout.as_input(), inout, op, label);
}

Work Communicator::broadcast(OutBuffer buf, int root, std::string_view label) {
  check_no_group("broadcast", label);
  const Op o{"broadcast", label};
  MESHMUON_CHECK(root >= 0 && root < size_, where(o), "root ", root, " is not a rank of this communicator (size ",
              size_, ")");
  check_buffer(o, "buffer", buf.data, buf.count);
  Work work = post("broadcast", label, [&] { return transport_->broadcast(buf, root); });
  count(comm_bytes_broadcast(rank_, size_, root, static_cast<int64_t>(buf.count), comm_type_size(buf.type)));
  return work;
}

Work Communicator::barrier(std::string_view label) {
  check_no_group("barrier", label);
  Work work = post("barrier", label, [&] { return transport_->barrier(); });
  count({});
  return work;
}

std::unique_ptr<Communicator> Communicator::subgroup(std::span<const int> ranks, std::string_view name) {
  check_no_group("subgroup", name);
  std::vector<int> seen(static_cast<size_t>(size_), 0);
  int key = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    MESHMUON_CHECK(r >= 0 && r < size_, "[comm] subgroup: rank ", r, " at position ", i,
                " is not in communicator '", name_, "' (size ", size_, ")");
    MESHMUON_CHECK(seen[static_cast<size_t>(r)]++ == 0, "[comm] subgroup: rank ", r, " is listed twice");
    if (r == rank_) key = static_cast<int>(i);
  }
  const std::string n = name.empty() ? detail::concat(name_, "/group") : std::string(name);
  return split(key >= 0 ? 0 : -1, key, n);
}

std::unique_ptr<Communicator> Communicator::split_mesh_dims(std::span<const int64_t> mesh_shape,
                                                            std::span<const int64_t> coords,
                                                            std::span<const int> dims, std::string_view name) {
  check_no_group("split_mesh_dims", name);
  const size_t nd = mesh_shape.size();
  MESHMUON_CHECK(coords.size() == nd, "[comm] split_mesh_dims: coords has ", coords.size(),
              " entries but the mesh has ", nd, " dims");
  int64_t cells = 1;
  for (size_t d = 0; d < nd; ++d) {
    MESHMUON_CHECK(mesh_shape[d] > 0, "[comm] split_mesh_dims: mesh dim ", d, " has extent ", mesh_shape[d]);
    MESHMUON_CHECK(coords[d] >= 0 && coords[d] < mesh_shape[d], "[comm] split_mesh_dims: coordinate ", coords[d],
                " of dim ", d, " is outside [0, ", mesh_shape[d], ")");
    cells *= mesh_shape[d];
  }
  MESHMUON_CHECK(cells == size_, "[comm] split_mesh_dims: the mesh has ", cells, " ranks but communicator '",
              name_, "' has ", size_);
  std::vector<bool> chosen(nd, false);
  for (int d : dims) {
    MESHMUON_CHECK(d >= 0 && static_cast<size_t>(d) < nd, "[comm] split_mesh_dims: dim ", d, " is not in [0, ", nd, ")");
    MESHMUON_CHECK(!chosen[static_cast<size_t>(d)], "[comm] split_mesh_dims: dim ", d, " is listed twice");
    chosen[static_cast<size_t>(d)] = true;
  }
  // color: row-major index over the other dims; key: row-major index over `dims` in the given order.
  int64_t color = 0, key = 0, group = 1;
  for (size_t d = 0; d < nd; ++d)
    if (!chosen[d]) color = color * mesh_shape[d] + coords[d];
  for (int d : dims) {
    key = key * mesh_shape[static_cast<size_t>(d)] + coords[static_cast<size_t>(d)];
    group *= mesh_shape[static_cast<size_t>(d)];
  }
  auto out = split(static_cast<int>(color), static_cast<int>(key), name);
  MESHMUON_CHECK_RUNTIME(out && out->size() == group, "[comm] split_mesh_dims on '", name_, "': rank ", rank_,
                      " got a group of ", out ? out->size() : 0, " ranks instead of ", group,
                      "; ranks disagree on their mesh coordinates");
  return out;
}

std::unique_ptr<Communicator> make_communicator(std::string_view backend) {
  if (backend == "single") return make_single_communicator();
  if (backend == "mpi") return make_mpi_communicator();
  if (backend == "nccl") return make_nccl_communicator();
  detail::throw_invalid_argument(detail::concat("[comm] unknown communicator backend '", backend,
                                                "'; choose single, mpi or nccl"));
}

}  // namespace meshmuon
