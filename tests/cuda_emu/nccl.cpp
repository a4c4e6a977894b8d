// The emulated NCCL (tests/cuda_emu, README.md there): the entry points meshmuon's loader takes
// (src/comm/nccl/nccl_loader.h), exported under NCCL's names from this library, which the emulated
// tests name in MESHMUON_NCCL_LIBRARY. The ranks of a communicator are threads of this process (one
// emulated device each, or all on one): a collective is an op on the caller's stream (streams.h)
// that, when its stream runs it, checks in and waits (Blocked) until every rank of the communicator
// has checked in; the last one moves the data for all. Grouped sends and receives are matched per
// (sender, receiver) pair in posting order, as NCCL's rule; a send completes once its receiver has
// copied it. Abort releases the aborted rank's waiting ops. Every buffer must be one live device
// (or pinned) allocation, as a GPU would fault otherwise. Reductions run in rank order (bf16 rounded
// after each addition), so integer-valued data gives exact results.
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "bits.h"
#include "device_memory.h"
#include "streams.h"

namespace {

using namespace meshmuon::cuda_emu;

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}


template <class T> T combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclProd: return static_cast<T>(a * b);
    case ncclMax: return a < b ? b : a;
    case ncclMin: return b < a ? b : a;
    default: return static_cast<T>(a + b);  // ncclSum (integers wrap as unsigned arithmetic would)
  }
}

// acc[i] = acc[i] (op) x[i] for n elements of type t.
void reduce_into(void* acc, const void* x, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  auto each = [&](auto tag) {
    using T = decltype(tag);
    auto* a = static_cast<T*>(acc);
    const auto* b = static_cast<const T*>(x);
    for (size_t i = 0; i < n; ++i) a[i] = combine<T>(a[i], b[i], op);
  };
  switch (t) {
    case ncclInt8: each(int8_t{}); break;
    case ncclUint8: each(uint8_t{}); break;
    case ncclInt32: each(int32_t{}); break;
    case ncclUint32: each(uint32_t{}); break;
    case ncclInt64: each(int64_t{}); break;
    case ncclUint64: each(uint64_t{}); break;
    case ncclFloat32: each(float{}); break;
    case ncclFloat64: each(double{}); break;
    case ncclBfloat16: {
      auto* a = static_cast<uint16_t*>(acc);
      const auto* b = static_cast<const uint16_t*>(x);
      for (size_t i = 0; i < n; ++i) a[i] = float_to_bf16(combine<float>(bf16_to_float(a[i]), bf16_to_float(b[i]), op));
      break;
    }
    default: break;
  }
}

enum class Kind { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter };

// One rank's part of a collective.
struct Part {
  const void* send = nullptr;
  void* recv = nullptr;
};
struct Collective {
  std::vector<Part> parts;
  int arrived = 0, finished = 0;
  bool done = false;
};
// A send waiting for its receive.
struct Mail {
  const void* data = nullptr;
  size_t bytes = 0;
  std::shared_ptr<std::atomic<bool>> taken = std::make_shared<std::atomic<bool>>(false);
};
struct SplitCall {
  std::vector<int> colors, keys;
  int arrived = 0;
  std::map<int, std::shared_ptr<struct Clique>> children;  // per color
};

struct Clique {
  explicit Clique(int n) : size(n) {}
  int size;
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Collective> collectives;          // by sequence number
  std::map<std::pair<int, int>, std::deque<Mail>> mail;  // (from, to) in posting order
  std::map<uint64_t, SplitCall> splits;
};

struct CommState {
  std::shared_ptr<Clique> clique;
  int rank = 0, size = 0;
  uint64_t seq = 0, split_seq = 0;  // the host's posting order (the same on every rank)
  std::atomic<bool> aborted{false};
  // What real NCCL would have connected by now (it connects lazily): collectives posted, and the
  // peers of point-to-point calls posted (ncclEmuConnections).
  std::atomic<int> collectives{0};
  std::mutex peers_mu;
  std::vector<int> peers;
};

}  // namespace

