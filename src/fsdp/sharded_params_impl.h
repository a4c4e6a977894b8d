// Internal: the state of a ShardedParams (include/meshmuon/sharded_params.h), shared by its three
// source files: sharded_params.cpp (construction, agreement, buffers, views), unshard.cpp (the
// fused all-gather) and grad_reduce.cpp (the bucketed fixed-order reduction).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "meshmuon/sharded_params.h"

namespace meshmuon::fsdp {

inline constexpr size_t kAlign = 64;  // bytes: every per-parameter region starts on a cache line

// One zero-initialized (or not) 64-byte aligned allocation. Empty when bytes == 0. With a backend
// that has device memory, the allocation is that backend's device memory (always zero-filled,
// 256-byte aligned) and only the backend's kernels and copies may touch it.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(size_t bytes, bool zero, detail::Backend* device = nullptr);
  void* data() const { return p_ ? p_.get() : device_.data(); }
  size_t bytes() const { return bytes_; }
  template <class T> T* as() const { return static_cast<T*>(data()); }
  void reset() { p_.reset(), device_.reset(), bytes_ = 0; }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> p_;
  detail::Buffer device_;
  size_t bytes_ = 0;
};

// Elements rounded up so that the next region of `elem_size`-byte elements starts 64-byte aligned.
inline int64_t align_elems(int64_t n, size_t elem_size) {
  const int64_t per = static_cast<int64_t>(kAlign / elem_size);
  return (n + per - 1) / per * per;
}

// One bucket of the gradient reduction: whole parameters [first, last), and its exchange tables.
struct Bucket {
  size_t first = 0, last = 0;
  // Shard stage (all_to_all_v over the shard group, reduce_dtype): block j of the send buffer holds
  // rank j's rows of every parameter of the bucket; every peer sends this rank `local` elements.
  std::vector<int64_t> send_counts, send_displs, recv_counts, recv_displs;
  std::vector<std::vector<int64_t>> send_param_off;  // [j][i - first]: param i inside block j
  std::vector<int64_t> local_off;                    // [i - first]: param i inside this rank's rows
  int64_t numel = 0, local = 0;
  // Replicate stage (R > 1): balanced split of `local` over replicas.
  std::vector<int64_t> rep_counts, rep_displs;            // block q (to replica q), packed
  std::vector<int64_t> rep_recv_counts, rep_recv_displs;  // R blocks of rep_counts[r]
  // Owner placement on HSDP: `local` holds the sharded rows first, then own_local rows of owned
  // matrices (this rank is their owner's shard position). The replicate stage sends replica q a
  // block [its balanced piece of the sharded rows][the owned matrices whose owner is in replica q];
  // only the sharded pieces are gathered back (rep_counts = sh_counts when own_local == 0).
  int64_t own_local = 0;
  std::vector<int64_t> sh_counts, sh_displs;  // balanced split of local - own_local over replicas
  std::vector<int64_t> own_at;                // [i - first]: owned matrix's offset in its block's owned part, or -1
  // Offsets (bytes) of the bucket's buffers inside the reduction workspace.
  size_t send_at = 0, recv_at = 0, partial_at = 0, rep_send_at = 0, rep_recv_at = 0, gathered_at = 0;
};

// Where a bucket's pack reads parameter i's full gradient: fp32 or bf16, contiguous, global shape;
// null data: zeros (an absent gradient).
struct GradSource {
  const std::byte* data = nullptr;
  DType dtype = DType::F32;
};

}  // namespace meshmuon::fsdp

