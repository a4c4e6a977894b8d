// Internal: the chunk pipeline of one step. The driving (calling) thread packs, posts the chunk
// collectives, polls them with test() and unpacks; a compute thread orthogonalizes the units whose
// inputs arrived. Posting order on every communicator is fixed (G0..G(w-1), S0, Gw, S1, ...), so
// ranks never disagree on collective order whatever their timing.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "dmuon/bf16.h"
#include "dmuon/update.h"
#include "exec/executor.h"

namespace dmuon::detail {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct PeerBuffers {
  std::vector<std::byte> send, recv;
  std::vector<int64_t> sc, sd, rc, rd;  // bytes per peer
};

struct ChunkRun {
  int index = 0;
  const ChunkRoutes* r = nullptr;
  int first_entry = 0;
  std::vector<size_t> params;                     // the chunk's parameters (state acquired / released)
  std::vector<std::vector<float>> update;         // per chunk entry: local shard update values
  std::vector<std::vector<float>> full, full_v;   // per assembly
  std::map<std::pair<int, int64_t>, size_t> assembly_of;
  PeerBuffers g, sc;
  std::vector<std::vector<std::byte>> rs_send, rs_recv;
  uint64_t state_sent = 0, state_recv = 0, bytes = 0;
  Event computed{std::make_shared<std::atomic<bool>>(false)};  // the compute stream passed this chunk
  bool gathered = false, scattered_posted = false, done = false;
  Clock::time_point gather_posted, scatter_posted;
  // Works last: destroyed first, while the buffers they use are still alive.
  Work gather, scatter;
  std::vector<Work> rs;
};

class Pipeline {
 public:
  Pipeline(Optimizer::Impl& s, const StepInputs& in) : s_(s), in_(in), plan_(s.plan), inv_(s.plan.inventory()) {
    elem_ = dtype_size(s.options.comm_dtype);
  }

  void run() {
    const auto& chunks = s_.routes.chunks;
    const int n = static_cast<int>(chunks.size());
    const int window = std::max(1, s_.options.window);
    std::vector<std::unique_ptr<ChunkRun>> runs(static_cast<size_t>(n));
    std::unique_ptr<Stream> compute = s_.backend->make_stream(s_.options.compute_thread);  // the compute thread
    Stream& worker = *compute;
    int started = 0, assembled = 0, scattered = 0, finished = 0;
    auto last = Clock::now();
    while (finished < n) {
      bool progress = false;
      // pass 1: start chunks while the window allows (a slot frees when a chunk's scatter is posted)
      while (started < n && started - scattered < window) {
        runs[static_cast<size_t>(started)] = start(started);
        ++started, progress = true;
      }
      // pass 2: gathers complete in chunk order -> assemble -> compute
      if (assembled < started) {
        ChunkRun& c = *runs[static_cast<size_t>(assembled)];
        if (ready(c.gather, c.gather_posted)) {
          assemble(c);
          ChunkRun* cp = &c;
          worker.submit([this, cp] { compute_chunk(*cp); });
          c.computed = worker.record();
          ++assembled, progress = true;
        }
      }
      worker.rethrow();
      // pass 3: scatter of the oldest computed chunk
      if (scattered < assembled) {
        ChunkRun& c = *runs[static_cast<size_t>(scattered)];
        if (c.computed.done()) {
          post_scatter(c);
          ++scattered, progress = true;
        }
      }
      // pass 4: completed scatters -> update local shards
      if (finished < scattered) {
        ChunkRun& c = *runs[static_cast<size_t>(finished)];
        bool all = ready(c.scatter, c.scatter_posted);
        for (Work& w : c.rs) all = ready(w, c.scatter_posted) && all;
        if (all) {
          finish(c);
          release(runs[static_cast<size_t>(finished)]);
          ++finished, progress = true;
        }
      }
      // counters: time with collectives in flight, and how much of it the compute thread covered
      const auto now = Clock::now();
      const double dt = std::chrono::duration<double>(now - last).count();
      last = now;
      const bool in_flight = started > finished && (assembled < started || scattered > finished);
      const bool computing = worker.busy();
      if (in_flight) {
        s_.stats.comm_seconds += dt;
        if (computing) hidden_ += dt;
      }
      if (!progress) {
        const auto t = Clock::now();
        if (in_flight || computing) std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (in_flight) s_.stats.comm_wait_seconds += seconds_since(t);
      }
    }
    worker.rethrow();
    s_.stats.orthogonalize_seconds += worker.busy_seconds();
    s_.stats.overlap = s_.stats.comm_seconds > 0 ? hidden_ / s_.stats.comm_seconds : 0;
    s_.stats.chunks = n;
  }

