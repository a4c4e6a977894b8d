// Element types, buffers from tensor views, and the byte-count rules shared by the communicator's
// counters and the planner's predictions (one definition, so measured == predicted).
#include "meshmuon/comm.h"
#include "meshmuon/error.h"

namespace meshmuon {

std::string_view to_string(CommType t) {
  switch (t) {
    case CommType::F32: return "fp32";
    case CommType::BF16: return "bf16";
    case CommType::I32: return "int32";
    case CommType::I64: return "int64";
    case CommType::U64: return "uint64";
    case CommType::U8: return "uint8";
  }
  return "?";
}

size_t comm_type_size(CommType t) {
  switch (t) {
    case CommType::F32: case CommType::I32: return 4;
    case CommType::BF16: return 2;
    case CommType::I64: case CommType::U64: return 8;
    case CommType::U8: return 1;
  }
  return 0;
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

InBuffer::InBuffer(const TensorView& view)
    : data(view.data), type(comm_type(view.dtype)), count(static_cast<size_t>(view.numel())) {
  MESHMUON_CHECK(view.is_contiguous(), "[comm] a collective needs a contiguous buffer; got shape ",
              view.shape.to_string(), " with strides ", view.strides.to_string(), "; pack it first");
}

OutBuffer::OutBuffer(const TensorView& view)
    : data(view.data), type(comm_type(view.dtype)), count(static_cast<size_t>(view.numel())) {
  MESHMUON_CHECK(view.is_contiguous(), "[comm] a collective needs a contiguous buffer; got shape ",
              view.shape.to_string(), " with strides ", view.strides.to_string(), "; pack it first");
}

namespace {
uint64_t sum_except(std::span<const int64_t> counts, int rank) {
  uint64_t s = 0;
  for (size_t j = 0; j < counts.size(); ++j)
    if (static_cast<int>(j) != rank) s += static_cast<uint64_t>(counts[j]);
  return s;
}
}  // namespace

ByteCount comm_bytes_all_to_all_v(int rank, std::span<const int64_t> send_counts,
                                  std::span<const int64_t> recv_counts, size_t elem_size) {
  return {sum_except(send_counts, rank) * elem_size, sum_except(recv_counts, rank) * elem_size};
}

ByteCount comm_bytes_all_gather_v(int rank, std::span<const int64_t> counts, size_t elem_size) {
  const uint64_t peers = counts.empty() ? 0 : counts.size() - 1;
  return {static_cast<uint64_t>(counts[static_cast<size_t>(rank)]) * peers * elem_size,
          sum_except(counts, rank) * elem_size};
}

ByteCount comm_bytes_reduce_scatter_v(int rank, std::span<const int64_t> counts, size_t elem_size) {
  const uint64_t peers = counts.empty() ? 0 : counts.size() - 1;
  return {sum_except(counts, rank) * elem_size,
          static_cast<uint64_t>(counts[static_cast<size_t>(rank)]) * peers * elem_size};
}

ByteCount comm_bytes_all_reduce(int rank, int size, int64_t count, size_t elem_size) {
  const std::vector<int64_t> blocks = balanced_counts(count, size);
  const ByteCount rs = comm_bytes_reduce_scatter_v(rank, blocks, elem_size);
  const ByteCount ag = comm_bytes_all_gather_v(rank, blocks, elem_size);
  return {rs.sent + ag.sent, rs.recv + ag.recv};
}

ByteCount comm_bytes_broadcast(int rank, int size, int root, int64_t count, size_t elem_size) {
  const uint64_t n = static_cast<uint64_t>(count) * elem_size;
  if (size <= 1) return {};
  return rank == root ? ByteCount{n * static_cast<uint64_t>(size - 1), 0} : ByteCount{0, n};
}

std::vector<int64_t> balanced_counts(int64_t count, int size) {
  MESHMUON_CHECK(size > 0 && count >= 0, "[comm] balanced_counts needs count >= 0 and size > 0 (got count ",
              count, ", size ", size, ")");
  std::vector<int64_t> out(static_cast<size_t>(size), count / size);
  for (int64_t j = 0; j < count % size; ++j) out[static_cast<size_t>(j)] += 1;
  return out;
}

std::vector<int64_t> packed_displs(std::span<const int64_t> counts) {
  std::vector<int64_t> out(counts.size());
  int64_t at = 0;
  for (size_t j = 0; j < counts.size(); ++j) {
    out[j] = at;
    at += counts[j];
  }
  return out;
}

}  // namespace meshmuon