struct ncclComm {
  std::shared_ptr<CommState> st;
};

namespace {

std::mutex g_registry_mu;
std::map<std::string, std::shared_ptr<Clique>> g_registry;  // by unique id

// Grouped point-to-point calls of this thread (ncclGroupStart .. ncclGroupEnd).
struct P2p {
  std::shared_ptr<CommState> st;
  cudaStream_t stream;
  bool send;
  int peer;
  void* buf;
  size_t bytes;
};
thread_local int tl_group_depth = 0;
thread_local std::weak_ptr<CommState> tl_last_made;  // the communicator this thread made last
thread_local std::vector<P2p> tl_group;

bool ok_comm(ncclComm_t c) { return c != nullptr && c->st != nullptr; }

bool buffer_ok(const void* p, size_t bytes, const char* what) { return bytes == 0 || expect_device(p, bytes, what); }

// The op of one rank's part in collective `seq`: checks in, then waits for the others; the last
// to check in moves the data for everyone.
OpStatus run_collective(const std::shared_ptr<CommState>& st, uint64_t seq, Part part, Kind kind, size_t count,
                        ncclDataType_t type, ncclRedOp_t op, int root, std::shared_ptr<bool> checked_in) {
  Clique& q = *st->clique;
  std::unique_lock<std::mutex> lock(q.mu);
  Collective& c = q.collectives[seq];
  if (c.parts.empty()) c.parts.resize(static_cast<size_t>(q.size));
  if (!*checked_in) {
    c.parts[static_cast<size_t>(st->rank)] = part;
    ++c.arrived, *checked_in = true;
    if (c.arrived == q.size) {
      DeviceScope scope;
      const size_t es = type_size(type), bytes = count * es;
      const int n = q.size;
      switch (kind) {
        case Kind::AllReduce:
        case Kind::Reduce: {
          std::vector<std::byte> acc(static_cast<const std::byte*>(c.parts[0].send),
                                     static_cast<const std::byte*>(c.parts[0].send) + bytes);
          for (int r = 1; r < n; ++r) reduce_into(acc.data(), c.parts[static_cast<size_t>(r)].send, count, type, op);
          for (int r = 0; r < n; ++r)
            if (kind == Kind::AllReduce || r == root) std::memcpy(c.parts[static_cast<size_t>(r)].recv, acc.data(), bytes);
          break;
        }
        case Kind::Broadcast: {
          std::vector<std::byte> b(static_cast<const std::byte*>(c.parts[static_cast<size_t>(root)].send),
                                   static_cast<const std::byte*>(c.parts[static_cast<size_t>(root)].send) + bytes);
          for (int r = 0; r < n; ++r) std::memcpy(c.parts[static_cast<size_t>(r)].recv, b.data(), bytes);
          break;
        }
        case Kind::AllGather: {  // count per rank
          std::vector<std::byte> all(bytes * static_cast<size_t>(n));
          for (int r = 0; r < n; ++r) std::memcpy(all.data() + bytes * static_cast<size_t>(r), c.parts[static_cast<size_t>(r)].send, bytes);
          for (int r = 0; r < n; ++r) std::memcpy(c.parts[static_cast<size_t>(r)].recv, all.data(), all.size());
          break;
        }
        case Kind::ReduceScatter: {  // count per rank
          std::vector<std::vector<std::byte>> out(static_cast<size_t>(n));
          for (int r = 0; r < n; ++r) {
            const auto* first = static_cast<const std::byte*>(c.parts[0].send) + bytes * static_cast<size_t>(r);
            out[static_cast<size_t>(r)].assign(first, first + bytes);
            for (int j = 1; j < n; ++j)
              reduce_into(out[static_cast<size_t>(r)].data(),
                          static_cast<const std::byte*>(c.parts[static_cast<size_t>(j)].send) + bytes * static_cast<size_t>(r),
                          count, type, op);
          }
          for (int r = 0; r < n; ++r) std::memcpy(c.parts[static_cast<size_t>(r)].recv, out[static_cast<size_t>(r)].data(), bytes);
          break;
        }
      }
      c.done = true;
      q.cv.notify_all();
    }
  }
  if (!c.done && !st->aborted.load()) return OpStatus::Blocked;
  if (++c.finished == q.size) q.collectives.erase(seq);
  return OpStatus::Done;
}

ncclResult_t collective(Kind kind, const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream, const char* name) {
  if (!ok_comm(comm)) return ncclInvalidArgument;
  const std::shared_ptr<CommState> st = comm->st;
  if (st->aborted.load()) return ncclInvalidUsage;
  const size_t es = type_size(type);
  if (es == 0) return ncclInvalidArgument;
  if ((kind == Kind::Broadcast || kind == Kind::Reduce) && (root < 0 || root >= st->size)) return ncclInvalidArgument;
  const size_t n = static_cast<size_t>(st->size), bytes = count * es;
  const size_t send_bytes = kind == Kind::ReduceScatter ? bytes * n : (kind == Kind::Broadcast && st->rank != root ? 0 : bytes);
  const size_t recv_bytes = kind == Kind::AllGather ? bytes * n : (kind == Kind::Reduce && st->rank != root ? 0 : bytes);
  if (!buffer_ok(send, send_bytes, name) || !buffer_ok(recv, recv_bytes, name)) return ncclInvalidArgument;
  const uint64_t seq = st->seq++;
  st->collectives++;
  auto checked_in = std::make_shared<bool>(false);
  submit_op(stream, [=] { return run_collective(st, seq, {send, recv}, kind, count, type, op, root, checked_in); });
  return ncclSuccess;
}

// One rank's grouped sends and receives on one stream: posts its sends, takes its receives in
// order as their sends arrive, and is done once every receive has its data and every send was taken.
OpStatus run_p2p(const std::shared_ptr<CommState>& st, const std::vector<P2p>& ops, std::shared_ptr<std::vector<Mail>> posted,
                 std::shared_ptr<std::vector<bool>> got) {
  Clique& q = *st->clique;
  std::lock_guard<std::mutex> lock(q.mu);
  if (posted->empty() && got->empty()) {  // first run: post the sends (their data is ready now)
    got->assign(ops.size(), false);
    for (const P2p& o : ops)
      if (o.send) {
        Mail m{o.buf, o.bytes};
        q.mail[{st->rank, o.peer}].push_back(m);
        posted->push_back(m);
      }
  }
  bool all = true;
  for (size_t k = 0; k < ops.size(); ++k) {
    const P2p& o = ops[k];
    if (o.send || (*got)[k]) continue;
    std::deque<Mail>& box = q.mail[{o.peer, st->rank}];
    if (box.empty()) {
      all = false;
      continue;
    }
    // posting order per pair: the earliest receive of this pair must take the earliest send
    bool earlier_pending = false;
    for (size_t j = 0; j < k; ++j) earlier_pending = earlier_pending || (!ops[j].send && ops[j].peer == o.peer && !(*got)[j]);
    if (earlier_pending) {
      all = false;
      continue;
    }
    Mail m = box.front();
    if (m.bytes > o.bytes) {
      std::fprintf(stderr, "[cuda_emu] nccl: rank %d receives %zu bytes from %d where %zu were sent\n", st->rank, o.bytes,
                   o.peer, m.bytes);
      return OpStatus::Fault;
    }
    box.pop_front();
    {
      DeviceScope scope;
      std::memcpy(o.buf, m.data, m.bytes);
    }
    m.taken->store(true);
    (*got)[k] = true;
  }
  for (const Mail& m : *posted) all = all && m.taken->load();
  if (!all && !st->aborted.load()) return OpStatus::Blocked;
  return OpStatus::Done;
}

void submit_group(std::vector<P2p> calls) {
  // one op per (communicator, stream), in the order of their first call
  std::vector<std::vector<P2p>> lists;
  for (P2p& c : calls) {
    auto it = std::find_if(lists.begin(), lists.end(),
                           [&](const std::vector<P2p>& l) { return l.front().st == c.st && l.front().stream == c.stream; });
    if (it == lists.end()) lists.push_back({c});
    else it->push_back(c);
  }
  for (std::vector<P2p>& l : lists) {
    auto st = l.front().st;
    const cudaStream_t stream = l.front().stream;
    auto posted = std::make_shared<std::vector<Mail>>();
    auto got = std::make_shared<std::vector<bool>>();
    submit_op(stream, [st, ops = std::move(l), posted, got] { return run_p2p(st, ops, posted, got); });
  }
}

ncclResult_t p2p(bool send, void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  if (!ok_comm(comm)) return ncclInvalidArgument;
  const size_t es = type_size(type);
  if (es == 0 || peer < 0 || peer >= comm->st->size) return ncclInvalidArgument;
  if (comm->st->aborted.load()) return ncclInvalidUsage;
  if (!buffer_ok(buf, count * es, send ? "ncclSend" : "ncclRecv")) return ncclInvalidArgument;
  {
    std::lock_guard<std::mutex> lock(comm->st->peers_mu);
    auto& peers = comm->st->peers;
    if (std::find(peers.begin(), peers.end(), peer) == peers.end()) peers.push_back(peer);
  }
  tl_group.push_back({comm->st, stream, send, peer, buf, count * es});
  if (tl_group_depth == 0) {  // outside a group: a group of one
    std::vector<P2p> one;
    one.swap(tl_group);
    submit_group(std::move(one));
  }
  return ncclSuccess;
}

}  // namespace

