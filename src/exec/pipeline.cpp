// Internal: the chunk pipeline of one step. The driving (calling) thread runs the chunk's pack
// tables (routes.h), posts its messages and group collectives, polls them with test() and unpacks; a
// compute stream orthogonalizes the units whose inputs arrived. Posting order on every communicator
// is fixed (G0..G(w-1), S0, Gw, S1, ...), so ranks never disagree on collective or message order
// whatever their timing. Each chunk's transient memory is one arena from the backend, reused.
//
// State offload (OptimizerOptions::offload_state): a chunk's state is acquired when it starts and
// released when it finishes; the next chunk's is prefetched as soon as at most `window` chunks
// hold state, so its copy-in overlaps the compute of the chunks in flight. A scatter is posted
// only once the chunks before it have finished, so at most window + 1 chunks hold state at once
// (started − scattered ≤ window, scattered − finished ≤ 1), prefetch included; this delays
// scatters, never gathers, so the posting order stays the same.
#include "exec/pipeline.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "comm/poll.h"
#include "exec/gram_allreduce.h"

namespace meshmuon::detail {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct ChunkRun {
  int index = 0;
  const ChunkRoutes* r = nullptr;
  Buffer arena;
  std::vector<std::byte*> bases;  // 0: the arena; 1 + i: the NorMuon state of r->state_params[i]
  Event computed;                 // the compute stream's job for this chunk has queued its work
  Fence results;                  // the compute stream's point after this chunk's results (set by its job)
  Clock::time_point gather_posted, scatter_posted;
  // Works last: destroyed first, while the buffers they use are still alive.
  std::vector<Work> gather, scatter;
  float* f32(int64_t offset) const { return reinterpret_cast<float*>(bases[0] + offset); }
};

class Pipeline {
 public:
  explicit Pipeline(const PipelineContext& ctx) : x_(ctx), in_(ctx.in), plan_(ctx.plan) {}

