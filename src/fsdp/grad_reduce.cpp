// ShardedParams' gradient reduction, bucketed, in the fixed order the header documents:
//   shard stage   all_to_all_v over the shard group (reduce_dtype): rank s receives every shard
//                 rank's rows of the bucket's parameters and sums them in rank order 0..S-1 (fp32);
//   replicate     (R > 1) the partial, rounded to reduce_dtype, all_to_all_v over the replicate group
//                 in balanced blocks; each replica sums its block over replicas 0..R-1 (fp32), divides,
//                 and all_gather_v returns the blocks;
//   division      one fp32 division by the divisor (skipped when 1).
// Owner placement: an owned matrix's whole gradient is a shard stage "row block" of its owner's shard
// position (every replica sums it there, in the same order), and on HSDP its partial goes whole to the
// owner's replica in the replicate all_to_all_v (not gathered back): the same sum, reduced to the owner.
// reduce_grads_async packs and posts every bucket's shard stage; wait_reduce_grads drives a progress
// loop that test()s the outstanding Works and posts bucket k's replicate stage as soon as its shard
// stage is summed (overlap). Replicate-group collectives are posted in one fixed sequence on every
// rank (a2a 0, a2a 1, gather 0, a2a 2, gather 1, ...), whatever the completion order.
#include <chrono>
#include <stdexcept>

#include "comm/poll.h"
#include "meshmuon/error.h"
#include "sharded_params_impl.h"