 private:
  const ParamLayout& layout(int param) const { return s_.routes.layouts[static_cast<size_t>(param)]; }
  int param_of(int entry) const { return plan_.entries()[static_cast<size_t>(entry)].param; }

  bool ready(Work& w, Clock::time_point posted) {
    if (w.completed() || w.test()) return true;
    const auto limit = work_timeout(s_, *s_.comm);
    if (Clock::now() - posted > limit) w.wait(limit);  // throws the comm's timeout error (or completes)
    return w.completed();
  }

  void track(ChunkRun& c, int64_t delta) {
    c.bytes += static_cast<uint64_t>(delta);
    live_ += static_cast<uint64_t>(delta);
    s_.stats.peak_buffer_bytes = std::max(s_.stats.peak_buffer_bytes, live_);
  }
  void release(std::unique_ptr<ChunkRun>& c) {
    live_ -= c->bytes;
    c.reset();
  }

  size_t payload_bytes(const Transfer& t) const {
    return static_cast<size_t>(t.count) * (t.what == Payload::Data ? elem_ : sizeof(float));
  }

  void layout_peers(const std::vector<Transfer>& send, const std::vector<Transfer>& recv, PeerBuffers& b, ChunkRun& c) {
    const size_t w = static_cast<size_t>(s_.comm->size());
    b.sc.assign(w, 0), b.rc.assign(w, 0);
    for (const Transfer& t : send) b.sc[static_cast<size_t>(t.peer)] += static_cast<int64_t>(payload_bytes(t));
    for (const Transfer& t : recv) b.rc[static_cast<size_t>(t.peer)] += static_cast<int64_t>(payload_bytes(t));
    b.sd = packed_displs(b.sc), b.rd = packed_displs(b.rc);
    b.send.resize(static_cast<size_t>(b.sd.back() + b.sc.back()));
    b.recv.resize(static_cast<size_t>(b.rd.back() + b.rc.back()));
    track(c, static_cast<int64_t>(b.send.size() + b.recv.size()));
  }

  // n == 0 happens for empty shards, whose buffers may be null (memcpy forbids null even then).
  void put_data(std::byte* dst, const float* src, int64_t n) const {
    if (n == 0) return;
    if (elem_ == 4) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    else float_to_bf16(src, reinterpret_cast<BFloat16*>(dst), static_cast<size_t>(n));
  }
  void get_data(float* dst, const std::byte* src, int64_t n) const {
    if (n == 0) return;
    if (elem_ == 4) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    else bf16_to_float(reinterpret_cast<const BFloat16*>(src), dst, static_cast<size_t>(n));
  }

  Box v_box_of(int param, int r) const {
    const ParamSpec& p = inv_.params[static_cast<size_t>(param)];
    return local_box(layout(param).v_shape, p.placements, inv_.meshes[static_cast<size_t>(p.mesh)], r);
  }