  void run() {
    const auto& chunks = x_.routes.chunks;
    const int n = static_cast<int>(chunks.size());
    const int window = std::max(1, x_.window);
    std::vector<std::unique_ptr<ChunkRun>> runs(static_cast<size_t>(n));
    // One chunk on a host backend: nothing to overlap (its gather precedes and its scatter follows
    // the compute), so it runs on this thread; a worker thread would only add the hand-off and this
    // thread's idle polls, which take cycles from the compute on a rank with one core. (A device
    // backend's worker only queues work, so it keeps its thread.)
    const bool one_host_chunk = n == 1 && !x_.backend.capabilities().device_memory;
    Stream& worker = x_.compute.pipeline_stream(x_.compute_thread && !one_host_chunk);
    // Declared after `runs`, so on an error it goes first: the streams are dropped (their
    // destructors drain their jobs, wait for their device work and join their workers) while the
    // chunks their jobs use are still alive.
    struct DropOnError {
      ComputeStreams& compute;
      bool ok = false;
      ~DropOnError() {
        if (!ok) compute.drop();
      }
    } drop{x_.compute};
    int started = 0, assembled = 0, scattered = 0, finished = 0;
    int resident = 0;  // offload: chunks whose state was prefetched or acquired
    const bool offload = x_.state.offload();
    PollBackoff backoff;
    auto last = Clock::now();
    while (finished < n) {
      bool progress = false;
      // pass 1: start chunks while the window allows (a slot frees when a chunk's scatter is posted)
      while (started < n && started - scattered < window) {
        runs[static_cast<size_t>(started)] = start(started);
        ++started, progress = true;
        resident = std::max(resident, started);
      }
      // offload: the next chunk's copy-in, while at most `window` chunks hold state
      if (offload && resident == started && resident < n && started - finished <= window) {
        x_.state.prefetch(chunks[static_cast<size_t>(resident)].params);
        ++resident;
      }
      // pass 2: gathers complete in chunk order -> assemble -> compute
      if (assembled < started) {
        ChunkRun& c = *runs[static_cast<size_t>(assembled)];
        if (poll_works(c.gather, c.gather_posted, x_.timeout)) {
          Fence unpacked;
          timed([&] {
            x_.backend.pack(c.r->unpack_gather, c.bases);
            unpacked = x_.backend.fence();  // the compute stream reads the units after this point
          });
          ChunkRun* cp = &c;
          // On the device, the job's stream waits for the unpack (not the host), and the scatter's
          // pack for the job's results (post_scatter): the compute thread goes on to the next chunk
          // while the device still runs this one (JobEnd::Queued).
          worker.submit(
              [this, cp] {
                compute_chunk(*cp);
                cp->results = x_.backend.fence();
              },
              unpacked);
          c.computed = worker.record();
          ++assembled, progress = true;
        }
      }
      worker.rethrow();
      // pass 3: scatter of the oldest computed chunk (offload: once the chunks before it finished)
      if (scattered < assembled && (!offload || scattered == finished)) {
        ChunkRun& c = *runs[static_cast<size_t>(scattered)];
        if (c.computed.done()) {
          post_scatter(c);
          ++scattered, progress = true;
        }
      }
      // pass 4: completed scatters -> update local shards
      if (finished < scattered) {
        ChunkRun& c = *runs[static_cast<size_t>(finished)];
        if (poll_works(c.scatter, c.scatter_posted, x_.timeout)) {
          finish(c);
          release(runs[static_cast<size_t>(finished)]);
          ++finished, progress = true;
        }
      }
      // counters: time with collectives in flight, and how much of it the compute stream covered
      const auto now = Clock::now();
      const double dt = std::chrono::duration<double>(now - last).count();
      last = now;
      const bool in_flight = started > finished && (assembled < started || scattered > finished);
      const bool computing = worker.busy();
      if (in_flight) {
        x_.stats.comm_seconds += dt;
        if (computing) hidden_ += dt;
      }
      if (progress) {
        backoff.progressed();
      } else if (in_flight || computing) {
        const auto t = Clock::now();
        backoff.idle();
        if (in_flight) x_.stats.comm_wait_seconds += seconds_since(t);
      }
    }
    worker.rethrow();
    drop.ok = true;  // every job ran; each chunk's scatter was queued after its results (a fence)
    x_.stats.overlap = x_.stats.comm_seconds > 0 ? hidden_ / x_.stats.comm_seconds : 0;
    x_.stats.chunks = n;
  }

 private:
  int param_of(int entry) const { return plan_.entries()[static_cast<size_t>(entry)].param; }

  // A gram_allreduce entry of a chunk, blocking, on this thread (gram_allreduce.h).
  void gram(int entry, float* update) {
    const PlanEntry& e = plan_.entries()[static_cast<size_t>(entry)];
    const GroupKey key{e.mesh, e.group_dims};
    size_t gi = 0;
    while (!(x_.routes.group_keys[gi] == key)) ++gi;
    const size_t p = static_cast<size_t>(e.param);
    run_gram(x_.backend, *x_.group_comms[gi], x_.routes.layouts[p], x_.table.names[p], in_.options_of(x_.table, p).ns, update,
             x_.comm_dtype, x_.timeout);
  }

  template <class F>
  void timed(F&& f) {
    const auto t0 = Clock::now();
    f();
    x_.stats.pack_seconds += seconds_since(t0);
  }

  void release(std::unique_ptr<ChunkRun>& c) {
    live_ -= static_cast<uint64_t>(c->r->arena_bytes);
    c->gather.clear(), c->scatter.clear();
    x_.arenas.give(std::move(c->arena));
    c.reset();
  }

