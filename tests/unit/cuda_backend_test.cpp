// The cuda backend (src/backend/cuda) beyond the conformance suite: what only a device backend has
// (buffers, streams and events, queued jobs, copies between host, pinned and device memory, the
// pinned upload ring of pack tables, state offload through device slots, caller streams, device
// faults), its own kernels' internals (the device NorMuon, the batched-product probe and counters,
// the block columns of the symmetric products, multi-tensor argument checks), and the engine on it.
// Every kernel-interface method against the cpu backend (bitwise, or NS within its bound) is
// tests/conformance (conformance_cuda, conformance_cuda_emu). Every test needs a CUDA device and is
// skipped without one (ctest shows "Skipped"), except the one that checks make_cuda_backend's error
// on a machine without a device. Built only when the cuda backend is (MESHMUON_WITH_CUDA).
// Run: build/bin/cuda_backend_test
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/select.h"
#include "backend/cuda/batched_gemm.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cpu/kernels/update_steps.h"
#include "meshmuon/bf16.h"
#include "meshmuon/error.h"
#include "meshmuon/inventory.h"
#include "meshmuon/local_optimizer.h"
#include "meshmuon/optimizer.h"
#include "meshmuon/update.h"
#include "state/state_offload.h"
#include "test_support.h"
#if MESHMUON_TEST_CUDA_EMU
#include "../cuda_emu/device_memory.h"
#endif

