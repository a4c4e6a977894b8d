// The CUDA host emulation's own tests: it must fault where a GPU would, or the emulated GPU tests
// prove nothing (these are their negative controls), and its cuBLAS must compute the product.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "backend/cuda/cublas_loader.h"
#include "backend/cuda/cuda_kernels.h"
#include "meshmuon/local_optimizer.h"
#include "streams.h"

namespace {

using meshmuon::detail::cublas;

struct DeviceFloats {
  explicit DeviceFloats(size_t n) : n(n) { EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n * 4), cudaSuccess); }
  ~DeviceFloats() { cudaFree(p); }
  void put(const std::vector<float>& h) { ASSERT_EQ(cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess); }
  std::vector<float> get() const {
    std::vector<float> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  float* p = nullptr;
  size_t n;
};

TEST(CudaEmu, HostCodeThatReadsDeviceMemoryFaults) {
  DeviceFloats d(16);
  float* p = d.p;
  EXPECT_DEATH({ std::printf("%f\n", static_cast<double>(*static_cast<volatile float*>(p))); }, "");
  // the same bytes through cudaMemcpy are readable, and uninitialized memory reads as NaN
  EXPECT_TRUE(std::isnan(d.get()[3]));
}

TEST(CudaEmu, CopiesCheckDirectionAndBounds) {
  DeviceFloats d(8);
  std::vector<float> h(8, 1.0f), big(9, 1.0f);
  EXPECT_EQ(cudaMemcpy(d.p, h.data(), 32, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(h.data(), d.p, 32, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // directions swapped
  EXPECT_EQ(cudaMemcpy(d.p, big.data(), 36, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // past the allocation
  EXPECT_EQ(cudaMemcpy(d.p + 4, h.data(), 16, cudaMemcpyDefault), cudaSuccess);               // inside it, inferred
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, d.p + 2), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  ASSERT_EQ(cudaPointerGetAttributes(&a, h.data()), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 64), cudaSuccess);
  ASSERT_EQ(cudaPointerGetAttributes(&a, pinned), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

// ---- the deferred streams (streams.h): work runs when the host synchronizes with it ----------

// (and clears the last error the tests before left: launchers report it, as cuda_kernels.cu's do)
#define REQUIRE_DEFERRED()                                                                \
  if (!meshmuon::cuda_emu::deferred()) GTEST_SKIP() << "MESHMUON_CUDA_EMU_DEFERRED=0: immediate mode"; \
  (void)cudaGetLastError()

struct Pinned {
  explicit Pinned(size_t n) : n(n) {
    EXPECT_EQ(cudaMallocHost(reinterpret_cast<void**>(&p), n * 4), cudaSuccess);
    for (size_t i = 0; i < n; ++i) p[i] = -7.0f;
  }
  ~Pinned() { cudaFreeHost(p); }
  std::vector<float> seen() const { return {p, p + n}; }
  float* p = nullptr;
  size_t n;
};

// Device values {1, 2, 3, 4}, a pinned host buffer for them (-7 each), a non-blocking stream maker.
struct Deferred {
  DeviceFloats d{4};
  Pinned h{4};
  Deferred() { d.put({1, 2, 3, 4}); }
  // d read into h by a copy on `s`, then `s` synchronized (and nothing else).
  std::vector<float> read_on(cudaStream_t s) {
    EXPECT_EQ(cudaMemcpyAsync(h.p, d.p, 16, cudaMemcpyDeviceToHost, s), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    return h.seen();
  }
  static cudaStream_t stream() {
    cudaStream_t s = nullptr;
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    return s;
  }
};

// A kernel and a copy into pinned memory, queued on one stream: nothing has run before the stream
// is synchronized (a host read there sees the old bytes), everything after.
TEST(CudaEmu, DeferredWorkRunsAtTheStreamsSynchronization) {
  REQUIRE_DEFERRED();
  Deferred t;
  DeviceFloats& d = t.d;
  Pinned& h = t.h;
  cudaStream_t s = Deferred::stream();
  ASSERT_EQ(meshmuon::cuda::scale(d.p, d.p, 4, 2.0f, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h.p, d.p, 16, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(h.p[0], -7.0f) << "ran before the synchronization";
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(h.seen(), (std::vector<float>{2, 4, 6, 8}));
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// Streams are not ordered with each other: a copy on stream b of what stream a computes, with
// only b synchronized, reads the memory from before a's kernel (the race a missing synchronization
// makes on a GPU); an event on a, synchronized, orders it.
TEST(CudaEmu, DeferredStreamsAreNotOrderedWithEachOther) {
  REQUIRE_DEFERRED();
  Deferred t;
  DeviceFloats& d = t.d;
  cudaStream_t a = Deferred::stream(), b = Deferred::stream();
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  ASSERT_EQ(meshmuon::cuda::scale(d.p, d.p, 4, 10.0f, a), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
  EXPECT_EQ(t.read_on(b), (std::vector<float>{1, 2, 3, 4})) << "b saw a's unsynchronized work";
  float ms = 0;
  EXPECT_EQ(cudaEventElapsedTime(&ms, e, e), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);  // not yet; the queue moves on
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(e), cudaSuccess);
  EXPECT_EQ(t.read_on(b), (std::vector<float>{10, 20, 30, 40}));
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(a), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(b), cudaSuccess);
}

// cudaStreamWaitEvent orders two streams on the device: b waits for the point a's event recorded
// (not for a's later work, nor for a later record of the same event), and only b is synchronized
// by the host. Without the wait b reads what was there before (DeferredStreamsAreNotOrdered...).
TEST(CudaEmu, DeferredStreamWaitEventOrdersStreamsOnTheDevice) {
  REQUIRE_DEFERRED();
  Deferred t;
  DeviceFloats& d = t.d;
  cudaStream_t a = Deferred::stream(), b = Deferred::stream();
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(meshmuon::cuda::scale(d.p, d.p, 4, 10.0f, a), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
  ASSERT_EQ(meshmuon::cuda::scale(d.p, d.p, 4, 3.0f, a), cudaSuccess);  // after the point b waits for
  ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);                       // a later record: b keeps the first
  EXPECT_EQ(t.read_on(b), (std::vector<float>{10, 20, 30, 40}));
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  EXPECT_EQ(t.read_on(b), (std::vector<float>{30, 60, 90, 120}));
  cudaEvent_t never = nullptr;  // an event never recorded is complete
  ASSERT_EQ(cudaEventCreate(&never), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, never, 0), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(never), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(a), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(b), cudaSuccess);
}

// A device-wide synchronization (here cudaFree's) runs the legacy stream last: work another stream
// queued after the legacy stream's, without waiting for it, runs first and sees the memory from
// before (a GPU may well run it first too), so such a missing wait is not hidden by the order.
TEST(CudaEmu, DeferredDeviceSynchronizationRunsTheLegacyStreamLast) {
  REQUIRE_DEFERRED();
  Deferred t;
  DeviceFloats& d = t.d;
  Pinned& h = t.h;
  cudaStream_t b = Deferred::stream();
  ASSERT_EQ(meshmuon::cuda::scale(d.p, d.p, 4, 3.0f, nullptr), cudaSuccess);  // the legacy stream
  ASSERT_EQ(cudaMemcpyAsync(h.p, d.p, 16, cudaMemcpyDeviceToHost, b), cudaSuccess);
  void* x = nullptr;
  ASSERT_EQ(cudaMalloc(&x, 64), cudaSuccess);
  ASSERT_EQ(cudaFree(x), cudaSuccess);  // synchronizes the device
  EXPECT_EQ(h.seen(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(d.get(), (std::vector<float>{3, 6, 9, 12}));
  EXPECT_EQ(cudaStreamDestroy(b), cudaSuccess);
}

// Pageable host memory, as CUDA treats it: a copy from it takes the source at the call (the
// caller may overwrite it at once), a copy into it has completed when it returns.
TEST(CudaEmu, DeferredCopiesOfPageableMemoryFollowCuda) {
  REQUIRE_DEFERRED();
  DeviceFloats d(4);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  std::vector<float> src = {5, 6, 7, 8}, dst(4, 0.0f);
  ASSERT_EQ(cudaMemcpyAsync(d.p, src.data(), 16, cudaMemcpyHostToDevice, s), cudaSuccess);
  src.assign(4, -1.0f);  // the copy took the bytes already
  ASSERT_EQ(cudaMemcpyAsync(dst.data(), d.p, 16, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(dst, (std::vector<float>{5, 6, 7, 8}));  // complete on return, no synchronization
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(CudaEmu, KernelsRefuseHostPointersAndOverruns) {
  DeviceFloats d(8);
  std::vector<float> h(8, 2.0f);
  EXPECT_EQ(meshmuon::cuda::scale(h.data(), d.p, 8, 0.5f, nullptr), cudaErrorIllegalAddress);
  EXPECT_EQ(meshmuon::cuda::scale(d.p, d.p, 9, 0.5f, nullptr), cudaErrorIllegalAddress);
  d.put(h);
  (void)cudaGetLastError();  // a launcher returns the runtime's last error: clear the earlier tests'
  EXPECT_EQ(meshmuon::cuda::scale(d.p, d.p, 8, 0.5f, nullptr), cudaSuccess);
  EXPECT_EQ(d.get(), std::vector<float>(8, 1.0f));
}

// The tensors of one multi-tensor launch must not overlap (a GPU runs them at once; the emulation
// runs them one after another and would hide the race): two momentum items whose buffers share
// elements fault when the launch runs. The control: the same items side by side run.
void momentum_pair(float* base, int64_t second_buf) {
  meshmuon::cuda::MomentumItem items[2] = {};
  for (int t = 0; t < 2; ++t) {
    items[t].buf = base + (t == 0 ? 0 : second_buf);
    items[t].grad = base + 32 + 4 * t;
    items[t].update = base + 48 + 4 * t;
    items[t].n = 4, items[t].block0 = t, items[t].w_grad = 0.1f, items[t].mu = 0.9f;
  }
  void* table = nullptr;
  ASSERT_EQ(cudaMalloc(&table, sizeof items), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(table, items, sizeof items, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(meshmuon::cuda::momentum_multi(static_cast<const meshmuon::cuda::MomentumItem*>(table), 2, 2, nullptr), cudaSuccess);
  const cudaError_t e = cudaDeviceSynchronize();
  cudaFree(table);
  ASSERT_EQ(e, cudaSuccess);
}
TEST(CudaEmuDeathTest, MultiTensorItemsThatOverlapFault) {
  {
    DeviceFloats d(64);
    d.put(std::vector<float>(64, 1.0f));
    momentum_pair(d.p, 4);  // disjoint: runs
  }
  EXPECT_EXIT(
      {
        DeviceFloats d(64);
        d.put(std::vector<float>(64, 1.0f));
        momentum_pair(d.p, 2);  // the second buffer starts inside the first
        std::exit(::testing::Test::HasFailure() ? 3 : 0);
      },
      ::testing::ExitedWithCode(3), "tensors 0 and 1 of one launch overlap");
}

// Column-major 3×2 = (3×4)·(4×2) through the loaded cuBLAS (MESHMUON_CUBLAS_LIBRARY), against a loop.
TEST(CudaEmu, CublasComputesAndChecksItsArguments) {
  const auto& blas = cublas();
  cublasHandle_t h = nullptr;
  ASSERT_EQ(blas.create(&h), CUBLAS_STATUS_SUCCESS);
  std::vector<float> a(12), b(8);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) - 5;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 3) + 1;
  DeviceFloats da(12), db(8), dc(6);
  da.put(a), db.put(b);
  const float one = 1, zero = 0;
  ASSERT_EQ(blas.sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 3, 2, 4, &one, da.p, 3, db.p, 4, &zero, dc.p, 3), CUBLAS_STATUS_SUCCESS);
  const std::vector<float> c = dc.get();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) {
      float want = 0;
      for (int k = 0; k < 4; ++k) want += a[static_cast<size_t>(k * 3 + i)] * b[static_cast<size_t>(j * 4 + k)];
      EXPECT_EQ(c[static_cast<size_t>(j * 3 + i)], want) << i << "," << j;  // small integers: exact
    }
  // lda below the rows of A: cuBLAS's INVALID_VALUE
  EXPECT_EQ(blas.sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 3, 2, 4, &one, da.p, 2, db.p, 4, &zero, dc.p, 3),
            CUBLAS_STATUS_INVALID_VALUE);
  // a leading dimension that runs past B's allocation, and a host operand: the GPU would fault
  EXPECT_EQ(blas.sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 3, 2, 4, &one, da.p, 3, db.p, 5, &zero, dc.p, 3),
            CUBLAS_STATUS_EXECUTION_FAILED);
  EXPECT_EQ(blas.sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 3, 2, 4, &one, a.data(), 3, db.p, 4, &zero, dc.p, 3),
            CUBLAS_STATUS_EXECUTION_FAILED);
  // bf16 operands widen exactly: 1.5 and 2 are bf16 values
  uint16_t *xa = nullptr, *xb = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&xa), 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&xb), 2), cudaSuccess);
  const uint16_t one_and_half = 0x3FC0, two = 0x4000;
  ASSERT_EQ(cudaMemcpy(xa, &one_and_half, 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(xb, &two, 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(blas.gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, xa, CUDA_R_16BF, 1, xb, CUDA_R_16BF, 1, &zero,
                         dc.p, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(dc.get()[0], 3.0f);
  cudaFree(xa);
  cudaFree(xb);
}

// The cuda backend on device 1 of two (emulated) leaves the caller's current device as it was:
// torch's current device on the calling thread is not the backend's business.
TEST(CudaEmu, CudaBackendLeavesTheCallersDeviceCurrent) {
  ::setenv("MESHMUON_CUDA_EMU_DEVICES", "2", 1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto be = meshmuon::detail::make_cuda_backend(1);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0) << "make_cuda_backend";
  meshmuon::detail::Buffer b = be->allocate(64, meshmuon::detail::MemoryKind::Device);
  be->fill_zero(b.data(), 64);
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0) << "allocate / fill_zero";
  {  // a LocalOptimizer step on device 1 (its compute jobs run on the caller's thread)
    meshmuon::ParamInfo info;
    info.name = "w", info.shape = {6, 4};
    meshmuon::LocalOptimizerOptions o;
    o.device = "cuda:1";
    meshmuon::LocalOptimizer opt({info}, {meshmuon::ParamGroup{meshmuon::GroupOptions{}, {0}}}, o);
    std::vector<float> h(24, 0.5f);
    meshmuon::detail::Buffer w = be->allocate(96, meshmuon::detail::MemoryKind::Device);
    meshmuon::detail::Buffer g = be->allocate(96, meshmuon::detail::MemoryKind::Device);
    be->copy(w.data(), h.data(), 96), be->copy(g.data(), h.data(), 96);
    std::vector<meshmuon::TensorView> wv = {meshmuon::TensorView(w.as<float>(), info.shape)};
    std::vector<meshmuon::TensorView> gv = {meshmuon::TensorView(g.as<float>(), info.shape)};
    wv[0].device = gv[0].device = {meshmuon::DeviceKind::Cuda, 1};
    ASSERT_TRUE(opt.step(wv, gv));
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, 0) << "LocalOptimizer::step on cuda:1";
  }
  ::unsetenv("MESHMUON_CUDA_EMU_DEVICES");
}

}  // namespace