  // The communicators a phase posts on (the optimizer's, when it has messages, and those of its group
  // calls) start their operations after the device work this thread queued so far (the pack that
  // wrote the arena): on the device where they can (nccl), else the host waits for it here.
  void order_posts(size_t messages, const std::vector<GroupCall>& calls) {
    if (messages == 0 && calls.empty()) return;
    const Fence packed = x_.backend.fence();
    if (packed.empty()) return;  // the cpu backend: the pack is done
    if (messages) x_.comm.order_after(packed.event());
    std::vector<int> seen;
    for (const GroupCall& g : calls) {
      if (std::find(seen.begin(), seen.end(), g.comm) != seen.end()) continue;
      seen.push_back(g.comm);
      x_.group_comms[static_cast<size_t>(g.comm)]->order_after(packed.event());
    }
  }

  // grouped point-to-point messages of one phase on the optimizer's communicator
  void post_messages(ChunkRun& c, const std::vector<Message>& sends, const std::vector<Message>& recvs,
                     const std::string& label, std::vector<Work>& out) {
    if (sends.empty() && recvs.empty()) return;
    Communicator& comm = x_.comm;
    comm.group_begin();
    for (const Message& m : sends)
      (void)comm.send(InBuffer(c.bases[0] + m.offset, CommType::U8, static_cast<size_t>(m.bytes)), m.peer, label);
    for (const Message& m : recvs)
      (void)comm.recv(OutBuffer(c.bases[0] + m.offset, CommType::U8, static_cast<size_t>(m.bytes)), m.peer, label);
    out.push_back(comm.group_end(label));
  }

  void post_calls(ChunkRun& c, const std::vector<GroupCall>& calls, const std::string& label, std::vector<Work>& out) {
    for (const GroupCall& g : calls) {
      Communicator& comm = *x_.group_comms[static_cast<size_t>(g.comm)];
      const InBuffer send(c.bases[0] + g.send_offset, g.type, static_cast<size_t>(g.send_count));
      const OutBuffer recv(c.bases[0] + g.recv_offset, g.type, static_cast<size_t>(g.recv_count));
      if (g.channel == Channel::AllGather) out.push_back(comm.all_gather_v(send, recv, g.counts, label + " all-gather"));
      else out.push_back(comm.reduce_scatter_v(send, recv, g.counts, ReduceOp::Sum, label + " reduce-scatter"));
    }
  }

  // pass: momentum on local shards, pack the gather, post it
  std::unique_ptr<ChunkRun> start(int index) {
    const auto t0 = Clock::now();
    auto c = std::make_unique<ChunkRun>();
    c->index = index;
    c->r = &x_.routes.chunks[static_cast<size_t>(index)];
    const ChunkRoutes& r = *c->r;
    c->arena = x_.arenas.take(x_.backend, static_cast<size_t>(r.arena_bytes));
    live_ += static_cast<uint64_t>(r.arena_bytes);
    x_.stats.peak_buffer_bytes = std::max(x_.stats.peak_buffer_bytes, live_);
    x_.state.acquire(r.params);  // released when the chunk finishes (offload plugs in here)
    c->bases.push_back(static_cast<std::byte*>(c->arena.data()));
    for (int p : r.state_params)
      c->bases.push_back(reinterpret_cast<std::byte*>(x_.state.data(static_cast<size_t>(p), StateKey::NormuonV)));
    std::vector<UpdateTarget> targets;  // the chunk's momentum in one multi-tensor call
    targets.reserve(r.entries.size());
    for (size_t k = 0; k < r.entries.size(); ++k) targets.push_back({param_of(r.entries[k]), c->f32(r.update_offset[k])});
    x_.update.momentum(targets);
    for (int e : r.gram_entries) {  // blocking; before this chunk's collectives (fixed order)
      if (!in_.active[static_cast<size_t>(param_of(e))]) continue;  // skipped alike on every rank (agreed)
      float* u = c->f32(r.update_offset[static_cast<size_t>(e - r.entries.front())]);
      gram(e, u);
      const UpdateTarget one{param_of(e), u};
      x_.update.apply(std::span<const UpdateTarget>(&one, 1));
    }
    x_.backend.pack(r.pack_gather, c->bases);
    order_posts(r.gather_send.size() + r.gather_recv.size(), r.gather_calls);  // the communicators read the arena
    const std::string label = "chunk " + std::to_string(index) + " gather";
    post_messages(*c, r.gather_send, r.gather_recv, label, c->gather);
    post_calls(*c, r.gather_calls, label, c->gather);
    c->gather_posted = Clock::now();
    x_.stats.pack_seconds += seconds_since(t0);
    return c;
  }