namespace meshmuon {

using fsdp::AlignedBuffer;
using fsdp::Bucket;

namespace {

using Clock = CommClock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

size_t aligned_bytes(int64_t elems, size_t es) {
  return (static_cast<size_t>(elems) * es + fsdp::kAlign - 1) / fsdp::kAlign * fsdp::kAlign;
}

// Every touch of the gradient, workspace and shard memory below is a Backend kernel or copy
// (options.device): the cpu backend runs exactly the host loops this file used to, a device backend
// the same per-element operations on its memory.

// count elements of a full gradient, from element `at` of `src`, into the send buffer in reduce_dtype
// (fp32 -> bf16 rounded to nearest even; bf16 -> fp32 exact; same dtype: bits; absent: +0).
void pack_grad(detail::Backend& be, const fsdp::GradSource& src, int64_t at, std::byte* dst, int64_t count, DType rd) {
  if (count <= 0) return;
  if (src.data == nullptr)
    be.fill_zero(dst, static_cast<size_t>(count) * dtype_size(rd));  // +0 in fp32 and bf16
  else
    be.convert(dst, rd, src.data + static_cast<size_t>(at) * dtype_size(src.dtype), src.dtype, count);
}

void divide(detail::Backend& be, float* x, int64_t n, float d) {
  if (d == 1.0f || n <= 0) return;
  be.divide(x, n, d);
}

}  // namespace

void ShardedParams::Impl::plan_buckets() {
  const size_t rs = dtype_size(opt.reduce_dtype);
  const size_t Sz = static_cast<size_t>(S);
  buckets.clear();
  size_t i = 0;
  const size_t np = n();
  while (i < np) {
    Bucket b;
    b.first = i;
    int64_t bytes = 0;
    while (i < np) {
      const int64_t pb = inv.params[i].numel() * static_cast<int64_t>(rs);
      if (i > b.first && opt.bucket_bytes > 0 && bytes + pb > opt.bucket_bytes) break;
      bytes += pb, ++i;
    }
    b.last = i;
    b.send_counts.assign(Sz, 0);
    b.send_param_off.assign(Sz, std::vector<int64_t>(b.last - b.first, 0));
    b.local_off.assign(b.last - b.first, 0), b.own_at.assign(b.last - b.first, -1);
    // Every block (and so the partial) holds the sharded parameters first, then the owned ones.
    for (const bool own : {false, true})
      for (size_t k = b.first; k < b.last; ++k) {
        if (owned(k) != own) continue;
        for (size_t j = 0; j < Sz; ++j)
          b.send_param_off[j][k - b.first] = b.send_counts[j], b.send_counts[j] += red_count(k, static_cast<int>(j));
        b.local_off[k - b.first] = b.local, b.local += red_count(k, s);
        if (own) b.own_local += red_count(k, s);
      }
    for (size_t k = b.first; k < b.last; ++k) b.numel += inv.params[k].numel();
    b.send_displs = packed_displs(b.send_counts);
    b.recv_counts.assign(Sz, b.local);
    b.recv_displs = packed_displs(b.recv_counts);
    if (R > 1) {
      b.sh_counts = balanced_counts(b.local - b.own_local, R);
      b.sh_displs = packed_displs(b.sh_counts);
      b.rep_counts = b.sh_counts;
      for (size_t k = b.first; k < b.last; ++k)  // owned partials: whole, to the owner's replica
        if (owned(k) && red_count(k, s) > 0) {
          const size_t q = static_cast<size_t>(owner_world[k] / S);
          b.own_at[k - b.first] = b.rep_counts[q] - b.sh_counts[q], b.rep_counts[q] += red_count(k, s);
        }
      b.rep_displs = packed_displs(b.rep_counts);
      b.rep_recv_counts.assign(static_cast<size_t>(R), b.rep_counts[static_cast<size_t>(r)]);
      b.rep_recv_displs = packed_displs(b.rep_recv_counts);
    }
    // Workspace: send, recv (S > 1), partial (fp32), and on HSDP rep_send (bf16), rep_recv, total
    // (fp32, this replica's block; placed at gathered_at - its size), gathered (fp32).
    b.send_at = workspace_bytes, workspace_bytes += aligned_bytes(b.numel, rs);
    b.recv_at = b.send_at;
    if (S > 1) b.recv_at = workspace_bytes, workspace_bytes += aligned_bytes(b.local * S, rs);
    b.partial_at = workspace_bytes, workspace_bytes += aligned_bytes(b.local, 4);
    if (R > 1) {
      b.rep_send_at = b.partial_at;
      if (opt.reduce_dtype != DType::F32 || b.own_local > 0) b.rep_send_at = workspace_bytes, workspace_bytes += aligned_bytes(b.local, rs);
      const int64_t mine = b.rep_counts[static_cast<size_t>(r)];
      b.rep_recv_at = workspace_bytes, workspace_bytes += aligned_bytes(mine * R, rs);
      workspace_bytes += aligned_bytes(mine, 4);  // total
      b.gathered_at = workspace_bytes, workspace_bytes += aligned_bytes(b.local, 4);
    }
    buckets.push_back(std::move(b));
  }
}

namespace {

enum class Stage : uint8_t { ShardPosted, ShardDone, RepPosted, RepDone, GatherPosted, Done };

float divisor_of(const ShardedParams::Impl& m) {
  if (m.opt.grad_divisor > 0) return static_cast<float>(m.opt.grad_divisor);
  return m.opt.reduce == GradReduce::Mean ? static_cast<float>(m.R * m.S) : 1.0f;
}

// Bucket k's shard stage is summed: partial (fp32) = received blocks in rank order.
void sum_shard(ShardedParams::Impl& m, const Bucket& b) {
  auto* ws = static_cast<std::byte*>(m.workspace.data());
  if (b.local > 0) m.backend->ordered_sum(ws + b.recv_at, m.opt.reduce_dtype, b.local, m.S, reinterpret_cast<float*>(ws + b.partial_at));
}

// Copies a bucket's reduced rows (fp32, packed by parameter) into grad(i); on HSDP the owned
// matrices this rank holds come from `owned_src` (its replicate block's owned part) instead.
void scatter_to_grads(ShardedParams::Impl& m, const Bucket& b, const float* src, const float* owned_src = nullptr) {
  for (size_t k = b.first; k < b.last; ++k) {
    const int64_t c = m.count(k, m.s);
    if (c <= 0) continue;
    const float* from = owned_src != nullptr && m.owned(k) ? owned_src + b.own_at[k - b.first] : src + b.local_off[k - b.first];
    m.backend->copy(m.flat_grads.as<float>() + m.offset[k], from, static_cast<size_t>(c) * 4);
  }
}

// The replicate stage's send blocks when owned partials travel: replica q's balanced piece of the
// sharded rows, then the owned matrices whose owner is in replica q (reduce_dtype).
void pack_replicate(ShardedParams::Impl& m, const Bucket& b, const float* partial, std::byte* send) {
  const DType rd = m.opt.reduce_dtype;
  const size_t rs = dtype_size(rd);
  for (size_t q = 0; q < static_cast<size_t>(m.R); ++q)
    if (b.sh_counts[q] > 0)
      m.backend->convert(send + static_cast<size_t>(b.rep_displs[q]) * rs, rd, partial + b.sh_displs[q], DType::F32, b.sh_counts[q]);
  for (size_t k = b.first; k < b.last; ++k) {
    const int64_t at = b.own_at[k - b.first];
    if (at < 0) continue;
    const size_t q = static_cast<size_t>(m.owner_world[k] / m.S);
    m.backend->convert(send + static_cast<size_t>(b.rep_displs[q] + b.sh_counts[q] + at) * rs, rd, partial + b.local_off[k - b.first],
                       DType::F32, m.red_count(k, m.s));
  }
}

}  // namespace

void ShardedParams::reduce_grads_async() {
  Impl& m = *impl_;
  if (m.reduce_posted) throw std::logic_error("[fsdp] reduce_grads_async() called again before wait_reduce_grads()");
  m.ensure_full_grads();
  std::vector<fsdp::GradSource> src(m.n());
  for (size_t i = 0; i < m.n(); ++i) src[i] = {reinterpret_cast<const std::byte*>(m.full_grads.as<float>() + m.full_offset[i]), DType::F32};
  m.post_reduce(src);
}

void ShardedParams::reduce_grads_from_async(std::span<const TensorView> full) {
  Impl& m = *impl_;
  if (m.reduce_posted) throw std::logic_error("[fsdp] reduce_grads_from_async() called again before wait_reduce_grads()");
  m.check_full_views(full, "reduce_grads_from", true);
  std::vector<fsdp::GradSource> src(m.n());
  for (size_t i = 0; i < m.n(); ++i)
    if (!full[i].is_none()) src[i] = {static_cast<const std::byte*>(full[i].data), full[i].dtype};
  m.post_reduce(src);
}

void ShardedParams::Impl::post_reduce(const std::vector<fsdp::GradSource>& src) {
  Impl& m = *this;
  if (m.workspace.bytes() < m.workspace_bytes) m.workspace = AlignedBuffer(m.workspace_bytes, false, m.device_memory);
  m.stats = ReduceStats{};
  m.stats.buckets = static_cast<int>(m.buckets.size());
  m.reduce_start = Clock::now();
  if (m.shard_comm) m.shard_before = m.shard_comm->counters();
  if (m.rep_comm) m.rep_before = m.rep_comm->counters();
  const DType rd = m.opt.reduce_dtype;
  const size_t rs = dtype_size(rd);
  auto* ws = static_cast<std::byte*>(m.workspace.data());
  m.shard_works.clear();
  m.shard_works.resize(m.buckets.size());
  double pack = 0;
  for (size_t k = 0; k < m.buckets.size(); ++k) {
    const Bucket& b = m.buckets[k];
    const auto t0 = Clock::now();
    std::byte* send = ws + b.send_at;
    for (size_t i = b.first; i < b.last; ++i) {
      for (int j = 0; j < m.S; ++j) {
        const size_t js = static_cast<size_t>(j);
        pack_grad(*m.backend, src[i], m.row_begin(i, j) * m.row_elems[i],
                  send + static_cast<size_t>(b.send_displs[js] + b.send_param_off[js][i - b.first]) * rs, m.red_count(i, j), rd);
      }
    }
    pack += seconds(Clock::now() - t0);
    if (m.shard_comm) {
      const CommType ct = comm_type(rd);
      m.shard_works[k] = m.shard_comm->all_to_all_v(
          InBuffer(send, ct, static_cast<size_t>(b.numel)), b.send_counts, b.send_displs,
          OutBuffer(ws + b.recv_at, ct, static_cast<size_t>(b.local * m.S)), b.recv_counts, b.recv_displs,
          detail::concat("fsdp reduce bucket ", k, " shard stage"));
      for (size_t q = 0; q < k; ++q) (void)m.shard_works[q].test();  // progress the earlier buckets
    }
  }
  m.stats.sum_seconds += pack;
  m.posted_at = Clock::now();
  m.reduce_posted = true;
}

void ShardedParams::wait_reduce_grads() {
  Impl& m = *impl_;
  if (!m.reduce_posted) throw std::logic_error("[fsdp] wait_reduce_grads() without a pending reduce_grads_async()");
  m.reduce_posted = false;  // whatever happens below, the reduction is over (an error leaves the job broken)
  const size_t K = m.buckets.size();
  const DType rd = m.opt.reduce_dtype;
  const CommType ct = comm_type(rd);
  const float d = divisor_of(m);
  auto* ws = static_cast<std::byte*>(m.workspace.data());
  std::vector<Stage> stage(K, m.shard_comm ? Stage::ShardPosted : Stage::ShardDone);
  std::vector<Work> rep(K);
  std::vector<Clock::time_point> rep_posted(K);
  // Fixed sequence of replicate-group collectives: a2a 0, a2a 1, gather 0, a2a 2, gather 1, ...
  std::vector<std::pair<bool, size_t>> seq;  // (is_gather, bucket)
  if (m.rep_comm) {
    for (size_t k = 0; k < K; ++k) {
      seq.emplace_back(false, k);
      if (k > 0) seq.emplace_back(true, k - 1);
    }
    seq.emplace_back(true, K - 1);
  }
  size_t next = 0, done = 0;
  double sum_s = 0;
  auto last = m.posted_at;
  const auto rethrow = [&](const Error& e, size_t k, const char* what) {
    detail::throw_error(detail::concat("[fsdp] rank ", m.world_rank, ": reduce_grads bucket ", k, " of ", K, ", ", what,
                                       " failed: ", e.what()));
  };
  // One poll of a stage's Work against its deadline (comm/poll.h), its failure named for the stage.
  const auto poll = [&](Work& w, Clock::time_point posted, size_t k, const char* what) {
    try {
      return detail::poll_work(w, posted, m.timeout);
    } catch (const Error& e) {
      if (Clock::now() - posted <= m.timeout) rethrow(e, k, what);
      detail::throw_error(detail::concat("[fsdp] rank ", m.world_rank, ": reduce_grads bucket ", k, " of ", K, ", ", what,
                                         " timed out: not complete ", seconds(Clock::now() - posted), " s after it was posted (timeout ",
                                         m.timeout.count(), " ms): ", e.what()));
    }
    return false;
  };
  const auto finish = [&](size_t k, float* src, const float* owned_src = nullptr) {
    const auto t0 = Clock::now();
    scatter_to_grads(m, m.buckets[k], src, owned_src);
    sum_s += seconds(Clock::now() - t0);
    stage[k] = Stage::Done, ++done;
  };
  const auto shard_summed = [&](size_t k) {
    const Bucket& b = m.buckets[k];
    const auto t0 = Clock::now();
    sum_shard(m, b);
    auto* partial = reinterpret_cast<float*>(ws + b.partial_at);
    if (!m.rep_comm) {
      divide(*m.backend, partial, b.local, d);
      sum_s += seconds(Clock::now() - t0);
      finish(k, partial);
      return;
    }
    if (b.own_local > 0) pack_replicate(m, b, partial, ws + b.rep_send_at);
    else if (rd != DType::F32 && b.local > 0) m.backend->convert(ws + b.rep_send_at, rd, partial, DType::F32, b.local);
    sum_s += seconds(Clock::now() - t0);
    stage[k] = Stage::ShardDone;
  };
  // One shard rank: the shard stage was local (the packed send buffer is the only block).
  if (!m.shard_comm)
    for (size_t k = 0; k < K; ++k) shard_summed(k);
  detail::PollBackoff backoff;
  while (done < K) {
    bool progressed = false;
    // Time attribution for the interval since the last tick (state at its start).
    const auto now = Clock::now();
    {
      bool sh = false, rp = false;
      for (size_t k = 0; k < K; ++k) {
        sh = sh || stage[k] == Stage::ShardPosted;
        rp = rp || stage[k] == Stage::RepPosted || stage[k] == Stage::GatherPosted;
      }
      const double dt = seconds(now - last);
      if (sh) m.stats.shard_seconds += dt;
      if (rp) m.stats.replicate_seconds += dt;
      if (sh && rp) m.stats.overlap_seconds += dt;
      last = now;
    }
    for (size_t k = 0; k < K; ++k)
      if (stage[k] == Stage::ShardPosted) {
        if (poll(m.shard_works[k], m.posted_at, k, "shard stage (all_to_all_v over the shard group)"))
          shard_summed(k), progressed = true;
      }
    while (next < seq.size()) {  // post the replicate-group sequence as far as it is ready
      const auto [gather, k] = seq[next];
      const Bucket& b = m.buckets[k];
      if (!gather && stage[k] == Stage::ShardDone) {
        rep[k] = m.rep_comm->all_to_all_v(InBuffer(ws + b.rep_send_at, ct, static_cast<size_t>(b.local)), b.rep_counts,
                                          b.rep_displs,
                                          OutBuffer(ws + b.rep_recv_at, ct, static_cast<size_t>(b.rep_recv_counts[0] * m.R)),
                                          b.rep_recv_counts, b.rep_recv_displs,
                                          detail::concat("fsdp reduce bucket ", k, " replicate stage"));
        rep_posted[k] = Clock::now(), stage[k] = Stage::RepPosted;
      } else if (gather && stage[k] == Stage::RepDone) {
        const int64_t mine = b.rep_counts[static_cast<size_t>(m.r)];
        const size_t total_at = b.gathered_at - aligned_bytes(mine, 4);
        // only the sharded rows come back (owned partials stay summed on their owner's replica)
        const int64_t sh = b.sh_counts[static_cast<size_t>(m.r)];
        rep[k] = m.rep_comm->all_gather_v(InBuffer(ws + total_at, CommType::F32, static_cast<size_t>(sh)),
                                          OutBuffer(ws + b.gathered_at, CommType::F32, static_cast<size_t>(b.local - b.own_local)),
                                          b.sh_counts, b.sh_displs, detail::concat("fsdp reduce bucket ", k, " replicate gather"));
        rep_posted[k] = Clock::now(), stage[k] = Stage::GatherPosted;
      } else {
        break;
      }
      ++next, progressed = true;
    }
    for (size_t k = 0; k < K; ++k) {
      if (stage[k] == Stage::RepPosted) {
        if (poll(rep[k], rep_posted[k], k, "replicate stage (all_to_all_v over the replicate group)")) {
          const Bucket& b = m.buckets[k];
          const int64_t mine = b.rep_counts[static_cast<size_t>(m.r)];
          auto* total = reinterpret_cast<float*>(ws + b.gathered_at - aligned_bytes(mine, 4));
          const auto t0 = Clock::now();
          if (mine > 0) m.backend->ordered_sum(ws + b.rep_recv_at, rd, mine, m.R, total);
          divide(*m.backend, total, mine, d);
          sum_s += seconds(Clock::now() - t0);
          stage[k] = Stage::RepDone, progressed = true;
        }
      } else if (stage[k] == Stage::GatherPosted) {
        if (poll(rep[k], rep_posted[k], k, "replicate gather (all_gather_v over the replicate group)")) {
          const Bucket& b = m.buckets[k];
          const size_t total_at = b.gathered_at - aligned_bytes(b.rep_counts[static_cast<size_t>(m.r)], 4);
          finish(k, reinterpret_cast<float*>(ws + b.gathered_at),
                 reinterpret_cast<float*>(ws + total_at) + b.sh_counts[static_cast<size_t>(m.r)]);
          progressed = true;
        }
      }
    }
    if (progressed) backoff.progressed();
    else backoff.idle();
  }
  m.shard_works.clear();
  m.stats.sum_seconds += sum_s;
  m.stats.seconds = seconds(Clock::now() - m.reduce_start);
  if (m.shard_comm) {
    const CommCounters c = m.shard_comm->counters();
    m.stats.bytes_sent += c.bytes_sent - m.shard_before.bytes_sent, m.stats.bytes_recv += c.bytes_recv - m.shard_before.bytes_recv;
  }
  if (m.rep_comm) {
    const CommCounters c = m.rep_comm->counters();
    m.stats.bytes_sent += c.bytes_sent - m.rep_before.bytes_sent, m.stats.bytes_recv += c.bytes_recv - m.rep_before.bytes_recv;
  }
}

}  // namespace meshmuon