namespace meshmuon::detail {
namespace {

#define REQUIRE_CUDA()                                                         \
  do {                                                                         \
    std::string why_;                                                          \
    if (!cuda_device_available(&why_)) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

using meshmuon::test::randn;

std::vector<BFloat16> to_bf16(const std::vector<float>& v) {
  std::vector<BFloat16> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16(v[i]);
  return b;
}

// A device buffer holding a copy of `host`; read back with `get`.
template <class T>
Buffer put(Backend& be, const std::vector<T>& host) {
  Buffer b = be.allocate(host.size() * sizeof(T), MemoryKind::Device);
  if (!host.empty()) EXPECT_EQ(cudaMemcpy(b.data(), host.data(), b.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}
template <class T>
std::vector<T> get(const Buffer& b) {
  std::vector<T> host(b.bytes() / sizeof(T));
  if (!host.empty()) EXPECT_EQ(cudaMemcpy(host.data(), b.data(), b.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4), std::memcpy(&y, &b[i], 4);
    ASSERT_EQ(x, y) << what << ": element " << i << " cpu " << a[i] << " cuda " << b[i];
  }
}

TEST(CudaBackend, NoDeviceGivesAClearError) {
  std::string why;
  if (cuda_device_available(&why)) GTEST_SKIP() << "a CUDA device is present; this checks the error without one";
  try {
    make_cuda_backend(0);
    FAIL() << "make_cuda_backend succeeded without a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[cuda] no CUDA device: "), std::string::npos) << e.what();
  }
  EXPECT_THROW(select_device("cuda"), Error);
}

TEST(CudaBackend, BuffersStreamsAndCapabilities) {
  REQUIRE_CUDA();
  auto be = make_cuda_backend(0);
  EXPECT_EQ(be->name(), "cuda");
  EXPECT_TRUE(be->capabilities().device_memory);
  EXPECT_EQ(to_string(be->device()), "cuda:0");
  for (MemoryKind k : {MemoryKind::Host, MemoryKind::PinnedHost, MemoryKind::Device}) {
    Buffer b = be->allocate(4096 + 3, k);
    std::vector<unsigned char> host(b.bytes(), 1);
    if (k == MemoryKind::Device) cudaMemcpy(host.data(), b.data(), b.bytes(), cudaMemcpyDeviceToHost);
    else std::memcpy(host.data(), b.data(), b.bytes());
    for (unsigned char c : host) ASSERT_EQ(c, 0);
  }
  EXPECT_EQ(be->set_threads(4), 1);
  for (bool threaded : {true, false}) {
    auto s = be->make_stream(threaded);
    Buffer x = put(*be, randn(1000, 1));
    std::vector<int> order;
    for (int i = 0; i < 20; ++i)
      s->submit([&, i] {
        order.push_back(i);
        be->round_to_comm(x.as<float>(), 1000, DType::BF16);
      });
    Event e = s->record();
    s->synchronize();
    EXPECT_TRUE(e.done());
    ASSERT_EQ(order.size(), 20u);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
    s->submit([] { throw Error("boom"); });
    EXPECT_THROW(s->synchronize(), Error);
  }
}

// JobEnd::Queued: a job ends once its work is queued. A fence it records at its end orders a
// reader on the device; `after` makes a job's work wait for a fence of another stream; busy_seconds
// is the jobs' device time once done. On the emulation's deferred streams, a reader ordered with
// nothing still sees the memory of before the job (its work did not run when the job ended), and a
// Complete stream's job has its work in memory when it ends (the control).
TEST(CudaBackend, QueuedStreamJobsEndWithTheirWorkQueued) {
  REQUIRE_CUDA();
  auto be = make_cuda_backend(0);
  const std::vector<float> ones(1024, 1.0f), zeros(1024, 0.0f);
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  const auto read_on = [&](const Buffer& b, DeviceEvent after) {
    std::vector<float> h(b.bytes() / 4);
    be->wait(after, other);
    EXPECT_EQ(cudaMemcpyAsync(h.data(), b.data(), b.bytes(), cudaMemcpyDeviceToHost, other), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(other), cudaSuccess);
    return h;
  };
  for (JobEnd end : {JobEnd::Queued, JobEnd::Complete}) {
    auto st = be->make_stream(true, end);
    Buffer a = put(*be, ones);
    Fence done;
    st->submit([&] {
      be->zero(a.data(), a.bytes());
      done = be->fence();
    });
    st->wait_queued();
    ASSERT_FALSE(done.empty());
#if MESHMUON_TEST_CUDA_EMU
    if (end == JobEnd::Queued) EXPECT_EQ(read_on(a, {}), ones) << "the job's work ran before the job ended";
    else EXPECT_EQ(read_on(a, {}), zeros) << "a Complete job ends with its work in memory";
#endif
    EXPECT_EQ(read_on(a, done.event()), zeros) << "a reader ordered after the job's fence";
    // `after`: the job's work waits for a fence of another stream (a copy queued there, not waited for)
    Buffer b = put(*be, zeros);
    EXPECT_EQ(cudaMemcpyAsync(b.data(), ones.data(), b.bytes(), cudaMemcpyHostToDevice, other), cudaSuccess);
    Buffer c = put(*be, zeros);
    st->submit([&] { be->copy(c.data(), b.data(), c.bytes()); }, be->fence(other));  // on the job's stream
    st->synchronize();
    EXPECT_FALSE(st->busy());
    EXPECT_GE(st->busy_seconds(), 0.0);
    EXPECT_EQ(get<float>(c), ones) << "the job's work ran after the fence it was given";
  }
  EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

// Multi-tensor AdamW: a bad tensor anywhere in the list fails before any tensor changes (the bits of
// a good list, tensor by tensor: tests/conformance, Elementwise.AdamWMulti).
TEST(CudaBackend, MultiTensorAdamWRefusesABadListBeforeAnyTensorChanges) {
  REQUIRE_CUDA();
  auto cuda = make_cuda_backend(0);
  const std::vector<int64_t> sizes = {1000, 0, 1, 2 * 1024 * 1024 + 3, 4097, 300};
  struct Host {
    std::vector<float> p, g, m, v;
    std::vector<BFloat16> gb;
    bool bf16;
    AdamWOptions o;
  };
  std::vector<Host> host;
  std::vector<Buffer> keep;
  std::vector<Backend::AdamWTensor> on_device;
  for (size_t t = 0; t < sizes.size(); ++t) {
    const int64_t n = sizes[t];
    Host h{randn(static_cast<size_t>(n), 20 + t), randn(static_cast<size_t>(n), 40 + t), randn(static_cast<size_t>(n), 60 + t, 0.1f),
           randn(static_cast<size_t>(n), 80 + t, 0.01f), {}, t % 2 == 1, {}};
    for (float& x : h.v) x = x * x;
    h.gb = to_bf16(h.g);
    h.o.lr = 1e-3 * static_cast<double>(t + 1), h.o.beta1 = 0.9 - 0.01 * static_cast<double>(t);
    h.o.weight_decay = t % 3 == 0 ? 0.0 : 0.05, h.o.step = static_cast<int64_t>(t) + 1;
    keep.push_back(put(*cuda, h.p)), keep.push_back(put(*cuda, h.m)), keep.push_back(put(*cuda, h.v));
    keep.push_back(h.bf16 ? put(*cuda, h.gb) : put(*cuda, h.g));
    const size_t k = keep.size();
    TensorView g(keep[k - 1].data(), h.bf16 ? DType::BF16 : DType::F32, Shape{n});
    g.device = cuda->device();
    on_device.push_back({h.o, keep[k - 4].as<float>(), g, keep[k - 3].as<float>(), keep[k - 2].as<float>()});
    host.push_back(std::move(h));
  }
  // a bad tensor (exp_avg null) last: nothing launched, the first tensor unchanged
  std::vector<Backend::AdamWTensor> bad = on_device;
  bad.push_back(on_device[0]);
  bad.back().exp_avg = nullptr;
  EXPECT_THROW(cuda->adamw_multi(bad), std::invalid_argument);
  expect_bitwise(get<float>(keep[0]), host[0].p, "a refused list changed a tensor");
}

// Pack tables go up through the calling thread's pinned upload ring, so pack() queues its work
// without a host wait (a copy from pageable memory may synchronize the stream): twelve tables of
// 5000 runs (a ring of 2 MiB wraps twice), none synchronized until the end, each a different
// permutation into its own buffer; a region of the ring rewritten before its copy ran would give
// another table's moves. On the emulation, no copy from pageable memory is made.
TEST(CudaBackend, PackTablesQueueThroughThePinnedUploadRing) {
  REQUIRE_CUDA();
  auto cuda = make_cuda_backend(0);
  // regions come back only through the wait before reuse (the early give-back's queries would run
  // the queued copies on the emulation, and the wait could go unnoticed)
  const bool eager = set_upload_ring_eager_release(false);
  struct Restore {
    bool on;
    ~Restore() { set_upload_ring_eager_release(on); }
  } restore{eager};
  constexpr int64_t kN = 5000;
  constexpr int kTables = 12;
  std::vector<float> src(kN);
  for (int64_t i = 0; i < kN; ++i) src[static_cast<size_t>(i)] = static_cast<float>(i);
  Buffer dsrc = put(*cuda, src);
  std::vector<Buffer> dst;
  std::vector<std::vector<int64_t>> perms;
  std::mt19937 rng(11);
#if MESHMUON_TEST_CUDA_EMU
  const unsigned long long pageable_before = cuda_emu::made(cuda_emu::Made::PageableUpload);
#endif
  for (int k = 0; k < kTables; ++k) dst.push_back(cuda->allocate(kN * sizeof(float), MemoryKind::Device));
  for (int k = 0; k < kTables; ++k) {  // nothing here synchronizes the stream (an allocation would)
    std::vector<int64_t> perm(kN);
    std::iota(perm.begin(), perm.end(), int64_t{0});
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<PackRun> runs(kN);
    for (int64_t i = 0; i < kN; ++i) {
      PackRun& r = runs[static_cast<size_t>(i)];
      r.src = 0, r.dst = 1, r.conv = PackConv::Copy32, r.len = 1, r.rows = 1;
      r.src_off = perm[static_cast<size_t>(i)] * 4, r.dst_off = i * 4;
    }
    std::byte* bases[] = {dsrc.as<std::byte>(), dst[static_cast<size_t>(k)].as<std::byte>()};
    cuda->pack(runs, bases);
    perms.push_back(std::move(perm));
  }
#if MESHMUON_TEST_CUDA_EMU
  EXPECT_EQ(cuda_emu::made(cuda_emu::Made::PageableUpload), pageable_before) << "a table went up from pageable memory";
#endif
  cuda->synchronize();
  for (int k = 0; k < kTables; ++k) {
    const std::vector<float> got = get<float>(dst[static_cast<size_t>(k)]);
    for (int64_t i = 0; i < kN; ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], static_cast<float>(perms[static_cast<size_t>(k)][static_cast<size_t>(i)]))
          << "table " << k << " element " << i;
  }
}

// ---- Newton–Schulz ----

// muon_batch over units of one shape (two experts, then one matrix; NorMuon on) against each
// matrix alone through muon_units: bitwise, whatever the batch (layout invariance), for fp32 and
// bf16 products, methods symmetric and plain, wide and tall, a side of ≥ 1024 (block triangle of 2
// blocks). Returns the counters' growth over the batched calls.
BatchedGemmCounters expect_batch_equals_alone(Backend& cuda, const std::string& tag) {
  const BatchedGemmCounters before = batched_gemm_counters();
  struct Case {
    int m, n;
    NsMethod method;
  };
  const Case cases[] = {{48, 160, NsMethod::Symmetric}, {130, 70, NsMethod::Plain}, {1030, 1040, NsMethod::Symmetric}};
  for (const bool bf16 : {false, true}) {
    if (bf16 && !cuda.capabilities().bf16_products) continue;
    for (const Case& c : cases) {
      NsOptions o;
      o.matmul_dtype = bf16 ? DType::BF16 : DType::F32;
      o.method = c.method;
      o.steps = c.m > 1000 ? 2 : 5;
      auto orth = cuda.make_orthogonalizer(o);
      const int64_t numel = int64_t{c.m} * c.n, len = normuon_state_size(c.m, c.n);
      const std::vector<float> u = randn(static_cast<size_t>(3 * numel), 21 + c.m);
      const std::vector<float> v(static_cast<size_t>(3 * len), 0.25f);
      Buffer bu = put(cuda, u), bv = put(cuda, v), vm = cuda.allocate(static_cast<size_t>(len) * 4, MemoryKind::Device);
      const Backend::UnitRef units[] = {{bu.as<float>(), 2, bv.as<float>()},
                                        {bu.as<float>() + 2 * numel, 1, bv.as<float>() + 2 * len}};
      cuda.muon_batch(*orth, units, c.m, c.n, vm.as<float>(), 0.95, DType::BF16);
      Buffer au = put(cuda, u), av = put(cuda, v);
      for (int64_t e = 0; e < 3; ++e)
        cuda.muon_units(*orth, au.as<float>() + e * numel, 1, c.m, c.n, av.as<float>() + e * len, vm.as<float>(), 0.95,
                        DType::BF16);
      // The same batch in parts of one matrix (the scratch cap at its minimum).
      Buffer pu = put(cuda, u), pv = put(cuda, v);
      const Backend::UnitRef parts[] = {{pu.as<float>(), 2, pv.as<float>()},
                                        {pu.as<float>() + 2 * numel, 1, pv.as<float>() + 2 * len}};
      const size_t cap = set_cuda_ns_batch_bytes(1);
      try {
        cuda.muon_batch(*orth, parts, c.m, c.n, vm.as<float>(), 0.95, DType::BF16);
      } catch (...) {
        set_cuda_ns_batch_bytes(cap);
        throw;
      }
      set_cuda_ns_batch_bytes(cap);
      cuda.synchronize();
      const std::string what = tag + (bf16 ? " bf16 " : " fp32 ") + std::to_string(c.m) + "x" + std::to_string(c.n);
      expect_bitwise(get<float>(au), get<float>(bu), what + " update");
      expect_bitwise(get<float>(av), get<float>(bv), what + " NorMuon state");
      expect_bitwise(get<float>(au), get<float>(pu), what + " update, parts of one matrix");
      expect_bitwise(get<float>(av), get<float>(pv), what + " NorMuon state, parts of one matrix");
    }
  }
  const BatchedGemmCounters after = batched_gemm_counters();
  return {after.batched - before.batched, after.single - before.single, after.gemm_ex - before.gemm_ex,
          after.probes - before.probes, after.probe_mismatch - before.probe_mismatch};
}

TEST(CudaBackend, BatchedUnitsGiveEachMatrixItsOwnBits) {
  REQUIRE_CUDA();
  auto cuda = make_cuda_backend(0);
  const BatchedGemmCounters d = expect_batch_equals_alone(*cuda, "batched");
  EXPECT_GT(d.gemm_ex, 0u) << "fp32 products are one cublasGemmEx per matrix";
  if (cuda->capabilities().bf16_products) EXPECT_GT(d.single, 0u) << "bf16 products go through cuBLASLt";
#if MESHMUON_TEST_CUDA_EMU
  // The emulated cuBLASLt: every batched shape probed; with the batch-dependent algorithm
  // (MESHMUON_CUDA_EMU_LT_BATCH_VARIANT=1, cuda_backend_batch_variant_emu) every probe finds it and the
  // batches run matrix by matrix, else every batch runs batched.
  if (cuda->capabilities().bf16_products) {
    const char* variant = std::getenv("MESHMUON_CUDA_EMU_LT_BATCH_VARIANT");
    EXPECT_GT(d.probes, 0u);
    if (variant != nullptr && std::string(variant) == "1") {
      EXPECT_EQ(d.probe_mismatch, d.probes);
      EXPECT_EQ(d.batched, 0u);
    } else {
      EXPECT_EQ(d.probe_mismatch, 0u);
      EXPECT_GT(d.batched, 0u);
    }
  }
#endif
}

#if MESHMUON_TEST_CUDA_EMU
// The negative control of the probe (cuda_backend_batch_variant_emu only, where the emulated
// cuBLASLt sums a batched product in another order): with the probe off the batched results differ
// from the matrices alone, so the test above does catch a batch-dependent algorithm.
TEST(CudaBackend, WithoutTheProbeABatchDependentAlgorithmChangesBits) {
  REQUIRE_CUDA();
  const char* variant = std::getenv("MESHMUON_CUDA_EMU_LT_BATCH_VARIANT");
  ASSERT_TRUE(variant != nullptr && std::string(variant) == "1") << "run with MESHMUON_CUDA_EMU_LT_BATCH_VARIANT=1";
  auto cuda = make_cuda_backend(0);
  ASSERT_TRUE(cuda->capabilities().bf16_products) << "needs bf16 products (oneDNN on the host)";
  NsOptions o;
  o.matmul_dtype = DType::BF16;
  auto orth = cuda->make_orthogonalizer(o);
  const int m = 48, n = 160;
  const std::vector<float> u = randn(size_t{3} * m * n, 5);
  struct ProbeOff {  // on again however the test leaves
    ProbeOff() { set_batched_gemm_probe(false); }
    ~ProbeOff() { set_batched_gemm_probe(true); }
  };
  Buffer bu = put(*cuda, u), au = put(*cuda, u);
  {
    const ProbeOff off;
    cuda->muon_units(*orth, bu.as<float>(), 3, m, n, nullptr, nullptr, 0.95, DType::F32);
    for (int e = 0; e < 3; ++e)
      cuda->muon_units(*orth, au.as<float>() + e * m * n, 1, m, n, nullptr, nullptr, 0.95, DType::F32);
  }
  const std::vector<float> a = get<float>(au), b = get<float>(bu);
  EXPECT_NE(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "the batch-dependent algorithm left the bits alone";
}
#endif

// The block columns of the cuda backend's symmetric products (cuda::lower_blocks; checked without a
// device). gram_newton_schulz over shards against the cpu: tests/conformance (GramNewtonSchulzOverShards).
TEST(CudaTestHarness, LowerBlocksOfTheSymmetricProducts) {
  EXPECT_EQ(cuda::lower_blocks(512), 1);
  EXPECT_EQ(cuda::lower_blocks(1100), 2);
  EXPECT_EQ(cuda::lower_blocks(1 << 20), 8);
  // side 1100 in 2 blocks: the boundary 550 rounded down to 512 (128-byte aligned bf16 blocks), so
  // rows 0..512 of 512 columns, then rows 0..1100 of 588 columns
  EXPECT_EQ(cuda::lower_bound(1100, 1), 512);
  EXPECT_EQ(cuda::lower_bound(1100, 2), 1100);
  EXPECT_EQ(cuda::lower_bound(4096, 3), 1536);
  EXPECT_DOUBLE_EQ(cuda::lower_product_flops(1100, 7), 2.0 * (512.0 * 512 + 1100.0 * 588) * 7);
}

// The device NorMuon (cuda::normuon) against normuon_mean_square + normuon_finish on the same
// orthogonalized input: the same operations in the same order, so every bit of u, v and v_mean.
TEST(CudaBackend, NorMuonKernelIsBitwiseTheCpu) {
  REQUIRE_CUDA();
  auto cuda = make_cuda_backend(0);
  const std::pair<int, int> shapes[] = {{48, 160}, {160, 48}, {64, 64}, {1, 1}, {1, 300}, {257, 3}};
  unsigned seed = 40;
  for (const auto& [m, n] : shapes) {
    const int64_t numel = int64_t{m} * n, len = normuon_state_size(m, n);
    std::vector<float> u = randn(static_cast<size_t>(numel), ++seed, 0.05f), v = randn(static_cast<size_t>(len), ++seed);
    for (float& x : v) x = x * x * 1e-3f;  // a second moment: non-negative, some below the 1e-10 floor
    v[0] = 0.0f;
    std::vector<float> vm(static_cast<size_t>(len));
    Buffer du = put(*cuda, u), dv = put(*cuda, v), dvm = put(*cuda, vm);
    Buffer step = cuda->allocate(static_cast<size_t>(len) * sizeof(float), MemoryKind::Device),
           scal = cuda->allocate(2 * sizeof(double), MemoryKind::Device);
    const double beta2 = 0.95;
    normuon_mean_square(u.data(), m, n, vm.data());
    normuon_finish(u.data(), m, n, vm.data(), v.data(), beta2);
    const cuda::NormuonScratch sc{step.as<float>(), scal.as<double>(), reinterpret_cast<float*>(scal.as<double>() + 1)};
    ASSERT_EQ(cuda::normuon(du.as<float>(), m, n, dvm.as<float>(), dv.as<float>(), static_cast<float>(1.0 - beta2), sc,
                            nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::string what = std::to_string(m) + "x" + std::to_string(n);
    expect_bitwise(get<float>(dvm), vm, what + " v_mean");
    expect_bitwise(get<float>(dv), v, what + " v");
    expect_bitwise(get<float>(du), u, what + " u");
  }
}

// Backend::copy in every direction between host, pinned host and device memory, on the calling
// thread and submitted to a stream (the asynchronous form state offload uses).
TEST(CudaBackend, CopyBetweenHostPinnedAndDeviceOnAStream) {
  REQUIRE_CUDA();
  auto be = make_cuda_backend(0);
  const std::vector<float> src = randn(3001, 21);
  const size_t bytes = src.size() * sizeof(float);
  Buffer pinned = be->allocate(bytes, MemoryKind::PinnedHost), dev = be->allocate(bytes, MemoryKind::Device),
         host = be->allocate(bytes, MemoryKind::Host), dev2 = be->allocate(bytes, MemoryKind::Device);
  std::memcpy(pinned.data(), src.data(), bytes);
  be->copy(dev.data(), pinned.data(), bytes);
  expect_bitwise(get<float>(dev), src, "pinned -> device");
  be->copy(host.data(), dev.data(), bytes);
  expect_bitwise(std::vector<float>(host.as<float>(), host.as<float>() + src.size()), src, "device -> host");
  auto s = be->make_stream(true);
  s->submit([&] { be->copy(dev2.data(), dev.data(), bytes); });
  s->submit([&] { be->copy(pinned.data(), dev2.data(), bytes / 2); });
  Event e = s->record();
  s->synchronize();
  EXPECT_TRUE(e.done());
  expect_bitwise(get<float>(dev2), src, "device -> device on a stream");
  expect_bitwise(std::vector<float>(pinned.as<float>(), pinned.as<float>() + src.size()), src, "device -> pinned on a stream");
}

// State offload on the cuda backend: the resident copy is device memory, a kernel updates it there,
// and the write-back lands in the pinned home copy (as the cpu backend's rounding of the same values).
TEST(CudaBackend, StateOffloadStagesThroughDeviceSlots) {
  REQUIRE_CUDA();
  auto be = make_cuda_backend(0);
  auto cpu = make_cpu_backend();
  const std::vector<float> a = randn(1000, 22), b = randn(77, 23);
  Buffer ha = be->allocate(a.size() * 4, MemoryKind::PinnedHost), hb = be->allocate(b.size() * 4, MemoryKind::PinnedHost);
  std::memcpy(ha.data(), a.data(), a.size() * 4), std::memcpy(hb.data(), b.data(), b.size() * 4);
  StateOffload off(*be, {{{ha.data(), a.size() * 4}, {hb.data(), b.size() * 4}}}, {"w"});
  off.begin_step();
  const std::vector<size_t> g = {0};
  off.prefetch(g);
  off.acquire(g);
  float* ra = static_cast<float*>(off.resident(0, 0));
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, ra), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  be->round_to_comm(ra, static_cast<int64_t>(a.size()), DType::BF16);
  off.release(g);
  off.flush();
  std::vector<float> want = a;
  cpu->round_to_comm(want.data(), static_cast<int64_t>(want.size()), DType::BF16);
  expect_bitwise(std::vector<float>(ha.as<float>(), ha.as<float>() + a.size()), want, "written back");
  expect_bitwise(std::vector<float>(hb.as<float>(), hb.as<float>() + b.size()), b, "untouched tensor");
  EXPECT_EQ(off.counters().bytes_in, (a.size() + b.size()) * 4);
  EXPECT_GT(off.counters().peak_resident_bytes, 0u);
}

// An Optimizer on the cuda backend (one rank, the single communicator for the device) over three
// Muon matrices, with its parameters and gradients in device memory.
struct DeviceSteps {
  std::shared_ptr<Backend> cuda = make_cuda_backend(0);
  std::unique_ptr<Optimizer> opt;
  std::vector<Buffer> w, g;
  std::vector<TensorView> wv, gv;
  // compute_thread = false: the compute stream's jobs run on the caller's thread (no thread of the
  // emulation runs other streams' queues while it waits, so what runs when is deterministic there).
  // chunked: four 64×96 matrices, three Muon and one AdamW, one pipeline chunk per matrix and a
  // window of 1 (the state offload then reuses each slot right behind its write-back, prefetches the
  // next chunk's state, and stages AdamW's state too).
  explicit DeviceSteps(bool compute_thread = true, DType matmul = DType::F32, bool offload = false, bool chunked = false) {
    ModelDesc model = chunked ? test::matrix_model("flat", {{"w0", 64, 96}, {"w1", 64, 96}, {"w2", 64, 96}, {"w3", 64, 96}})
                              : test::matrix_model("flat", {{"w0", 96, 64}, {"w1", 64, 160}, {"w2", 128, 128}});
    if (chunked) model.params[3].role = Role::AdamW;
    const Inventory inv = apply_parallel(model, parse_parallel("dp_shard=1"));
    OptimizerOptions o;
    o.device = "cuda";
    o.env_override = false;
    o.compute_thread = compute_thread;
    o.offload_state = offload;
    if (chunked) o.chunk_bytes = 1, o.window = 1;
    GroupOptions group;
    group.ns.matmul_dtype = matmul;
    std::vector<ParamGroup> groups{ParamGroup{group, {0, 1, 2}}};
    if (chunked) {
      GroupOptions adamw;
      adamw.algorithm = Algorithm::AdamW;
      adamw.lr = 1e-3;
      groups.push_back(ParamGroup{adamw, {3}});
    }
    opt = std::make_unique<Optimizer>(make_single_communicator("cuda"), inv, groups, o);
    for (size_t i = 0; i < inv.params.size(); ++i) {
      const Shape s = opt->local_shape(i);
      std::vector<float> h(static_cast<size_t>(s.numel()));
      for (size_t j = 0; j < h.size(); ++j) h[j] = std::sin(0.1f * static_cast<float>(j + 7 * i));
      w.push_back(cuda->allocate(h.size() * 4, MemoryKind::Device)), g.push_back(cuda->allocate(h.size() * 4, MemoryKind::Device));
      cuda->copy(w.back().data(), h.data(), h.size() * 4), cuda->copy(g.back().data(), h.data(), h.size() * 4);
      wv.emplace_back(w.back().as<float>(), s), gv.emplace_back(g.back().as<float>(), s);
      wv.back().device = gv.back().device = cuda->device();
    }
  }
  bool step() { return opt->step(wv, gv); }
};

// The engine's steps on the cuda backend keep their device memory flat (whatever a compute stream's
// thread makes on the device, its cuBLAS handle and Newton–Schulz scratch, is kept or freed, never
// made again per step): the device's free memory after step 2 equals that after step 8.
TEST(CudaBackend, OptimizerStepsKeepDeviceMemoryFlat) {
  REQUIRE_CUDA();
  DeviceSteps run;
  const auto free_bytes = [] {
    size_t free = 0, total = 0;
    EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
    return free;
  };
  size_t after2 = 0;
  for (int t = 1; t <= 8; ++t) {
    ASSERT_TRUE(run.step());
    if (t == 2) after2 = free_bytes();
  }
  EXPECT_EQ(free_bytes(), after2) << "device memory grew over steps 3..8";
}

// A step's results are in memory when it returns: read on another stream (as the caller's, e.g.
// PyTorch's current stream, would read them), the parameters equal what the backend's own copy
// reads after the step. The kernels are stream-ordered (backend.h); the step ends with one wait.
TEST(CudaBackend, StepResultsAreInMemoryWhenTheStepReturns) {
  REQUIRE_CUDA();
  DeviceSteps run;
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  for (int t = 1; t <= 2; ++t) {
    ASSERT_TRUE(run.step());
    for (size_t i = 0; i < run.wv.size(); ++i) {
      const size_t bytes = static_cast<size_t>(run.wv[i].numel()) * 4;
      std::vector<float> seen(bytes / 4), want(bytes / 4);
      ASSERT_EQ(cudaMemcpyAsync(seen.data(), run.wv[i].data, bytes, cudaMemcpyDeviceToHost, other), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
      run.cuda->copy(want.data(), run.wv[i].data, bytes);
      expect_bitwise(seen, want, "parameter read on another stream after the step");
    }
  }
  EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

// Gradients for step t of DeviceSteps (values that change every step).
std::vector<float> step_grad(const TensorView& w, int t, size_t i) {
  std::vector<float> h(static_cast<size_t>(w.numel()));
  for (size_t j = 0; j < h.size(); ++j) h[j] = std::cos(0.37f * static_cast<float>(j) + static_cast<float>(5 * t + i));
  return h;
}

// The parameters of `run` read on `stream` (queued there, then that stream synchronized).
std::vector<std::vector<float>> params_on(DeviceSteps& run, cudaStream_t stream) {
  std::vector<std::vector<float>> out;
  for (const TensorView& w : run.wv) {
    out.emplace_back(static_cast<size_t>(w.numel()));
    EXPECT_EQ(cudaMemcpyAsync(out.back().data(), w.data, out.back().size() * 4, cudaMemcpyDeviceToHost, stream), cudaSuccess);
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return out;
}

// State offload on the cuda backend through whole steps: the state's copy-in waits for nothing on
// the host (the thread that uses the slot waits for it on the device), its write-back is queued
// after the slot's kernels, and the next copy-in into a reused slot follows it on the copy stream.
// Parameters bitwise those of the run that keeps its state on the device, over steps whose
// gradients change: fp32 and bf16 products with the whole model in one chunk, and (chunked) one
// chunk per matrix with a window of 1 and an AdamW matrix, where slots are reused behind their
// write-backs, the next chunk's state is prefetched and AdamW's state staged (on the emulation's
// deferred streams a missing wait reads a slot before its copy-in or a home copy before its
// write-back). The control: the state was offloaded.
TEST(CudaBackend, OffloadedStateStepsAreBitwiseTheResidentOnes) {
  REQUIRE_CUDA();
  for (const auto& [matmul, chunked] : {std::pair{DType::F32, false}, std::pair{DType::BF16, false}, std::pair{DType::F32, true}}) {
    DeviceSteps resident(true, matmul, false, chunked), offloaded(true, matmul, true, chunked);
    for (int t = 1; t <= 4; ++t) {
      for (size_t i = 0; i < resident.wv.size(); ++i) {
        const std::vector<float> h = step_grad(resident.wv[i], t, i);
        resident.cuda->copy(resident.gv[i].data, h.data(), h.size() * 4);
        offloaded.cuda->copy(offloaded.gv[i].data, h.data(), h.size() * 4);
      }
      ASSERT_TRUE(resident.step());
      ASSERT_TRUE(offloaded.step());
      EXPECT_GT(offloaded.opt->last_stats().offload_bytes_in, 0u) << "the control: the state was offloaded";
      const std::vector<std::vector<float>> want = params_on(resident, nullptr), got = params_on(offloaded, nullptr);
      for (size_t i = 0; i < want.size(); ++i)
        expect_bitwise(got[i], want[i], std::string(to_string(matmul)) + " step " + std::to_string(t) + " parameter " + std::to_string(i));
    }
  }
}

// Optimizer::set_stream: with the caller's stream set, the step orders itself with it on the
// device. The gradients are written by copies queued on the caller's stream and not waited for, the
// parameters read back by copies queued there after step() returns: bitwise the run whose inputs
// and results went through the host. On the emulation's deferred streams a step that did not wait
// for the caller's stream reads the gradients of before the copies (the negative control), and one
// that waited on the host at its end would leave nothing queued (checked: a stream ordered with
// nothing reads the parameters of before the step).
TEST(CudaBackend, CallerStreamOrdersTheStepOnTheDevice) {
  REQUIRE_CUDA();
  cudaStream_t caller = nullptr, other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  DeviceSteps ref, dev;
  dev.opt->set_stream(caller);
  EXPECT_EQ(dev.opt->stream(), static_cast<void*>(caller));
  for (int t = 1; t <= 3; ++t) {
    for (size_t i = 0; i < ref.wv.size(); ++i) {
      const std::vector<float> h = step_grad(ref.wv[i], t, i);
      ref.cuda->copy(ref.gv[i].data, h.data(), h.size() * 4);
      ASSERT_EQ(cudaMemcpyAsync(dev.gv[i].data, h.data(), h.size() * 4, cudaMemcpyHostToDevice, caller), cudaSuccess);
    }
    ASSERT_TRUE(ref.step());
    const std::vector<std::vector<float>> before = params_on(ref, other);  // unused on a GPU
    ASSERT_TRUE(dev.step());
#if MESHMUON_TEST_CUDA_EMU
    if (t == 1) {  // nothing of the step has run for a stream it is not ordered with
      const std::vector<std::vector<float>> early = params_on(dev, other);
      bool same = true;
      for (size_t i = 0; i < early.size(); ++i) same = same && std::memcmp(early[i].data(), before[i].data(), early[i].size() * 4) == 0;
      EXPECT_FALSE(same) << "the step's writes were in memory for an unordered stream: it waited on the host";
    }
#endif
    const std::vector<std::vector<float>> want = params_on(ref, other), got = params_on(dev, caller);
    for (size_t i = 0; i < want.size(); ++i) expect_bitwise(got[i], want[i], "step " + std::to_string(t) + " parameter " + std::to_string(i));
  }
#if MESHMUON_TEST_CUDA_EMU
  {  // the negative control: the same inputs without the stream (no compute thread: a waiting thread
     // of the emulation may run any stream's queue, the caller's copies included, as a GPU may)
    DeviceSteps unordered(false), once(false);
    for (size_t i = 0; i < once.wv.size(); ++i) {
      const std::vector<float> h = step_grad(once.wv[i], 1, i);
      once.cuda->copy(once.gv[i].data, h.data(), h.size() * 4);
    }
    ASSERT_TRUE(once.step());
    for (size_t i = 0; i < unordered.wv.size(); ++i) {
      const std::vector<float> h = step_grad(unordered.wv[i], 1, i);
      ASSERT_EQ(cudaMemcpyAsync(unordered.gv[i].data, h.data(), h.size() * 4, cudaMemcpyHostToDevice, caller), cudaSuccess);
    }
    ASSERT_TRUE(unordered.step());
    const std::vector<std::vector<float>> a = params_on(unordered, other), b = params_on(once, other);
    bool same = true;
    for (size_t i = 0; i < a.size(); ++i) same = same && std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) == 0;
    EXPECT_FALSE(same) << "without set_stream the step should have read the gradients of before the queued copies";
    ASSERT_EQ(cudaStreamSynchronize(caller), cudaSuccess);
  }
#endif
  dev.opt->set_stream(nullptr);
  EXPECT_EQ(dev.opt->stream(), nullptr);
  EXPECT_EQ(cudaStreamDestroy(caller), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

// More compute streams give the same bits: the three matrices of one chunk run on one, two or
// three streams, the others waiting on the device for the chunk's unpack (on the emulation's
// deferred streams a stream that did not wait reads the arena of before it).
TEST(CudaBackend, ComputeStreamsGiveTheSameBits) {
  REQUIRE_CUDA();
  std::vector<std::vector<std::vector<float>>> results;
  for (int streams : {1, 2, 3}) {
    DeviceSteps run;
    run.opt->set_compute_streams(streams);
    for (int t = 1; t <= 2; ++t) ASSERT_TRUE(run.step());
    EXPECT_EQ(run.opt->last_stats().chunks, 1) << "the control: all three matrices in one chunk";
    std::vector<std::vector<float>> p;
    for (const TensorView& w : run.wv) {
      p.emplace_back(static_cast<size_t>(w.numel()));
      run.cuda->copy(p.back().data(), w.data, p.back().size() * 4);
    }
    results.push_back(std::move(p));
  }
  for (size_t k = 1; k < results.size(); ++k)
    for (size_t i = 0; i < results[0].size(); ++i)
      expect_bitwise(results[k][i], results[0][i], std::to_string(k + 1) + " streams, parameter " + std::to_string(i));
}

// A cpu optimizer has no device streams to order with.
TEST(CudaBackend, SetStreamOnTheCpuIsRefused) {
  REQUIRE_CUDA();
  LocalOptimizer cpu({ParamInfo{"w", {8, 6}}}, {ParamGroup{GroupOptions{}, {0}}});
  try {
    cpu.set_stream(reinterpret_cast<void*>(uintptr_t{1}));
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("set_stream: the optimizer runs on cpu"), std::string::npos) << e.what();
  }
  cpu.set_stream(nullptr);
}

// The state release hook (StateHooks) sees the state the step wrote: read on another stream inside
// the hook, every state tensor (Muon's momentum, AdamW's moments, written just before the release)
// equals what the backend's own copy reads after the step.
TEST(CudaBackend, StateReleaseHookSeesTheStepsWrites) {
  REQUIRE_CUDA();
  auto cuda = make_cuda_backend(0);
  LocalOptimizer* opt = nullptr;
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  std::map<std::pair<size_t, std::string>, std::vector<float>> seen;
  LocalOptimizerOptions o;
  o.device = "cuda";
  o.state_hooks.release = [&](std::span<const size_t> params) {
    for (size_t i : params)
      for (const std::string& key : opt->state_keys(i)) {
        const TensorView t = opt->state(i, key);
        std::vector<float>& out = seen[{i, key}];
        out.resize(static_cast<size_t>(t.numel()));
        ASSERT_EQ(cudaMemcpyAsync(out.data(), t.data, out.size() * 4, cudaMemcpyDeviceToHost, other), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
      }
  };
  GroupOptions adamw;
  adamw.algorithm = Algorithm::AdamW;
  LocalOptimizer local({ParamInfo{"w", {8, 6}}, ParamInfo{"b", {6}}},
                       {ParamGroup{GroupOptions{}, {0}}, ParamGroup{adamw, {1}}}, o);
  opt = &local;
  std::vector<Buffer> keep;
  std::vector<TensorView> wv, gv;
  for (const ParamInfo& p : local.params()) {
    const std::vector<float> h = randn(static_cast<size_t>(p.shape.numel()), 31, 1.0f);
    for (int k = 0; k < 2; ++k) {
      keep.push_back(cuda->allocate(h.size() * 4, MemoryKind::Device));
      cuda->copy(keep.back().data(), h.data(), h.size() * 4);
      (k == 0 ? wv : gv).emplace_back(keep.back().as<float>(), p.shape);
      (k == 0 ? wv : gv).back().device = cuda->device();
    }
  }
  ASSERT_TRUE(local.step(wv, gv));
  ASSERT_EQ(seen.size(), 3u);  // momentum_buffer; exp_avg, exp_avg_sq
  for (auto& [at, got] : seen) {
    const TensorView t = local.state(at.first, at.second);
    std::vector<float> want(got.size());
    cuda->copy(want.data(), t.data, want.size() * 4);
    expect_bitwise(got, want, at.second + " read in the release hook");
  }
  EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

// The single communicator for a device checks the index against the devices this process sees
// (so 'cuda:7' on a one-GPU machine fails when it is made, naming the range), and carries device
// memory.
TEST(CudaBackend, SingleCommunicatorChecksTheDeviceIndex) {
  REQUIRE_CUDA();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  const std::string past = "cuda:" + std::to_string(count);
  try {
    (void)make_single_communicator(past);
    FAIL() << "expected an error for " << past;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("make_single_communicator('" + past + "'): this process sees " +
                                         std::to_string(count) + " CUDA device"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(make_single_communicator("cuda:" + std::to_string(count - 1))->device_buffers());
}

#if MESHMUON_TEST_CUDA_EMU
// Emulation only (it counts what the runtime made): after the first steps, a step makes no device or
// pinned allocation, stream, event, cuBLAS handle or cuBLASLt descriptor, with fp32 and bf16
// products. The compute stream, its thread and what lives on it (handle, scratch, descriptors) are
// kept from step to step; a fresh stream per step would pay a cudaStreamCreate, a cublasCreate and a
// scratch cudaMalloc every step, and descriptors made per product some ten cuBLASLt calls each.
TEST(CudaBackend, StepsAfterTheFirstMakeNoDeviceResources) {
  REQUIRE_CUDA();
  using cuda_emu::Made;
  for (DType matmul : {DType::F32, DType::BF16}) {
    if (matmul == DType::BF16 && !make_cuda_backend(0)->capabilities().bf16_products) continue;  // needs oneDNN
    DeviceSteps run(true, matmul);
    ASSERT_TRUE(run.step());
    ASSERT_TRUE(run.step());
    const std::vector<Made> kinds = {Made::DeviceAlloc, Made::PinnedAlloc,    Made::Stream,      Made::Event,
                                     Made::BlasHandle,  Made::PageableUpload, Made::LtDescriptor};
    std::vector<unsigned long long> before;
    for (Made k : kinds) before.push_back(cuda_emu::made(k));
    for (int t = 3; t <= 6; ++t) ASSERT_TRUE(run.step());
    const char* names[] = {"device allocations", "pinned allocations", "streams", "events", "cuBLAS handles",
                           "copies from pageable memory to the device", "cuBLASLt matmul descriptors"};
    for (size_t k = 0; k < kinds.size(); ++k)
      EXPECT_EQ(cuda_emu::made(kinds[k]), before[k]) << names[k] << " made over steps 3..6 (" << to_string(matmul) << " products)";
    EXPECT_GT(before[4], 0u) << "the control: the steps use cuBLAS";
    if (matmul == DType::BF16) EXPECT_GT(before[6], 0u) << "the control: bf16 products go through cuBLASLt";
  }
}

// Emulation only (it counts the host's waits): a steady step given the caller's stream waits on the
// host once, for its agreement (the one read-back of the non-finite scan, before the ranks agree:
// optimizer.h). The compute stream's jobs, the hand-offs between the driving thread, the compute
// streams and the communicators, and the step's end wait on the device. The control: without the
// caller's stream the step's end adds one wait (so the counter sees the engine's waits).
TEST(CudaBackend, AStepWaitsOnTheHostOnlyForItsAgreement) {
  REQUIRE_CUDA();
  cudaStream_t caller = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking), cudaSuccess);
  for (int streams : {1, 2}) {
    unsigned long long waits[2] = {0, 0};  // [without, with] the caller's stream
    for (int ordered : {0, 1}) {
      DeviceSteps run;
      run.opt->set_compute_streams(streams);
      if (ordered) run.opt->set_stream(caller);
      for (int t = 1; t <= 2; ++t) ASSERT_TRUE(run.step());
      ASSERT_EQ(cudaStreamSynchronize(caller), cudaSuccess);
      const unsigned long long before = cuda_emu::made(cuda_emu::Made::HostWait);
      for (int t = 3; t <= 5; ++t) ASSERT_TRUE(run.step());
      waits[ordered] = cuda_emu::made(cuda_emu::Made::HostWait) - before;
      ASSERT_EQ(cudaStreamSynchronize(caller), cudaSuccess);
      EXPECT_GT(run.opt->last_stats().orthogonalize_seconds, 0) << "the compute stream's device time";
    }
    EXPECT_EQ(waits[1], 3u) << streams << " compute stream(s): host waits in three steps given the caller's stream";
    EXPECT_EQ(waits[0], 6u) << streams << " compute stream(s): host waits in three steps without it";
  }
  EXPECT_EQ(cudaStreamDestroy(caller), cudaSuccess);
}

// Emulation only: a kernel of the compute stream faults on the device after its job has ended (the
// job is JobEnd::Queued; the fault injected into the next polynomial of Newton–Schulz). The step
// raises a meshmuon::Error naming the CUDA error: at its end wait, or, given the caller's stream (the
// step then returns with its tail queued), at the latest in the next step, as PyTorch reports
// CUDA errors asynchronously too. No hang, no silent result, and the optimizer is destroyed without
// either. In a child process: the emulated context stays dead, as a CUDA context does.
TEST(CudaBackendDeathTest, ADeviceFaultAfterItsJobEndedIsRaised) {
  REQUIRE_CUDA();
  for (const int ordered : {0, 1}) {
    EXPECT_EXIT(
        {
          cudaStream_t caller = nullptr;
          if (cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking) != cudaSuccess) std::_Exit(5);
          auto run = std::make_unique<DeviceSteps>();
          if (ordered) run->opt->set_stream(caller);
          for (int t = 1; t <= 2; ++t)
            if (!run->step()) std::_Exit(6);
          cuda_emu::fault_next_launch_of("ns_polynomial");
          int code = 0;
          for (int t = 3; t <= 4 && code == 0; ++t) {
            try {
              (void)run->step();
            } catch (const meshmuon::Error& e) {
              std::fprintf(stderr, "raised in step %d: %s\n", t, e.what());
              code = ordered || t == 3 ? 3 : 4;  // without the caller's stream: in the faulting step
            }
          }
          run.reset();  // destroying the optimizer after the fault neither hangs nor crashes
          std::fprintf(stderr, "destroyed\n");
          std::_Exit(code);
        },
        ::testing::ExitedWithCode(3), "raised in step [34]: .*illegal memory access(.|\n)*destroyed")
        << (ordered ? "given the caller's stream" : "without it");
  }
}

// Emulation only: with the state offloaded, a steady step given the caller's stream waits on the host
// for its agreement and once more at its end, for the write-backs (the home copies are host memory
// the caller may read after the step: state_offload.h). The copy-ins and write-backs of its chunks
// are ordered on the device. Before, every copy was waited for on the copy stream's thread, and
// each acquire waited on the host for its copy-in: 27 waits in these three steps.
TEST(CudaBackend, AnOffloadedStepWaitsOnTheHostForItsAgreementAndItsWriteBacks) {
  REQUIRE_CUDA();
  cudaStream_t caller = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking), cudaSuccess);
  DeviceSteps run(true, DType::F32, true);
  run.opt->set_stream(caller);
  for (int t = 1; t <= 2; ++t) ASSERT_TRUE(run.step());
  ASSERT_EQ(cudaStreamSynchronize(caller), cudaSuccess);
  const unsigned long long before = cuda_emu::made(cuda_emu::Made::HostWait);
  for (int t = 3; t <= 5; ++t) ASSERT_TRUE(run.step());
  EXPECT_EQ(cuda_emu::made(cuda_emu::Made::HostWait) - before, 6u) << "host waits in three offloaded steps";
  EXPECT_GT(run.opt->last_stats().offload_bytes_in, 0u) << "the control: the state was offloaded";
  ASSERT_EQ(cudaStreamSynchronize(caller), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(caller), cudaSuccess);
}
#endif

}  // namespace
}  // namespace meshmuon::detail
