// ShardedParams: one module's parameters, sharded like FSDP2 / HSDP (the parameter side of sharded
// training; the optimizer side is meshmuon::Optimizer). A C++ trainer gets, without writing its own FSDP:
// the local shards in one flat buffer, a fused all-gather that unshards them (optionally as bf16
// copies of the fp32 masters), a fused reduce-scatter of the full gradients (plus the replicate
// all-reduce on HSDP, bucketed and overlapped), and views the optimizer and the checkpoint take
// without copies. Shares the MeshCommunicators of the optimizer (one set of sub-communicators).
//
// Placement: the mesh is "dp_shard=S" (FSDP), "dp_replicate=R,dp_shard=S" (HSDP) or empty (one rank:
// no communication at all). Every parameter is placed [Replicate, Shard(0)] (or [Shard(0)]): rank
// (r, s) holds rows chunk_range(shape[0], S, s) of every parameter, exactly like FSDP2's Shard(0), so
// shards may be uneven or empty. meshmuon::Optimizer, the checkpoint and DCP see the same boxes.
//
// Numerics (bitwise, documented so a reference can reproduce it):
// - Unshard copies bits (fp32), or rounds each fp32 master to bf16 (round to nearest even) once.
// - Gradient reduction is a sum in a FIXED ORDER, whatever the algorithm: for element x of a shard,
//     partial(r) = ((g[r,0] + g[r,1]) + ...) + g[r,S-1]      (fp32, shard-group ranks in order)
//     total      = ((partial(0) + partial(1)) + ...) + partial(R-1)   (HSDP: replicas in order)
//     grad       = total / divisor                          (one fp32 division, only if divisor != 1)
//   where g[r,s] is rank (r, s)'s full gradient converted to reduce_dtype (bf16: rounded once before it
//   travels) and partial(r) is rounded to reduce_dtype before the replicate stage. Sums accumulate in
//   fp32. The data move as all-to-alls (each rank receives the blocks it reduces) and the sums are
//   done locally, so the order never depends on the MPI library, the bucket sizes or the timing.
//   A single process summing the same gradients in the same order gets the same bits.
//
// Contract:
// - COLLECTIVE: the constructor, unshard_async, reduce_grads_async and their waits are called by every
//   rank of the mesh in the same order. The constructor agrees on the parameter list and options with
//   an all-reduced digest and throws the same meshmuon::Error on every rank when ranks differ.
// - THREADS: one thread at a time (the communicators' rule).
// - BUFFERS: param(i) / grad(i) / flat_params() alias one allocation each, alive as long as the object;
//   full_param(i) is valid from wait_unshard() until reshard(); full_grad(i) from the first call until
//   free_full_grads(). While an unshard or a reduction is in flight, the caller must not write the
//   buffers it reads (params for unshard, full grads for reduce) nor read what it writes.
// - ERRORS: bad specs or options throw std::invalid_argument naming the parameter and the field before
//   any communication; calls out of order (wait without a post, full_param while sharded, a second
//   post before the wait) throw std::logic_error; communication errors and timeouts meshmuon::Error.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "meshmuon/box.h"
#include "meshmuon/comm.h"
#include "meshmuon/export.h"
#include "meshmuon/inventory.h"
#include "meshmuon/mesh.h"
#include "meshmuon/mesh_comms.h"
#include "meshmuon/param_spec.h"
#include "meshmuon/tensor.h"

namespace meshmuon {

class ShardedParams;
namespace detail {
class Backend;
// Internal (src/checkpoint/checkpoint.cpp): the backend whose memory the buffers are.
std::shared_ptr<Backend> engine_backend(const ShardedParams& params);
}  // namespace detail

// How the summed gradient is scaled: "mean" divides by the number of ranks of the mesh (R·S: each
// rank contributed one gradient), "sum" leaves it. ShardedParamsOptions::grad_divisor overrides both.
enum class GradReduce : uint8_t { Mean, Sum };

struct ShardedParamsOptions {
  DType param_dtype = DType::F32;   // of full_param(i): fp32 (the masters' bits) or bf16 copies
  DType reduce_dtype = DType::F32;  // what gradients travel and partial sums are rounded to
  GradReduce reduce = GradReduce::Mean;
  // > 0: the sum is divided by exactly this (e.g. the global number of micro-batches), instead of
  // the rule of `reduce`. Must be finite.
  double grad_divisor = 0;
  // Gradients are reduced in buckets of whole parameters of about this many bytes (reduce_dtype):
  // the replicate stage of bucket k runs while bucket k+1 is reduce-scattered. 0 = one bucket.
  int64_t bucket_bytes = int64_t{16} << 20;
  // Unshard by direct landing (one grouped send/recv exchange: each peer's rows of each parameter
  // received straight into the full tensor, no receive buffer, no copy-out) while a rank posts at
  // most this many receives (parameters × (S − 1)); above it, one all_gather_v into a receive
  // buffer and a copy-out (fewer, larger messages). 0: always the all_gather_v. Same bits either way.
  int64_t unshard_direct_max_messages = 4096;
  std::chrono::milliseconds timeout{0};  // per wait; 0 = the communicator's default
  // Where the buffers live and the conversions / sums run, as OptimizerOptions::device: "cpu",
  // "cuda" or "cuda:N". On a device, param(i), grad(i), flat_params(), full_param(i) and full_grad(i)
  // are device memory (views carry the device), caller tensors of unshard_into / reduce_grads_from
  // must be on that device, and the MeshCommunicators must take device buffers (a device-aware
  // memory space). Give the meshmuon::Optimizer the same device. Part of what ranks agree on.
  std::string device = "cpu";
};

// What the last reduce_grads did on this rank (wall-clock seconds, payload bytes to other ranks).
struct ReduceStats {
  int buckets = 0;
  double seconds = 0;               // from reduce_grads_async's start to wait_reduce_grads's end
  double shard_seconds = 0;         // wall time with a shard-group (reduce-scatter) exchange in flight
  double replicate_seconds = 0;     // wall time with a replicate-group exchange in flight
  double overlap_seconds = 0;       // wall time with both in flight at once
  double sum_seconds = 0;           // local fixed-order sums, conversions, division
  uint64_t bytes_sent = 0, bytes_recv = 0;
};

class MESHMUON_API ShardedParams {
 public:
  // COLLECTIVE over comms->world(). `mesh` spans the world and has dims named "dp_shard" and
  // optionally "dp_replicate" (before it), or no dims on a one-rank world. `params`: name, shape
  // (≥ 1 dim), role, expert, qk as for the optimizer; mesh / placements must be left empty (they are
  // set here) and dtype fp32 (the masters). Parameters and gradients start at zero.
  ShardedParams(std::shared_ptr<MeshCommunicators> comms, Mesh mesh, std::vector<ParamSpec> params,
                ShardedParamsOptions options = {});
  ~ShardedParams();
  ShardedParams(const ShardedParams&) = delete;
  ShardedParams& operator=(const ShardedParams&) = delete;