#define NCCL_EMU_API extern "C" __attribute__((visibility("default")))

NCCL_EMU_API ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

NCCL_EMU_API ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < sizeof id->internal; i += 8) {
    const uint64_t x = rng();
    std::memcpy(id->internal + i, &x, std::min<size_t>(8, sizeof id->internal - i));
  }
  return ncclSuccess;
}

NCCL_EMU_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t*) {
  if (comm == nullptr || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return ncclUnhandledCudaError;
  std::shared_ptr<Clique> q;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    auto& slot = g_registry[std::string(id.internal, sizeof id.internal)];
    if (!slot) slot = std::make_shared<Clique>(nranks);
    if (slot->size != nranks) return ncclInvalidUsage;
    q = slot;
  }
  auto st = std::make_shared<CommState>();
  st->clique = q, st->rank = rank, st->size = nranks;
  tl_last_made = st;
  *comm = new ncclComm{st};
  return ncclSuccess;
}

NCCL_EMU_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
  if (!ok_comm(comm) || newcomm == nullptr) return ncclInvalidArgument;
  const std::shared_ptr<CommState> st = comm->st;
  Clique& q = *st->clique;
  std::unique_lock<std::mutex> lock(q.mu);
  const uint64_t seq = st->split_seq++;
  SplitCall& s = q.splits[seq];
  if (s.colors.empty()) s.colors.assign(static_cast<size_t>(q.size), NCCL_SPLIT_NOCOLOR), s.keys.assign(static_cast<size_t>(q.size), 0);
  s.colors[static_cast<size_t>(st->rank)] = color, s.keys[static_cast<size_t>(st->rank)] = key;
  if (++s.arrived == q.size) q.cv.notify_all();
  // a host collective: every rank of the parent calls it (bounded, as NCCL's init would time out)
  if (!q.cv.wait_for(lock, std::chrono::seconds(60), [&] { return s.arrived == q.size; })) return ncclSystemError;
  if (color == NCCL_SPLIT_NOCOLOR) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  std::vector<std::pair<int, int>> members;  // (key, parent rank)
  for (int r = 0; r < q.size; ++r)
    if (s.colors[static_cast<size_t>(r)] == color) members.emplace_back(s.keys[static_cast<size_t>(r)], r);
  std::sort(members.begin(), members.end());
  auto& child = s.children[color];
  if (!child) child = std::make_shared<Clique>(static_cast<int>(members.size()));
  auto sub = std::make_shared<CommState>();
  sub->clique = child, sub->size = static_cast<int>(members.size());
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].second == st->rank) sub->rank = static_cast<int>(i);
  tl_last_made = sub;
  *newcomm = new ncclComm{sub};
  return ncclSuccess;
}

// Tests: for the communicator this thread made last, the distinct peers it has posted sends or
// receives to and the collectives it has posted (what real NCCL would have connected by now).
// False when this thread made none (or it is gone).
NCCL_EMU_API bool ncclEmuConnections(int* peers, int* collectives) {
  const std::shared_ptr<CommState> st = tl_last_made.lock();
  if (!st) return false;
  std::lock_guard<std::mutex> lock(st->peers_mu);
  *peers = static_cast<int>(st->peers.size());
  *collectives = st->collectives.load();
  return true;
}

NCCL_EMU_API ncclResult_t ncclCommFinalize(ncclComm_t comm) { return ok_comm(comm) ? ncclSuccess : ncclInvalidArgument; }
NCCL_EMU_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!ok_comm(comm)) return ncclInvalidArgument;
  delete comm;  // queued ops keep the state alive
  return ncclSuccess;
}
NCCL_EMU_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!ok_comm(comm)) return ncclInvalidArgument;
  comm->st->aborted.store(true);  // its waiting ops end (their data untouched)
  delete comm;
  return ncclSuccess;
}
NCCL_EMU_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (!ok_comm(comm) || error == nullptr) return ncclInvalidArgument;
  *error = ncclSuccess;
  return ncclSuccess;
}
NCCL_EMU_API const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error (nccl emulation)";
    case ncclInvalidArgument: return "invalid argument (nccl emulation)";
    case ncclInvalidUsage: return "invalid usage (nccl emulation)";
    case ncclUnhandledCudaError: return "unhandled cuda error (nccl emulation)";
    case ncclSystemError: return "system error (nccl emulation)";
    default: return "error (nccl emulation)";
  }
}
NCCL_EMU_API const char* ncclGetLastError(ncclComm_t) { return ""; }