  // pass: momentum on local shards, pack the gather, post it
  std::unique_ptr<ChunkRun> start(int index) {
    const auto t0 = Clock::now();
    auto c = std::make_unique<ChunkRun>();
    c->index = index;
    c->r = &s_.routes.chunks[static_cast<size_t>(index)];
    c->first_entry = plan_.chunks()[static_cast<size_t>(index)].first_entry;
    c->update.resize(c->r->entries.size());
    for (int e : c->r->entries) c->params.push_back(static_cast<size_t>(param_of(e)));
    s_.state.acquire(c->params);  // released when the chunk finishes (offload plugs in here)
    for (size_t k = 0; k < c->r->entries.size(); ++k) {
      const int param = param_of(c->r->entries[k]);
      local_momentum(s_, in_, param, c->update[k]);
      track(*c, static_cast<int64_t>(c->update[k].size() * sizeof(float)));
    }
    for (int e : c->r->gram_entries) {  // blocking; before this chunk's collectives (fixed order)
      if (!in_.active[static_cast<size_t>(param_of(e))]) continue;  // skipped alike on every rank (agreed)
      std::vector<float>& u = c->update[static_cast<size_t>(e - c->first_entry)];
      run_gram(s_, in_, e, u);
      local_apply(s_, in_, param_of(e), u.data());
    }
    layout_peers(c->r->gather_send, c->r->gather_recv, c->g, *c);
    std::vector<int64_t> cursor = c->g.sd;
    for (const Transfer& t : c->r->gather_send) {
      const int param = param_of(t.entry);
      const ParamLayout& L = layout(param);
      std::byte* dst = c->g.send.data() + cursor[static_cast<size_t>(t.peer)];
      if (t.what == Payload::Data) {
        const UnitSpan sp = unit_span(L.box, L.expert, t.unit);
        put_data(dst, c->update[static_cast<size_t>(t.entry - c->first_entry)].data() + sp.offset, t.count);
      } else {
        const UnitSpan sp = unit_span(L.v_box, L.expert, t.unit);
        std::memcpy(dst, s_.state.data(static_cast<size_t>(param), StateKey::NormuonV) + sp.offset, static_cast<size_t>(t.count) * 4);
        c->state_sent += static_cast<uint64_t>(t.count) * 4;
      }
      cursor[static_cast<size_t>(t.peer)] += static_cast<int64_t>(payload_bytes(t));
    }
    c->gather = s_.comm->all_to_all_v(InBuffer(c->g.send.data(), CommType::U8, c->g.send.size()), c->g.sc, c->g.sd,
                                      OutBuffer(c->g.recv.data(), CommType::U8, c->g.recv.size()), c->g.rc, c->g.rd,
                                      "chunk " + std::to_string(index) + " gather");
    c->gather_posted = Clock::now();
    s_.stats.pack_seconds += seconds_since(t0);
    return c;
  }

  // pass: full units at this rank: own elements, then everything received
  void assemble(ChunkRun& c) {
    const auto t0 = Clock::now();
    const auto& as = c.r->assemblies;
    c.full.resize(as.size()), c.full_v.resize(as.size());
    for (size_t i = 0; i < as.size(); ++i) {
      const Assembly& a = as[i];
      const int param = param_of(a.entry);
      const ParamLayout& L = layout(param);
      c.assembly_of[{a.entry, a.unit}] = i;
      c.full[i].assign(static_cast<size_t>(L.unit_numel), 0.0f);
      track(c, L.unit_numel * 4);
      if (s_.param_normuon[static_cast<size_t>(param)]) {
        c.full_v[i].assign(static_cast<size_t>(L.v_len), 0.0f);
        track(c, L.v_len * 4);
      }
      if (!a.holder) continue;
      const float* src = c.update[static_cast<size_t>(a.entry - c.first_entry)].data() + unit_span(L.box, L.expert, a.unit).offset;
      for_each_run(L.box, L.shape, L.expert, a.unit, [&](int64_t off, int64_t len) {
        std::memcpy(c.full[i].data() + off, src, static_cast<size_t>(len) * 4);
        src += len;
      });
      if (!c.full_v[i].empty()) {
        const float* vs = s_.state.data(static_cast<size_t>(param), StateKey::NormuonV) + unit_span(L.v_box, L.expert, a.unit).offset;
        for_each_run(L.v_box, L.v_shape, L.expert, a.unit, [&](int64_t off, int64_t len) {
          std::memcpy(c.full_v[i].data() + off, vs, static_cast<size_t>(len) * 4);
          vs += len;
        });
      }
    }
    std::vector<int64_t> cursor = c.g.rd;
    for (const Transfer& t : c.r->gather_recv) {
      const int param = param_of(t.entry);
      const ParamLayout& L = layout(param);
      const size_t i = c.assembly_of.at({t.entry, t.unit});
      const std::byte* src = c.g.recv.data() + cursor[static_cast<size_t>(t.peer)];
      cursor[static_cast<size_t>(t.peer)] += static_cast<int64_t>(payload_bytes(t));
      if (t.what == Payload::Data) {
        const Box b = plan_.local_box(param, t.peer);
        for_each_run(b, L.shape, L.expert, t.unit, [&](int64_t off, int64_t len) {
          get_data(c.full[i].data() + off, src, len);
          src += static_cast<size_t>(len) * elem_;
        });
      } else {
        const Box b = v_box_of(param, t.peer);
        for_each_run(b, L.v_shape, L.expert, t.unit, [&](int64_t off, int64_t len) {
          std::memcpy(c.full_v[i].data() + off, src, static_cast<size_t>(len) * 4);
          src += static_cast<size_t>(len) * 4;
        });
        c.state_recv += static_cast<uint64_t>(t.count) * 4;
      }
    }
    c.gathered = true;
    s_.stats.pack_seconds += seconds_since(t0);
  }

  // compute stream: orthogonalize (+ NorMuon) every unit this rank computes
  void compute_chunk(ChunkRun& c) {
    std::vector<UnitJob> jobs;
    const auto& as = c.r->assemblies;
    for (size_t i = 0; i < as.size(); ++i) {
      if (!as[i].compute) continue;
      const int param = param_of(as[i].entry);
      if (!in_.active[static_cast<size_t>(param)]) continue;  // no gradient anywhere: zeros travel, nothing computed
      const ParamLayout& L = layout(param);
      jobs.push_back({param, c.full[i].data(), c.full_v[i].empty() ? nullptr : c.full_v[i].data(), 1, L.rows, L.cols});
    }
    compute_units(s_, in_, jobs);
  }

  // pass: own results out of the full units, pack and post the scatter (+ agrs reduce-scatters)
  void post_scatter(ChunkRun& c) {
    const auto t0 = Clock::now();
    const auto& as = c.r->assemblies;
    for (size_t i = 0; i < as.size(); ++i) {
      const Assembly& a = as[i];
      const int param = param_of(a.entry);
      const ParamLayout& L = layout(param);
      if (a.result_local && a.holder) {
        float* dst = c.update[static_cast<size_t>(a.entry - c.first_entry)].data() + unit_span(L.box, L.expert, a.unit).offset;
        for_each_run(L.box, L.shape, L.expert, a.unit, [&](int64_t off, int64_t len) {
          std::memcpy(dst, c.full[i].data() + off, static_cast<size_t>(len) * 4);
          dst += len;
        });
      }
      if (a.compute && !c.full_v[i].empty()) {
        float* vd = s_.state.data(static_cast<size_t>(param), StateKey::NormuonV) + unit_span(L.v_box, L.expert, a.unit).offset;
        for_each_run(L.v_box, L.v_shape, L.expert, a.unit, [&](int64_t off, int64_t len) {
          std::memcpy(vd, c.full_v[i].data() + off, static_cast<size_t>(len) * 4);
          vd += len;
        });
      }
    }
    layout_peers(c.r->scatter_send, c.r->scatter_recv, c.sc, c);
    std::vector<int64_t> cursor = c.sc.sd;
    for (const Transfer& t : c.r->scatter_send) {
      const int param = param_of(t.entry);
      const ParamLayout& L = layout(param);
      const size_t i = c.assembly_of.at({t.entry, t.unit});
      std::byte* dst = c.sc.send.data() + cursor[static_cast<size_t>(t.peer)];
      cursor[static_cast<size_t>(t.peer)] += static_cast<int64_t>(payload_bytes(t));
      if (t.what == Payload::Data) {
        const Box b = plan_.local_box(param, t.peer);
        for_each_run(b, L.shape, L.expert, t.unit, [&](int64_t off, int64_t len) {
          put_data(dst, c.full[i].data() + off, len);
          dst += static_cast<size_t>(len) * elem_;
        });
      } else {
        const Box b = v_box_of(param, t.peer);
        for_each_run(b, L.v_shape, L.expert, t.unit, [&](int64_t off, int64_t len) {
          std::memcpy(dst, c.full_v[i].data() + off, static_cast<size_t>(len) * 4);
          dst += static_cast<size_t>(len) * 4;
        });
        c.state_sent += static_cast<uint64_t>(t.count) * 4;
      }
    }
    c.scatter = s_.comm->all_to_all_v(InBuffer(c.sc.send.data(), CommType::U8, c.sc.send.size()), c.sc.sc, c.sc.sd,
                                      OutBuffer(c.sc.recv.data(), CommType::U8, c.sc.recv.size()), c.sc.rc, c.sc.rd,
                                      "chunk " + std::to_string(c.index) + " scatter");
    post_reduce_scatters(c);
    c.scatter_posted = Clock::now();
    s_.stats.pack_seconds += seconds_since(t0);
  }