  size_t size() const;
  const Mesh& mesh() const;
  const ShardedParamsOptions& options() const;
  // The parameters placed on the mesh: one mesh named "dense", for meshmuon::Optimizer and checkpoints.
  const Inventory& inventory() const;
  const ParamSpec& spec(size_t i) const;
  Box local_box(size_t i) const;
  int64_t find(std::string_view name) const;  // index, or -1
  const std::shared_ptr<MeshCommunicators>& mesh_communicators() const;

  // Local shards of the fp32 masters (read-write), contiguous, shape local_box(i).shape(); each a
  // view into one flat buffer (regions 64-byte aligned). params() lists them in order.
  TensorView param(size_t i);
  std::span<const TensorView> params();
  std::span<float> flat_params();
  // Reduced gradient shards (fp32), same layout; written by wait_reduce_grads(), read by the
  // optimizer. grads() lists them.
  TensorView grad(size_t i);
  std::span<const TensorView> grads();

  // Unshard: one fused all-gather over the shard group (copy-in of every local shard, in
  // param_dtype, into one send buffer; copy-out into per-parameter full tensors). COLLECTIVE.
  void unshard_async();
  void wait_unshard();
  void unshard() { unshard_async(); wait_unshard(); }
  bool unsharded() const;
  // Full parameter i in param_dtype, global shape, contiguous. Valid until reshard().
  TensorView full_param(size_t i);
  void reshard();  // frees the full parameters (a no-op when sharded)

  // Full-shape fp32 gradient buffers the caller's backward writes (allocated, zeroed, on first use;
  // they keep their values until zero_full_grads() or free_full_grads()).
  TensorView full_grad(size_t i);
  void zero_full_grads();
  void free_full_grads();
  // Reduce the full gradients into grad(i) (see Numerics), bucketed, the replicate stage of each
  // bucket posted as soon as its shard stage completes. COLLECTIVE.
  void reduce_grads_async();
  void wait_reduce_grads();
  void reduce_grads() { reduce_grads_async(); wait_reduce_grads(); }
  const ReduceStats& last_reduce_stats() const;

  // Caller-owned full tensors (ZeRO over plain replicated parameters: a torch model's parameters
  // and .grad). `full[i]` is parameter i's full tensor: global shape, contiguous, fp32 or bf16 (each
  // its own dtype); the list has one entry per parameter. Checked before any communication
  // (std::invalid_argument naming the parameter and field).
  //
  // unshard_into: COLLECTIVE, blocking. Writes the masters into full[i] in place: fp32 their bits,
  // bf16 each master rounded to nearest even once. This rank's rows are converted locally, every
  // peer's rows arrive by direct landing (one grouped send/recv exchange over the shard group, each
  // parameter in its target's dtype; parameters × (S − 1) receives whatever
  // unshard_direct_max_messages says). Uses none of the internal full buffers; not while an unshard
  // or a reduction is in flight (std::logic_error).
  void unshard_into(std::span<const TensorView> full);
  // reduce_grads_from_async: as reduce_grads_async(), reading the caller's full gradients full[i]
  // (fp32 or bf16, converted to reduce_dtype as the Numerics say; bf16 -> fp32 is exact) instead of
  // full_grad(i). A none view (TensorView::is_none) contributes zeros. The pointers may differ at
  // every call; the caller keeps the tensors alive and unchanged until wait_reduce_grads() returns.
  void reduce_grads_from_async(std::span<const TensorView> full);
  void reduce_grads_from(std::span<const TensorView> full) { reduce_grads_from_async(full); wait_reduce_grads(); }

  struct Impl;

 private:
  friend std::shared_ptr<detail::Backend> detail::engine_backend(const ShardedParams& params);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshmuon
