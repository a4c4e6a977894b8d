// Test infrastructure: the cuda backend's device code (src/backend/cuda/device_code.cuh: every
// kernel and launcher of cuda_kernels.cu) compiled for the host and run with CUDA's execution model,
// so the machines without a GPU run the .cu code itself, not a twin of it:
//   - dmuon::cuda_host::<launcher>(...) is the launcher of cuda_kernels.h, its grid and guards
//     included; it runs its kernels at once, on the calling thread (the stream is ignored).
//   - A kernel without barriers runs its blocks one after another and each block's threads one
//     after another (threadIdx, blockIdx, blockDim, gridDim set as CUDA sets them).
//   - A kernel with barriers (kBarrierKernels) runs each block's threads as fibers on the calling
//     thread (ucontext stacks, _setjmp/_longjmp switches): __syncthreads switches to the next thread, and a block's round ends when
//     every thread has reached the barrier; __shared__ arrays are static thread_local, so the fibers
//     of a block share them and two OS threads running kernels do not.
//   - The CUDA intrinsics are their IEEE operations, each rounded once: the includer compiles with
//     -ffp-contract=off (no fused multiply-add but __fmaf_rn's std::fma).
// What this cannot show: races inside a kernel (threads never overlap), warp-level behavior, the
// GPU's NaN payloads (x86's here), shared memory read before it is written in a block (it holds the
// previous block's values here, garbage on a GPU). A kernel that reaches __syncthreads without being
// listed in kBarrierKernels, or whose threads reach different numbers of barriers, aborts with its
// name.
// Users: tests/unit/cuda_kernels_host_test.cpp and the CUDA emulation (tests/cuda_emu/kernels.cpp).
#pragma once

#include <setjmp.h>
#include <ucontext.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <vector>

// _longjmp between stacks is what fortified builds reject (__longjmp_chk): the includer compiles
// with -U_FORTIFY_SOURCE.
#if defined(_FORTIFY_SOURCE) && _FORTIFY_SOURCE > 0 && defined(__OPTIMIZE__)
#error "tests/support/cuda_on_host.h switches stacks with _longjmp: compile it with -U_FORTIFY_SOURCE"
#endif

#include "backend/cuda/device_scratch.h"
#include "backend/cuda/multi_tensor.h"
#include "backend/pack.h"