  // agrs: the owner contributes its result, every other rank −0 (x + −0 == x exactly, signs kept)
  void post_reduce_scatters(ChunkRun& c) {
    const CommType type = comm_type(s_.options.comm_dtype);
    for (const ReduceScatter& rs : c.r->reduce_scatters) {
      int64_t total = 0;
      for (int64_t n : rs.counts) total += n;
      std::vector<std::byte> send(static_cast<size_t>(total) * elem_);
      track(c, static_cast<int64_t>(send.size()));
      std::byte* dst = send.data();
      for (size_t j = 0; j < rs.members.size(); ++j)
        for (int e : rs.entries) {
          const int param = param_of(e);
          const ParamLayout& L = layout(param);
          const Assembly& a = c.r->assemblies[c.assembly_of.at({e, 0})];
          const Box b = plan_.local_box(param, rs.members[j]);
          const float* full = c.full[c.assembly_of.at({e, 0})].data();
          for_each_run(b, L.shape, L.expert, 0, [&](int64_t off, int64_t len) {
            if (a.compute) {
              put_data(dst, full + off, len);
            } else {
              for (int64_t k = 0; k < len; ++k) {
                if (elem_ == 4) std::memcpy(dst + k * 4, &kNegZero, 4);
                else std::memcpy(dst + k * 2, &kNegZeroBf16, 2);
              }
            }
            dst += static_cast<size_t>(len) * elem_;
          });
        }
      const size_t me = static_cast<size_t>(s_.group_comms[static_cast<size_t>(rs.comm)]->rank());
      std::vector<std::byte> recv(static_cast<size_t>(rs.counts[me]) * elem_);
      track(c, static_cast<int64_t>(recv.size()));
      c.rs_send.push_back(std::move(send));
      c.rs_recv.push_back(std::move(recv));
      Communicator& gc = *s_.group_comms[static_cast<size_t>(rs.comm)];
      c.rs.push_back(gc.reduce_scatter_v(InBuffer(c.rs_send.back().data(), type, static_cast<size_t>(total)),
                                         OutBuffer(c.rs_recv.back().data(), type, static_cast<size_t>(rs.counts[me])),
                                         rs.counts, ReduceOp::Sum, "chunk " + std::to_string(c.index) + " agrs"));
    }
  }

  // pass: results into local update buffers, then the update on local shards
  void finish(ChunkRun& c) {
    const auto t0 = Clock::now();
    std::vector<int64_t> cursor = c.sc.rd;
    for (const Transfer& t : c.r->scatter_recv) {
      const int param = param_of(t.entry);
      const ParamLayout& L = layout(param);
      const std::byte* src = c.sc.recv.data() + cursor[static_cast<size_t>(t.peer)];
      cursor[static_cast<size_t>(t.peer)] += static_cast<int64_t>(payload_bytes(t));
      if (t.what == Payload::Data) {
        get_data(c.update[static_cast<size_t>(t.entry - c.first_entry)].data() + unit_span(L.box, L.expert, t.unit).offset, src, t.count);
      } else {
        std::memcpy(s_.state.data(static_cast<size_t>(param), StateKey::NormuonV) + unit_span(L.v_box, L.expert, t.unit).offset, src,
                    static_cast<size_t>(t.count) * 4);
        c.state_recv += static_cast<uint64_t>(t.count) * 4;
      }
    }
    for (size_t k = 0; k < c.r->reduce_scatters.size(); ++k) {
      const std::byte* src = c.rs_recv[k].data();
      for (int e : c.r->reduce_scatters[k].entries) {
        const int64_t n = layout(param_of(e)).local_numel;
        get_data(c.update[static_cast<size_t>(e - c.first_entry)].data(), src, n);
        src += static_cast<size_t>(n) * elem_;
      }
    }
    s_.stats.pack_seconds += seconds_since(t0);
    const auto t1 = Clock::now();
    for (int e : c.r->entries) {
      if (plan_.entries()[static_cast<size_t>(e)].strategy == Strategy::GramAllReduce) continue;
      if (!in_.active[static_cast<size_t>(param_of(e))]) continue;
      local_apply(s_, in_, param_of(e), c.update[static_cast<size_t>(e - c.first_entry)].data());
    }
    s_.stats.update_seconds += seconds_since(t1);
    s_.state.release(c.params);
    s_.stats.bytes_sent_state += c.state_sent;
    s_.stats.bytes_recv_state += c.state_recv;
    c.done = true;
  }

  static constexpr float kNegZero = -0.0f;
  static constexpr uint16_t kNegZeroBf16 = 0x8000;

  Optimizer::Impl& s_;
  const StepInputs& in_;
  const Plan& plan_;
  const Inventory& inv_;
  size_t elem_ = 4;
  uint64_t live_ = 0;
  double hidden_ = 0;
};

}  // namespace

void run_pipeline(Optimizer::Impl& s, const StepInputs& in) {
  Pipeline p(s, in);
  p.run();
}

}  // namespace dmuon::detail
