// Test infrastructure: the cuda backend's device code (src/backend/cuda/device_code.cuh: every
// kernel and launcher of cuda_kernels.cu) compiled for the host and run with CUDA's execution model,
// so the machines without a GPU run the .cu code itself, not a twin of it:
//   - meshmuon::cuda_host::<launcher>(...) is the launcher of cuda_kernels.h, its grid and guards
//     included; it runs its kernels at once, on the calling thread (the stream is ignored).
//   - A kernel without barriers runs its blocks one after another and each block's threads one
//     after another (threadIdx, blockIdx, blockDim, gridDim set as CUDA sets them), in the order
//     MESHMUON_CUDA_HOST_ORDER names (ascending, descending, alternating: the default).
//   - A kernel with barriers (kBarrierKernels) runs each block's threads as fibers on the calling
//     thread (ucontext stacks, _setjmp/_longjmp switches): __syncthreads switches to the next thread, and a block's round ends when
//     every thread has reached the barrier (each round in the order above, so a missing barrier
//     shows in one order or another); __shared__ arrays are static thread_local, so the fibers of
//     a block share them and two OS threads running kernels do not.
//   - The CUDA intrinsics are their IEEE operations, each rounded once: the includer compiles with
//     -ffp-contract=off (no fused multiply-add but __fmaf_rn's std::fma; clang is told so below too).
// What this cannot show: races inside a kernel (threads never overlap), warp-level behavior, the
// GPU's NaN payloads (x86's here), shared memory read before it is written in a block (it holds the
// previous block's values here, garbage on a GPU). A kernel that reaches __syncthreads without being
// listed in kBarrierKernels, or whose threads reach different numbers of barriers, aborts with its
// name.
// Users: tests/unit/cuda_kernels_host_test.cpp and the CUDA emulation (tests/cuda_emu/kernels.cpp).
#pragma once

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
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
// AddressSanitizer would need each switch announced (__sanitizer_start_switch_fiber) and reports
// false positives without: the targets that include this are not built under MESHMUON_SANITIZE=address.
#if defined(__SANITIZE_ADDRESS__)
#error "tests/support/cuda_on_host.h switches fiber stacks: not built under AddressSanitizer"
#endif

#include "backend/cuda/device_scratch.h"
#include "backend/cuda/multi_tensor.h"
#include "backend/pack.h"

namespace meshmuon::cuda_host {

using ::meshmuon::cuda::AdamWItem;
using ::meshmuon::cuda::ApplyItem;
using ::meshmuon::cuda::kSumSquaresBlocks;
using ::meshmuon::cuda::MomentumItem;
using ::meshmuon::cuda::multi_tensor_blocks;
using ::meshmuon::cuda::NonFiniteItem;
using ::meshmuon::cuda::NormuonScratch;
using ::meshmuon::detail::PackConv;
using ::meshmuon::detail::PackRun;
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
#define MESHMUON_HOST_TLS thread_local __attribute__((tls_model("initial-exec")))
// (constinit: no TLS wrapper function that checks for a dynamic initialization on every read)
inline constinit MESHMUON_HOST_TLS uint3 threadIdx, blockIdx;
inline constinit MESHMUON_HOST_TLS dim3 blockDim, gridDim;

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
                                                "normuon_ratio_kernel", "muon_eq_row_sq_kernel",
                                                "muon_eq_target_kernel"};
  for (const char* k : kBarrierKernels)
    if (std::strcmp(k, name) == 0) return true;
  return false;
}

