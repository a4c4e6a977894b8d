// ShardedParams' unshard: copy-in of every local shard (param_dtype) into one send buffer (fp32: the flat
// buffer itself), then either DIRECT LANDING (few messages: one grouped send/recv exchange, each peer's
// rows of each parameter received straight into the full tensor) or ONE all_gather_v over the shard
// group with the per-rank counts cached at construction (uneven and empty shards, no padding) and a
// copy-out into per-parameter full tensors (Shard(0): the full tensor is
// rank 0..S-1's rows, concatenated). One shard rank: a local copy, no communication.
// Owner placement: each owned matrix is one broadcast from its owner over the world, posted first
// (into the full tensor itself: the owner converts its master there), waited with the rest.
#include <stdexcept>

#include "meshmuon/bf16.h"
#include "meshmuon/error.h"
#include "sharded_params_impl.h"

namespace meshmuon {

using fsdp::AlignedBuffer;

namespace {

// fp32 masters -> param_dtype (bits, or bf16 round to nearest even), by the backend.
void convert_in(detail::Backend& b, const float* src, void* dst, int64_t count, DType dt) {
  if (count > 0) b.convert(dst, dt, src, DType::F32, count);
}

// Owned matrices: the owner writes its master into the full tensor `full_of(i)` (dtype `dt_of(i)`),
// then one broadcast per matrix over the world, in parameter order on every rank.
template <class Full, class Dt>
std::vector<Work> post_owner_broadcasts(ShardedParams::Impl& m, Full&& full_of, Dt&& dt_of, const char* label) {
  std::vector<Work> works;
  Communicator& world = m.comms->world();
  for (size_t i = 0; i < m.n(); ++i) {
    if (!m.owned(i)) continue;
    const int64_t numel = m.inv.params[i].numel();
    if (m.world_rank == m.owner_world[i]) convert_in(*m.backend, m.flat_params.as<float>() + m.offset[i], full_of(i), numel, dt_of(i));
    if (world.size() > 1 && numel > 0)
      works.push_back(world.broadcast(OutBuffer(full_of(i), comm_type(dt_of(i)), static_cast<size_t>(numel)), m.owner_world[i], label));
  }
  return works;
}

void wait_owner_broadcasts(ShardedParams::Impl& m, std::vector<Work>& works, const char* what) {
  try {
    for (Work& w : works) w.wait(m.timeout);
  } catch (const Error& e) {
    works.clear();
    detail::throw_error(detail::concat("[fsdp] rank ", m.world_rank, ": ", what, " (broadcast from the owner over the world) failed: ", e.what()));
  }
  works.clear();
}

}  // namespace

void ShardedParams::unshard_async() {
  Impl& m = *impl_;
  if (m.ustate == Impl::UState::Posted)
    throw std::logic_error("[fsdp] unshard_async() called again before wait_unshard()");
  if (m.ustate == Impl::UState::Unsharded)
    throw std::logic_error("[fsdp] unshard_async() while unsharded: call reshard() first");
  const DType dt = m.opt.param_dtype;
  const size_t es = dtype_size(dt);
  const size_t n = m.n();
  m.full_params = AlignedBuffer(static_cast<size_t>(m.full_elems) * es, false, m.device_memory);
  auto* full = static_cast<std::byte*>(m.full_params.data());
  m.own_works = post_owner_broadcasts(
      m, [&](size_t i) { return full + static_cast<size_t>(m.full_offset[i]) * es; }, [&](size_t) { return dt; }, "fsdp unshard owner");
  if (m.shard_comm == nullptr) {  // one shard rank: the local shard is the full tensor
    for (size_t i = 0; i < n; ++i)
      if (!m.owned(i)) convert_in(*m.backend, m.flat_params.as<float>() + m.offset[i], full + static_cast<size_t>(m.full_offset[i]) * es, m.count(i, 0), dt);
    m.ustate = Impl::UState::Posted;
    return;
  }
  const size_t S = static_cast<size_t>(m.S), me = static_cast<size_t>(m.s);
  const void* send = m.flat_params.data();  // fp32: the flat buffer is the send buffer (its layout is the block's)
  if (dt != DType::F32) {
    if (!m.ag_send.data()) m.ag_send = AlignedBuffer(static_cast<size_t>(m.ag_counts[me]) * es, true, m.device_memory);  // padding stays 0
    for (size_t i = 0; i < n; ++i)
      if (!m.owned(i))
        convert_in(*m.backend, m.flat_params.as<float>() + m.offset[i], m.ag_send.as<std::byte>() + static_cast<size_t>(m.offset[i]) * es,
                   m.count(i, m.s), dt);
    send = m.ag_send.data();
  }
  const CommType ct = comm_type(dt);
  if (m.unshard_direct) {
    // Direct landing: every peer's rows of every parameter are received straight into the full
    // tensor (Shard(0) rows are contiguous there), sent straight from the send buffer; this rank's
    // own rows are copied. One grouped exchange: the all-gather's bytes, no receive buffer and no
    // copy-out.
    const auto* src = static_cast<const std::byte*>(send);
    for (size_t i = 0; i < n; ++i) {
      const int64_t c = m.owned(i) ? 0 : m.count(i, m.s);
      if (c > 0)
        m.backend->copy(full + static_cast<size_t>(m.full_offset[i] + m.row_begin(i, m.s) * m.row_elems[i]) * es,
                    src + static_cast<size_t>(m.offset[i]) * es, static_cast<size_t>(c) * es);
    }
    Communicator& c = *m.shard_comm;
    c.group_begin();
    try {
      for (size_t k = 1; k < S; ++k) {  // peers in a rotating order: every pair's ops are posted in the same order
        const int to = static_cast<int>((me + k) % S), from = static_cast<int>((me + S - k) % S);
        for (size_t i = 0; i < n; ++i) {
          if (m.owned(i)) continue;
          const int64_t mine = m.count(i, m.s), theirs = m.count(i, from);
          if (mine > 0)
            (void)c.send(InBuffer(src + static_cast<size_t>(m.offset[i]) * es, ct, static_cast<size_t>(mine)), to, "fsdp unshard");
          if (theirs > 0)
            (void)c.recv(OutBuffer(full + static_cast<size_t>(m.full_offset[i] + m.row_begin(i, from) * m.row_elems[i]) * es, ct,
                                   static_cast<size_t>(theirs)),
                         from, "fsdp unshard");
        }
      }
    } catch (...) {
      (void)c.group_end("fsdp unshard (abandoned)");
      throw;
    }
    m.ag_work = c.group_end("fsdp unshard");
    m.ustate = Impl::UState::Posted;
    return;
  }
  int64_t total = 0;
  for (size_t j = 0; j < S; ++j) total += m.ag_counts[j];
  m.ag_recv = AlignedBuffer(static_cast<size_t>(total) * es, false, m.device_memory);
  m.ag_work = m.shard_comm->all_gather_v(InBuffer(send, ct, static_cast<size_t>(m.ag_counts[me])),
                                         OutBuffer(m.ag_recv.data(), ct, static_cast<size_t>(total)), m.ag_counts,
                                         m.ag_displs, "fsdp unshard");
  m.ustate = Impl::UState::Posted;
}

void ShardedParams::wait_unshard() {
  Impl& m = *impl_;
  if (m.ustate != Impl::UState::Posted) throw std::logic_error("[fsdp] wait_unshard() without a pending unshard_async()");
  const DType dt = m.opt.param_dtype;
  const size_t es = dtype_size(dt);
  const size_t n = m.n();
  auto* full = static_cast<std::byte*>(m.full_params.data());
  if (m.shard_comm != nullptr) {
    try {
      m.ag_work.wait(m.timeout);
    } catch (const Error& e) {
      detail::throw_error(detail::concat("[fsdp] rank ", m.world_rank, ": unshard (all_gather_v over the shard group) failed: ",
                                         e.what()));
    }
    const auto* recv = static_cast<const std::byte*>(m.ag_recv.data());
    for (size_t i = 0; i < n && !m.unshard_direct; ++i) {
      if (m.owned(i)) continue;
      std::byte* dst = full + static_cast<size_t>(m.full_offset[i]) * es;
      for (int j = 0; j < m.S; ++j) {
        const int64_t c = m.count(i, j);
        if (c == 0) continue;
        const size_t js = static_cast<size_t>(j);
        m.backend->copy(dst + static_cast<size_t>(m.row_begin(i, j) * m.row_elems[i]) * es,
                    recv + static_cast<size_t>(m.ag_displs[js] + m.ag_param_off[js * n + i]) * es, static_cast<size_t>(c) * es);
      }
    }
    m.ag_recv.reset();
  }
  wait_owner_broadcasts(m, m.own_works, "unshard");
  m.full_views.clear();
  for (size_t i = 0; i < n; ++i)
    m.full_views.emplace_back(full + static_cast<size_t>(m.full_offset[i]) * es, dt, m.inv.params[i].shape), m.full_views.back().device = m.dev;
  m.ustate = Impl::UState::Unsharded;
}

void ShardedParams::unshard_into(std::span<const TensorView> full) {
  Impl& m = *impl_;
  if (m.ustate == Impl::UState::Posted)
    throw std::logic_error("[fsdp] unshard_into() while an unshard is in flight: wait_unshard() first");
  if (m.reduce_posted)
    throw std::logic_error("[fsdp] unshard_into() while a gradient reduction is in flight: wait_reduce_grads() first");
  m.check_full_views(full, "unshard_into", false);
  const size_t n = m.n();
  // This rank's rows, converted into the target (fp32 bits or bf16 round to nearest even).
  for (size_t i = 0; i < n; ++i) {
    if (m.owned(i)) continue;  // the owner's copy is post_owner_broadcasts'
    const size_t es = dtype_size(full[i].dtype);
    convert_in(*m.backend, m.flat_params.as<float>() + m.offset[i],
               static_cast<std::byte*>(full[i].data) + static_cast<size_t>(m.row_begin(i, m.s) * m.row_elems[i]) * es,
               m.count(i, m.s), full[i].dtype);
  }
  std::vector<Work> own = post_owner_broadcasts(
      m, [&](size_t i) { return full[i].data; }, [&](size_t i) { return full[i].dtype; }, "fsdp unshard_into owner");
  if (m.shard_comm == nullptr) return wait_owner_broadcasts(m, own, "unshard_into");  // one shard rank: local shards are full
  // Send buffer: fp32 targets send the masters themselves; bf16 ones a rounded copy (regions at the
  // masters' element offsets, so one buffer of flat_elems bf16 serves every parameter).
  bool any_bf16 = false;
  for (size_t i = 0; i < n; ++i) any_bf16 = any_bf16 || full[i].dtype == DType::BF16;
  AlignedBuffer bf16_send(any_bf16 ? static_cast<size_t>(m.flat_elems) * 2 : 0, false, m.device_memory);
  for (size_t i = 0; i < n; ++i)
    if (full[i].dtype == DType::BF16)
      convert_in(*m.backend, m.flat_params.as<float>() + m.offset[i], bf16_send.as<BFloat16>() + m.offset[i], m.count(i, m.s), DType::BF16);
  const size_t S = static_cast<size_t>(m.S), me = static_cast<size_t>(m.s);
  Communicator& c = *m.shard_comm;
  Work work;
  c.group_begin();
  try {
    for (size_t k = 1; k < S; ++k) {  // peers in a rotating order, as unshard_async's direct landing
      const int to = static_cast<int>((me + k) % S), from = static_cast<int>((me + S - k) % S);
      for (size_t i = 0; i < n; ++i) {
        if (m.owned(i)) continue;
        const DType dt = full[i].dtype;
        const size_t es = dtype_size(dt);
        const CommType ct = comm_type(dt);
        const int64_t mine = m.count(i, m.s), theirs = m.count(i, from);
        const std::byte* src = dt == DType::F32 ? m.flat_params.as<std::byte>() + static_cast<size_t>(m.offset[i]) * 4
                                                : bf16_send.as<std::byte>() + static_cast<size_t>(m.offset[i]) * 2;
        if (mine > 0) (void)c.send(InBuffer(src, ct, static_cast<size_t>(mine)), to, "fsdp unshard_into");
        if (theirs > 0)
          (void)c.recv(OutBuffer(static_cast<std::byte*>(full[i].data) + static_cast<size_t>(m.row_begin(i, from) * m.row_elems[i]) * es,
                                 ct, static_cast<size_t>(theirs)),
                       from, "fsdp unshard_into");
      }
    }
  } catch (...) {
    (void)c.group_end("fsdp unshard_into (abandoned)");
    throw;
  }
  work = c.group_end("fsdp unshard_into");
  try {
    work.wait(m.timeout);
  } catch (const Error& e) {
    detail::throw_error(detail::concat("[fsdp] rank ", m.world_rank, ": unshard_into (send/recv over the shard group) failed: ", e.what()));
  }
  wait_owner_broadcasts(m, own, "unshard_into");
}

bool ShardedParams::unsharded() const { return impl_->ustate == Impl::UState::Unsharded; }

TensorView ShardedParams::full_param(size_t i) {
  Impl& m = *impl_;
  MESHMUON_CHECK(i < m.n(), "[fsdp] full_param(", i, "): index out of range (", m.n(), " parameters)");
  if (m.ustate != Impl::UState::Unsharded)
    throw std::logic_error(detail::concat("[fsdp] full_param(", i, ") while sharded: call unshard() (or wait_unshard()) first"));
  return m.full_views[i];
}

void ShardedParams::reshard() {
  Impl& m = *impl_;
  if (m.ustate == Impl::UState::Posted) throw std::logic_error("[fsdp] reshard() while an unshard is in flight: wait_unshard() first");
  m.full_views.clear();
  m.full_params.reset();
  m.ag_send.reset();
  m.ustate = Impl::UState::Sharded;
}

}  // namespace meshmuon