namespace meshmuon {

struct ShardedParams::Impl {
  std::shared_ptr<MeshCommunicators> comms;
  Mesh mesh;
  ShardedParamsOptions opt;
  Inventory inv;
  int world_rank = 0;
  int S = 1, R = 1;  // shard-group and replicate-group sizes
  int s = 0, r = 0;  // this rank's index in each
  Communicator* shard_comm = nullptr;  // null when S == 1 (no communication)
  Communicator* rep_comm = nullptr;    // null when R == 1
  std::chrono::milliseconds timeout{0};  // per wait (resolved: options or the world's default)
  // options.device: every touch of the buffers below goes through its kernels and copies.
  std::shared_ptr<detail::Backend> backend;
  detail::Backend* device_memory = nullptr;  // the backend when its buffers live off the host, else null
  Device dev;                                // the views' device ({} for cpu)

  // Per parameter.
  std::vector<Box> boxes;
  std::vector<int64_t> row_elems;                 // elements per dim-0 row
  std::vector<int64_t> row_begin_of;              // flattened [i * S + j]: first row of shard rank j
  std::vector<int64_t> count_of;                  // flattened [i * S + j]: elements rank j holds
  // Owner placement: the world rank holding parameter i whole (-1: sharded), and where its gradient
  // is summed in the shard stage: flattened [i * S + j], the elements shard rank j of EVERY replica
  // sums (sharded: count_of; owned: the whole matrix at the owner's shard position).
  std::vector<int> owner_world;
  std::vector<int64_t> red_count_of;
  std::vector<int64_t> offset;                    // local shard region in the flat buffers (floats)
  std::vector<int64_t> full_offset;               // full region in the full buffers (elements, aligned for 4 bytes)
  int64_t flat_elems = 0, full_elems = 0;
  fsdp::AlignedBuffer flat_params, flat_grads;
  std::vector<TensorView> param_views, grad_views;

  // Unshard (all_gather_v over the shard group, cached at construction).
  std::vector<int64_t> ag_counts, ag_displs;       // per shard rank: its packed block
  std::vector<int64_t> ag_param_off;               // flattened [j * n + i]: param i inside block j
  enum class UState { Sharded, Posted, Unsharded } ustate = UState::Sharded;
  // Direct landing (options.unshard_direct_max_messages): grouped send/recv of each parameter's rows
  // straight into the full tensors; otherwise one all_gather_v into a receive buffer, then the copy-out.
  bool unshard_direct = false;
  fsdp::AlignedBuffer ag_send, ag_recv, full_params;
  std::vector<TensorView> full_views;
  Work ag_work;
  std::vector<Work> own_works;  // owner placement: one broadcast per owned matrix over the world

  // Gradients.
  fsdp::AlignedBuffer full_grads;
  std::vector<TensorView> full_grad_views;
  std::vector<fsdp::Bucket> buckets;
  fsdp::AlignedBuffer workspace;  // every bucket's exchange buffers (kept until free_full_grads)
  size_t workspace_bytes = 0;
  bool reduce_posted = false;
  std::vector<Work> shard_works;
  CommCounters shard_before{}, rep_before{};
  CommClock::time_point reduce_start{}, posted_at{};
  ReduceStats stats;

  size_t n() const { return inv.params.size(); }
  int64_t count(size_t i, int j) const { return count_of[i * static_cast<size_t>(S) + static_cast<size_t>(j)]; }
  int64_t red_count(size_t i, int j) const { return red_count_of[i * static_cast<size_t>(S) + static_cast<size_t>(j)]; }
  bool owned(size_t i) const { return owner_world[i] >= 0; }
  int64_t row_begin(size_t i, int j) const { return row_begin_of[i * static_cast<size_t>(S) + static_cast<size_t>(j)]; }
  void ensure_full_grads();
  void plan_buckets();  // grad_reduce.cpp
  // Packs every bucket from `src` (one per parameter) and posts the shard stages (grad_reduce.cpp).
  void post_reduce(const std::vector<fsdp::GradSource>& src);
  // Caller-provided full tensors: one per parameter, global shape, contiguous, fp32 or bf16
  // (std::invalid_argument naming the parameter otherwise); `allow_none`: a none view is accepted.
  void check_full_views(std::span<const TensorView> full, const char* what, bool allow_none) const;
};

}  // namespace meshmuon