inline uint3 thread_index(unsigned t, const dim3& block) {
  return {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
}

// The order in which a block's threads run (in each round between barriers, for a barrier kernel):
// threads that wrongly rely on an order (a missing barrier) give other results in another one, so
// the host test runs under each (MESHMUON_CUDA_HOST_ORDER=ascending|descending|alternating; default
// alternating: rounds, and the blocks of a barrier-free kernel, alternate the direction).
enum class Order : int { Ascending, Descending, Alternating };
inline std::atomic<int>& order_setting() {
  static std::atomic<int> order([] {
    const char* e = std::getenv("MESHMUON_CUDA_HOST_ORDER");
    if (e == nullptr || *e == 0 || std::strcmp(e, "alternating") == 0) return static_cast<int>(Order::Alternating);
    if (std::strcmp(e, "ascending") == 0) return static_cast<int>(Order::Ascending);
    if (std::strcmp(e, "descending") == 0) return static_cast<int>(Order::Descending);
    die("MESHMUON_CUDA_HOST_ORDER must be ascending, descending or alternating", e);
  }());
  return order;
}
inline Order order() { return static_cast<Order>(order_setting().load(std::memory_order_relaxed)); }
inline void set_order(Order o) { order_setting().store(static_cast<int>(o), std::memory_order_relaxed); }
// The k-th thread to run of n, in round (or block) r.
inline unsigned in_order(unsigned k, unsigned n, unsigned r, Order o) {
  const bool down = o == Order::Descending || (o == Order::Alternating && r % 2 == 1);
  return down ? n - 1 - k : k;
}

// One block's threads as fibers on the calling OS thread, kept per thread and reused by every block
// and launch. A fiber is made once (makecontext, entered once with setcontext) and then loops: run
// the launch's body, mark itself Done, yield. Switches are _setjmp/_longjmp between the fiber stacks
// and the scheduler: no system call (swapcontext saves the signal mask with one, each switch, which
// made a 1M-element Σ x² take 0.9 s). Stacks are mapped with a guard page below them (an overflow
// faults instead of writing over the heap) and take memory only as they are used (kernels use
// ~4 KB).
struct Fibers {
  static constexpr size_t kStack = 64 << 10;
  enum State : uint8_t { Runnable, AtBarrier, Done };
  struct Stack {
    std::byte* base = nullptr;  // the guard page, then kStack bytes
    size_t guard = 0;
    Stack() {
      guard = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      void* p = mmap(nullptr, guard + kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) die("mmap of a fiber stack failed", nullptr);
      base = static_cast<std::byte*>(p);
      if (mprotect(base, guard, PROT_NONE) != 0) die("mprotect of a fiber stack's guard page failed", nullptr);
    }
    ~Stack() { munmap(base, guard + kStack); }
    Stack(const Stack&) = delete;
    Stack& operator=(const Stack&) = delete;
    std::byte* bottom() const { return base + guard; }
  };
  struct Fiber {  // never moved: a made ucontext_t points into itself
    ucontext_t first;  // its first entry
    jmp_buf at;        // where it yielded
    Stack stack;
    bool started = false;
  };
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::vector<State> state;
  jmp_buf scheduler;
  const std::function<void()>* body = nullptr;
  const char* kernel = nullptr;
  unsigned current = 0;
};
inline constinit MESHMUON_HOST_TLS Fibers* running = nullptr;  // the team whose block runs on this thread now
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
  fiber.first.uc_stack.ss_sp = fiber.stack.bottom();
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
  const Order o = order();
  for (unsigned round = 0;; ++round) {  // a round: every live thread runs to its next barrier or its end
    unsigned at_barrier = 0, done = 0;
    for (unsigned k = 0; k < threads; ++k) {
      const unsigned t = in_order(k, threads, round, o);
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
  const Order o = order();
  for (unsigned j = 0; j < grid.x; ++j) {
    const unsigned b = o == Order::Descending ? grid.x - 1 - j : j;
    blockIdx = {b, 0, 0};
    if (barriers) {
      run_block_as_fibers(threads, block, as_function, kernel);
    } else {
      for (unsigned k = 0; k < threads; ++k) {
        threadIdx = thread_index(in_order(k, threads, b, o), block);
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
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
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
#define __shared__ static thread_local  // (default TLS model: ~17 KB, too much for initial-exec)
#define MESHMUON_GRID_LOOP(i, n)                                                                    \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
#define MESHMUON_LAUNCH(kernel, grid, block, stream)                                                    \
  (static_cast<void>(stream), ::meshmuon::cuda_host::detail::make_launch(&kernel, #kernel, ::meshmuon::cuda_host::dim3(grid), \
                                                                      ::meshmuon::cuda_host::dim3(block)))

namespace {  // the launchers too: every file that includes this gets its own copy
#include "backend/cuda/device_code.cuh"
}  // namespace

#undef MESHMUON_LAUNCH
#undef MESHMUON_GRID_LOOP
#undef __global__
#undef __device__
#undef __forceinline__
#undef __shared__
#pragma pop_macro("__global__")
#pragma pop_macro("__device__")
#pragma pop_macro("__forceinline__")
#pragma pop_macro("__shared__")

}  // namespace meshmuon::cuda_host