  // compute stream: orthogonalize (+ NorMuon) every unit this rank computes
  void compute_chunk(ChunkRun& c) {
    std::vector<UnitJob> jobs;
    jobs.reserve(c.r->compute.size());
    for (const ComputeUnit& u : c.r->compute) {
      if (!in_.active[static_cast<size_t>(u.param)]) continue;  // no gradient anywhere: zeros travel, nothing computed
      const ParamLayout& L = x_.routes.layouts[static_cast<size_t>(u.param)];
      float* data = c.f32(u.full_offset);
      float* v = u.v_offset >= 0 ? c.f32(u.v_offset) : nullptr;
      if (L.split.empty()) {
        jobs.push_back({u.param, data, v, 1, L.rows, L.cols});
        continue;
      }
      // row blocks (ParamSpec::split): each a contiguous row-major sub-matrix of the full unit,
      // orthogonalized as a matrix of its own; its NorMuon state is its rows of the per-row state
      int64_t row = 0;
      for (int64_t b : L.split) {
        jobs.push_back({u.param, data + row * L.cols, v ? v + row : nullptr, 1, b, L.cols});
        row += b;
      }
    }
    x_.compute.compute(jobs, x_.table.group_of, in_.options, x_.comm_dtype);
  }

  // pass: own results out of the full units, pack and post the scatter
  void post_scatter(ChunkRun& c) {
    const auto t0 = Clock::now();
    x_.backend.wait(c.results.event());  // the compute stream's results, on the device (no host wait)
    x_.backend.pack(c.r->pack_scatter, c.bases);
    order_posts(c.r->scatter_send.size() + c.r->scatter_recv.size(), c.r->scatter_calls);  // they read the arena
    const std::string label = "chunk " + std::to_string(c.index) + " scatter";
    post_messages(c, c.r->scatter_send, c.r->scatter_recv, label, c.scatter);
    post_calls(c, c.r->scatter_calls, label, c.scatter);
    c.scatter_posted = Clock::now();
    x_.stats.pack_seconds += seconds_since(t0);
  }

  // pass: results into local update buffers, then the update on local shards
  void finish(ChunkRun& c) {
    const ChunkRoutes& r = *c.r;
    timed([&] { x_.backend.pack(r.unpack_scatter, c.bases); });
    const auto t1 = Clock::now();
    std::vector<UpdateTarget> targets;  // the chunk's updates in one multi-tensor call
    targets.reserve(r.entries.size());
    for (size_t k = 0; k < r.entries.size(); ++k) {
      const int e = r.entries[k];
      if (plan_.entries()[static_cast<size_t>(e)].strategy == Strategy::GramAllReduce) continue;
      if (!in_.active[static_cast<size_t>(param_of(e))]) continue;
      targets.push_back({param_of(e), c.f32(r.update_offset[k])});
    }
    x_.update.apply(targets);
    x_.stats.update_seconds += seconds_since(t1);
    x_.state.release(r.params);
    x_.stats.bytes_sent_state += r.state_sent;
    x_.stats.bytes_recv_state += r.state_recv;
  }

  const PipelineContext& x_;
  const StepInputs& in_;
  const Plan& plan_;
  uint64_t live_ = 0;
  double hidden_ = 0;
};

}  // namespace

void run_pipeline(const PipelineContext& ctx) {
  Pipeline p(ctx);
  p.run();
}

}  // namespace meshmuon::detail