NCCL_EMU_API ncclResult_t ncclGroupStart() {
  ++tl_group_depth;
  return ncclSuccess;
}
NCCL_EMU_API ncclResult_t ncclGroupEnd() {
  if (tl_group_depth == 0) return ncclInvalidUsage;
  if (--tl_group_depth > 0) return ncclSuccess;
  std::vector<P2p> calls;
  calls.swap(tl_group);
  if (!calls.empty()) submit_group(std::move(calls));
  return ncclSuccess;
}

NCCL_EMU_API ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                                   cudaStream_t stream) {
  return p2p(true, const_cast<void*>(buf), count, type, peer, comm, stream);
}
NCCL_EMU_API ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                                   cudaStream_t stream) {
  return p2p(false, buf, count, type, peer, comm, stream);
}
NCCL_EMU_API ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                        ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::AllReduce, send, recv, count, type, op, 0, comm, stream, "ncclAllReduce");
}
NCCL_EMU_API ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                        ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::Broadcast, send, recv, count, type, ncclSum, root, comm, stream, "ncclBroadcast");
}
NCCL_EMU_API ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                     int root, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::Reduce, send, recv, count, type, op, root, comm, stream, "ncclReduce");
}
NCCL_EMU_API ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                                        cudaStream_t stream) {
  return collective(Kind::AllGather, send, recv, count, type, ncclSum, 0, comm, stream, "ncclAllGather");
}
NCCL_EMU_API ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::ReduceScatter, send, recv, count, type, op, 0, comm, stream, "ncclReduceScatter");
}