namespace dmuon::cuda_host {

using ::dmuon::cuda::AdamWItem;
using ::dmuon::cuda::ApplyItem;
using ::dmuon::cuda::kSumSquaresBlocks;
using ::dmuon::cuda::MomentumItem;
using ::dmuon::cuda::multi_tensor_blocks;
using ::dmuon::cuda::NonFiniteItem;
using ::dmuon::cuda::NormuonScratch;
using ::dmuon::detail::PackConv;
using ::dmuon::detail::PackRun;
using cpu::AdamScalars;

// ---- the runtime's types, for the host ---------------------------------------------------------------
using cudaStream_t = const void*;  // ignored: a host launch runs at once
using cudaError_t = int;
inline constexpr cudaError_t cudaSuccess = 0;
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
// initial-exec: read with one instruction, also from the emulation's shared library (which the test
// binaries link, never dlopen first), where the default model calls __tls_get_addr on every read of
// threadIdx, and the kernels read it per element.
#define DMUON_HOST_TLS thread_local __attribute__((tls_model("initial-exec")))
// (constinit: no TLS wrapper function that checks for a dynamic initialization on every read)
inline constinit DMUON_HOST_TLS uint3 threadIdx, blockIdx;
inline constinit DMUON_HOST_TLS dim3 blockDim, gridDim;

// ---- the intrinsics: IEEE operations rounded once each -------------------------------------------------
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __uint_as_float(uint32_t u) { return std::bit_cast<float>(u); }
inline uint32_t __float_as_uint(float f) { return std::bit_cast<uint32_t>(f); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline float __double2float_rn(double a) { return static_cast<float>(a); }
// The threads of a launch never overlap here: a plain read-modify-write is atomic.
inline unsigned long long atomicMin(unsigned long long* a, unsigned long long v) {
  const unsigned long long old = *a;
  if (v < old) *a = v;
  return old;
}

// ---- launches --------------------------------------------------------------------------------------------
namespace detail {

[[noreturn]] inline void die(const char* what, const char* kernel) {
  std::fprintf(stderr, "cuda_on_host: %s (kernel %s)\n", what, kernel ? kernel : "?");
  std::abort();
}

// The kernels that call __syncthreads: their blocks run as fibers.
inline bool uses_barriers(const char* name) {
  static const char* const kBarrierKernels[] = {"sum_squares_partial_kernel", "sum_partials_kernel",
                                                "normuon_row_mean_square_kernel", "normuon_norm_kernel",
                                                "normuon_ratio_kernel"};
  for (const char* k : kBarrierKernels)
    if (std::strcmp(k, name) == 0) return true;
  return false;
}

inline uint3 thread_index(unsigned t, const dim3& block) {
  return {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
}

// One block's threads as fibers on the calling OS thread, kept per thread and reused by every block
// and launch. A fiber is made once (makecontext, entered once with setcontext) and then loops: run
// the launch's body, mark itself Done, yield. Switches are _setjmp/_longjmp between the fiber stacks
// and the scheduler: no system call (swapcontext saves the signal mask with one, each switch, which
// made a 1M-element Σ x² take 0.9 s).
struct Fibers {
  static constexpr size_t kStack = 64 << 10;
  enum State : uint8_t { Runnable, AtBarrier, Done };
  struct Fiber {  // never moved: a made ucontext_t points into itself
    ucontext_t first;  // its first entry
    jmp_buf at;        // where it yielded
    std::unique_ptr<std::byte[]> stack = std::make_unique<std::byte[]>(kStack);
    bool started = false;
  };
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::vector<State> state;
  jmp_buf scheduler;
  const std::function<void()>* body = nullptr;
  const char* kernel = nullptr;
  unsigned current = 0;
};
inline constinit DMUON_HOST_TLS Fibers* running = nullptr;  // the team whose block runs on this thread now
inline Fibers& team() {
  static thread_local Fibers fibers;
  return fibers;
}

inline void yield_to_scheduler(Fibers& f) {
  if (_setjmp(f.fibers[f.current]->at) == 0) _longjmp(f.scheduler, 1);
}

inline void fiber_main() {
  for (;;) {  // one launch's body per turn; a fiber lives as long as its OS thread
    Fibers& f = team();
    (*f.body)();
    f.state[f.current] = Fibers::Done;
    yield_to_scheduler(f);
  }
}

// Runs fiber t until it yields (at a barrier, or done with its body). Its own frame: nothing of the
// caller's lives across the jump.
[[gnu::noinline]] inline void resume(Fibers& f, unsigned t) {
  if (_setjmp(f.scheduler) != 0) return;
  Fibers::Fiber& fiber = *f.fibers[t];
  if (!fiber.started) {
    fiber.started = true;
    setcontext(&fiber.first);
    die("setcontext failed", f.kernel);
  }
  _longjmp(fiber.at, 1);
}

// (getcontext returns twice, as setjmp: in a frame of its own too.)
[[gnu::noinline]] inline void add_fiber(Fibers& f) {
  auto& fiber = *f.fibers.emplace_back(std::make_unique<Fibers::Fiber>());
  if (getcontext(&fiber.first) != 0) die("getcontext failed", nullptr);
  fiber.first.uc_stack.ss_sp = fiber.stack.get();
  fiber.first.uc_stack.ss_size = Fibers::kStack;
  fiber.first.uc_link = nullptr;  // fiber_main never returns
  makecontext(&fiber.first, fiber_main, 0);
}

inline void run_block_as_fibers(unsigned threads, const dim3& block, const std::function<void()>& body,
                                const char* kernel) {
  Fibers& f = team();
  if (running != nullptr) die("a barrier kernel launched from inside another", kernel);
  while (f.fibers.size() < threads) add_fiber(f);
  f.state.assign(threads, Fibers::Runnable);
  f.body = &body;
  f.kernel = kernel;
  running = &f;
  for (;;) {  // a round: every live thread runs to its next barrier or its end
    unsigned at_barrier = 0, done = 0;
    for (unsigned t = 0; t < threads; ++t) {
      if (f.state[t] == Fibers::Done) {
        ++done;
        continue;
      }
      f.state[t] = Fibers::Runnable;
      f.current = t;
      threadIdx = thread_index(t, block);
      resume(f, t);
      if (f.state[t] == Fibers::Done) ++done;
      else ++at_barrier;
    }
    if (done == threads) break;
    if (done > 0 && at_barrier > 0) die("threads of one block reached different numbers of __syncthreads", kernel);
  }
  running = nullptr;
}

// The blocks of a launch one after another; with `barriers`, each block's threads as fibers.
template <class Body>
void run_blocks(const dim3& grid, const dim3& block, const char* kernel, const Body& body, bool barriers) {
  if (grid.y != 1 || grid.z != 1) die("only one-dimensional grids are launched", kernel);
  const unsigned threads = block.x * block.y * block.z;
  if (grid.x == 0 || threads == 0 || threads > 1024) die("an empty grid or block, or a block over 1024 threads", kernel);
  gridDim = grid;
  blockDim = block;
  const std::function<void()> as_function = barriers ? std::function<void()>(std::cref(body)) : nullptr;
  for (unsigned b = 0; b < grid.x; ++b) {
    blockIdx = {b, 0, 0};
    if (barriers) {
      run_block_as_fibers(threads, block, as_function, kernel);
    } else {
      for (unsigned t = 0; t < threads; ++t) {
        threadIdx = thread_index(t, block);
        body();
      }
    }
  }
}

template <class... P>
struct Launch {
  void (*kernel)(P...);
  const char* name;
  dim3 grid, block;
  template <class... A>
  void operator()(A&&... a) const {
    const std::tuple<P...> args(static_cast<P>(a)...);
    run_blocks(grid, block, name, [&] { std::apply(kernel, args); }, uses_barriers(name));
  }
};
template <class... P>
Launch<P...> make_launch(void (*kernel)(P...), const char* name, dim3 grid, dim3 block) {
  return {kernel, name, grid, block};
}

}  // namespace detail

inline void __syncthreads() {
  detail::Fibers* f = detail::running;
  if (f == nullptr) detail::die("__syncthreads in a kernel not listed in kBarrierKernels", nullptr);
  f->state[f->current] = detail::Fibers::AtBarrier;
  detail::yield_to_scheduler(*f);
}

inline constexpr int kThreads = 256;  // cuda_kernels.cu's block size (the reduction trees depend on it)
inline cudaError_t done() { return cudaSuccess; }

// The device code, with CUDA's qualifiers spelled for the host (the CUDA headers, where a file
// includes them, define these macros their own way: kept aside and restored).
#pragma push_macro("__global__")
#pragma push_macro("__device__")
#pragma push_macro("__forceinline__")
#pragma push_macro("__shared__")
#undef __global__
#undef __device__
#undef __forceinline__
#undef __shared__
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static DMUON_HOST_TLS
#define DMUON_GRID_LOOP(i, n)                                                                    \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
#define DMUON_LAUNCH(kernel, grid, block, stream)                                                    \
  (static_cast<void>(stream), ::dmuon::cuda_host::detail::make_launch(&kernel, #kernel, ::dmuon::cuda_host::dim3(grid), \
                                                                      ::dmuon::cuda_host::dim3(block)))

namespace {  // the launchers too: every file that includes this gets its own copy
#include "backend/cuda/device_code.cuh"
}  // namespace

#undef DMUON_LAUNCH
#undef DMUON_GRID_LOOP
#undef __global__
#undef __device__
#undef __forceinline__
#undef __shared__
#pragma pop_macro("__global__")
#pragma pop_macro("__device__")
#pragma pop_macro("__forceinline__")
#pragma pop_macro("__shared__")

}  // namespace dmuon::cuda_host
