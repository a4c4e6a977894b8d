// The cuda backend's device code run on the host with CUDA's execution model, on every CI machine
// (no GPU, no CUDA toolkit): the reductions of src/backend/cuda/reductions.cuh (Σ x², NorMuon's; a
// launch runs its blocks one after another, each block as one std::thread per CUDA thread sharing
// the block's __shared__ arrays, __syncthreads a std::barrier of the block), and the element-wise
// and multi-tensor kernels of elementwise.cuh and the pack kernel of pack.cuh (no barriers: threads
// one after another). Results must be bitwise those of the cpu kernels and of the sums the kernels
// promise, over shapes that are not multiples of the tiles, grids smaller than the work, sums longer
// than one staging tile, empty dimensions, and pack items at every byte offset. Built with
// -fsanitize=alignment: an access a GPU would fault on as misaligned stops the test (x86 forgives
// it). Limits: __shared__ arrays are static here, so a kernel reading one before writing it could
// see an earlier block's values; NaN results carry x86's payloads, not the GPU's canonical NaN (no
// update kernel's output is compared on non-finite input). Negative controls run when the kernels
// were written: a transposed tile read, a wrong binary search and a swapped half-word each fail.
// Run: build/bin/cuda_kernels_host_test
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <random>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/multi_tensor.h"
#include "backend/pack.h"
#include "dmuon/bf16.h"
#include "dmuon/update.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/update_args.h"

namespace dmuon::cuda_host {
namespace {

// ---- CUDA's execution model on host threads --------------------------------------------------------
struct Index3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
thread_local Index3 threadIdx, blockIdx;
Index3 blockDim, gridDim;
std::barrier<>* block_barrier = nullptr;
void __syncthreads() { block_barrier->arrive_and_wait(); }
// IEEE operations rounded once each (this file is built with -ffp-contract=off: no fused multiply-add).
float __fadd_rn(float a, float b) { return a + b; }
float __fsub_rn(float a, float b) { return a - b; }
float __fmul_rn(float a, float b) { return a * b; }
float __fdiv_rn(float a, float b) { return a / b; }
float __fsqrt_rn(float a) { return std::sqrt(a); }
float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
float __uint_as_float(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t __float_as_uint(float f) { return std::bit_cast<uint32_t>(f); }
// The element-wise kernels run their threads one after another (no barriers in them): a plain min.
unsigned long long atomicMin(unsigned long long* a, unsigned long long v) {
  const unsigned long long old = *a;
  if (v < old) *a = v;
  return old;
}
double __dadd_rn(double a, double b) { return a + b; }
double __dmul_rn(double a, double b) { return a * b; }
double __ddiv_rn(double a, double b) { return a / b; }
double __dsqrt_rn(double a) { return std::sqrt(a); }
float __double2float_rn(double a) { return static_cast<float>(a); }
constexpr int kThreads = 256;  // as cuda_kernels.cu
#define __global__
#define __shared__ static  // one block at a time: static storage is the block's shared memory
#define DMUON_GRID_LOOP(i, n)                                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

#include "backend/cuda/reductions.cuh"

#define __device__
#define __forceinline__ inline
using namespace ::dmuon::cuda;  // the multi-tensor tables (multi_tensor.h)
#include "backend/cuda/elementwise.cuh"
using detail::PackConv;
using detail::PackRun;
#include "backend/cuda/pack.cuh"

#undef __device__
#undef __forceinline__
#undef __global__
#undef __shared__

template <class Kernel>
void launch(dim3 grid, dim3 block, Kernel kernel) {
  gridDim = {grid.x, grid.y, grid.z};
  blockDim = {block.x, block.y, block.z};
  const unsigned threads = block.x * block.y * block.z;
  for (unsigned b = 0; b < grid.x; ++b) {
    std::barrier<> barrier(threads);
    block_barrier = &barrier;
    std::vector<std::thread> team;
    for (unsigned t = 0; t < threads; ++t)
      team.emplace_back([&, t, b] {
        blockIdx = {b, 0, 0};
        threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
        kernel();
      });
    for (std::thread& t : team) t.join();
  }
}

// A kernel without barriers: its threads run one after another, block by block.
template <class Kernel>
void launch_serial(int64_t grid, unsigned block, Kernel kernel) {
  gridDim = {static_cast<unsigned>(grid), 1, 1};
  blockDim = {block, 1, 1};
  for (int64_t b = 0; b < grid; ++b)
    for (unsigned t = 0; t < block; ++t) {
      blockIdx = {static_cast<unsigned>(b), 0, 0};
      threadIdx = {t, 0, 0};
      kernel();
    }
}

std::vector<float> normal(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what;
}

// The per-row (tiled through shared memory) and per-column mean squares, on grids smaller and
// larger than the work, equal the cpu kernel's bits.
TEST(CudaKernelsOnHost, NormuonMeanSquaresAreTheCpuKernelsBits) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{70, 33}, {64, 64}, {200, 37}, {100, 1}, {5, 1},
                                                           {33, 70}, {1, 5},   {3, 300},  {40, 0}};
  for (const auto& [rows, cols] : shapes) {
    const std::vector<float> u = normal(static_cast<size_t>(rows * cols), static_cast<unsigned>(rows * 131 + cols));
    const int64_t len = normuon_state_size(rows, cols);
    std::vector<float> want(static_cast<size_t>(len)), got(static_cast<size_t>(len), -1.0f);
    normuon_mean_square(u.data(), rows, cols, want.data());
    for (unsigned grid : {1u, 2u, 7u}) {
      std::fill(got.begin(), got.end(), -1.0f);
      if (rows >= cols)
        launch(dim3(grid), dim3(kRowTile, kRowWarps), [&] { normuon_row_mean_square_kernel(u.data(), rows, cols, got.data()); });
      else
        launch(dim3(grid), dim3(64), [&] { normuon_column_mean_square_kernel(u.data(), rows, cols, got.data()); });
      expect_bitwise(got, want, (std::to_string(rows) + "x" + std::to_string(cols) + " grid " + std::to_string(grid)).c_str());
    }
  }
}

// The two ordered sums (staged kSumTile at a time by one block) equal the sequential sums of
// normuon_finish, also over several tiles.
TEST(CudaKernelsOnHost, NormuonOrderedSumsAreSequential) {
  for (int64_t len : {int64_t{1}, int64_t{37}, int64_t{kSumTile}, int64_t{kSumTile / 2 + 1}, int64_t{5000}}) {
    std::vector<float> v_mean = normal(static_cast<size_t>(len), 7), step = normal(static_cast<size_t>(len), 8);
    for (float& x : v_mean) x = std::fabs(x);
    for (float& x : step) x = std::fabs(x) + 0.1f;
    const double k = 3;
    double sum = 0, sum_new = 0;
    for (int64_t i = 0; i < len; ++i) {
      sum += v_mean[static_cast<size_t>(i)];
      const double s = step[static_cast<size_t>(i)];
      sum_new += static_cast<double>(v_mean[static_cast<size_t>(i)]) * k * (s * s);
    }
    const double norm_want = std::sqrt(sum * k);
    const float ratio_want = static_cast<float>(norm_want / std::max(std::sqrt(sum_new), 1e-10));
    double norm = -1;
    float ratio = -1;
    launch(dim3(1), dim3(kThreads), [&] { normuon_norm_kernel(v_mean.data(), len, k, &norm); });
    launch(dim3(1), dim3(kThreads), [&] { normuon_ratio_kernel(v_mean.data(), step.data(), len, k, &norm, &ratio); });
    EXPECT_EQ(std::memcmp(&norm, &norm_want, sizeof norm), 0) << "norm, length " << len;
    EXPECT_EQ(std::memcmp(&ratio, &ratio_want, sizeof ratio), 0) << "ratio, length " << len;
  }
}

// Σ x² as the two kernels promise: per block, thread t's strided sum over the grid, the block's
// 256 partials added by the fixed halving tree; then one block does the same over the partials. The
// same bits on every run, for any n (one block, a partial last block, more blocks than elements).
double tree(std::vector<double> p) {
  for (size_t w = p.size() / 2; w > 0; w /= 2)
    for (size_t t = 0; t < w; ++t) p[t] = p[t] + p[t + w];
  return p[0];
}
TEST(CudaKernelsOnHost, SumOfSquaresFollowsItsFixedTree) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{4097}, int64_t{20000}}) {
    const std::vector<float> x = normal(static_cast<size_t>(n), static_cast<unsigned>(n + 3));
    for (unsigned blocks : {1u, 3u, 9u}) {
      std::vector<double> partials(blocks, -1.0);
      double got = -1;
      launch(dim3(blocks), dim3(kThreads), [&] { sum_squares_partial_kernel(x.data(), n, partials.data()); });
      launch(dim3(1), dim3(kThreads), [&] { sum_partials_kernel(partials.data(), static_cast<int>(blocks), &got); });
      std::vector<double> want_partials(blocks), lane(kThreads);
      for (unsigned b = 0; b < blocks; ++b) {
        for (int t = 0; t < kThreads; ++t) {
          double acc = 0;
          for (int64_t i = b * int64_t{kThreads} + t; i < n; i += int64_t{blocks} * kThreads)
            acc = acc + static_cast<double>(x[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)];
          lane[static_cast<size_t>(t)] = acc;
        }
        want_partials[b] = tree(lane);
      }
      for (int t = 0; t < kThreads; ++t) {
        double acc = 0;
        for (unsigned i = static_cast<unsigned>(t); i < blocks; i += kThreads) acc = acc + want_partials[i];
        lane[static_cast<size_t>(t)] = acc;
      }
      const double want = tree(lane);
      EXPECT_EQ(std::memcmp(partials.data(), want_partials.data(), blocks * sizeof(double)), 0) << "n " << n << " blocks " << blocks;
      EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << "n " << n << " blocks " << blocks;
    }
  }
}

// The multi-tensor kernels (momentum with the comm rounding, apply, AdamW, the non-finite scan) on
// one table of tensors of odd sizes, both gradient dtypes and per-tensor options, their blocks laid
// out as the cuda backend lays them (multi_tensor_blocks): every tensor bitwise what the cpu backend
// gives it alone. A block that found the wrong tensor, or a stride that skipped or repeated
// elements, changes bits here.
TEST(CudaKernelsOnHost, MultiTensorKernelsAreTheCpuKernelsPerTensor) {
  auto cpu = detail::make_cpu_backend();
  const std::vector<int64_t> sizes = {777, 1, 300001, 4096, 33, 1025};
  struct T {
    std::vector<float> buf, g, upd, p, m, v;
    std::vector<BFloat16> gb;
    bool bf16;
    std::vector<float> scan = {};  // the non-finite scan's input where it differs from g
    std::vector<BFloat16> scan_bf16 = {};
  };
  std::vector<T> dev(sizes.size()), ref(sizes.size());
  std::vector<MomentumItem> mom;
  std::vector<ApplyItem> app;
  std::vector<AdamWItem> adw;
  std::vector<NonFiniteItem> nfi;
  int64_t blocks = 0;
  for (size_t t = 0; t < sizes.size(); ++t) {
    const int64_t n = sizes[t];
    const auto un = static_cast<unsigned>(t);
    T x{normal(n, 10 + un), normal(n, 20 + un), std::vector<float>(n), normal(n, 30 + un), normal(n, 40 + un),
        normal(n, 50 + un), {}, t % 2 == 1};
    for (float& e : x.v) e = e * e;
    x.gb.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x.gb[static_cast<size_t>(i)] = float_to_bf16(x.g[static_cast<size_t>(i)]);
    dev[t] = x, ref[t] = x;
    T& d = dev[t];
    const void* g = d.bf16 ? static_cast<const void*>(d.gb.data()) : d.g.data();
    const MomentumOptions mo{t % 2 == 0 ? MomentumKind::Ema : MomentumKind::HeavyBall, 0.9 + 0.01 * static_cast<double>(t), t % 3 != 0};
    MomentumItem mi{};
    mi.buf = d.buf.data(), mi.grad = g, mi.update = d.upd.data(), mi.n = n, mi.block0 = blocks;
    mi.w_grad = cpu::to_scalar(1.0 - mo.momentum), mi.mu = cpu::to_scalar(mo.momentum), mi.grad_bf16 = d.bf16;
    mi.heavy_ball = mo.kind == MomentumKind::HeavyBall, mi.nesterov = mo.nesterov, mi.round_bf16 = t % 2 == 0;
    mom.push_back(mi);
    const ApplyOptions ao{0.02, 0.03 + 0.01 * static_cast<double>(t), 0.1, t % 2 == 1};
    ApplyItem ai{};
    ai.p = d.p.data(), ai.u = d.upd.data(), ai.n = n, ai.block0 = blocks, ai.cautious = ao.cautious;
    ai.a = cpu::to_scalar(ao.cautious ? ao.adjusted_lr : 1.0 - ao.lr * ao.weight_decay);
    ai.b = cpu::to_scalar(ao.cautious ? ao.lr * ao.weight_decay : -ao.adjusted_lr);
    app.push_back(ai);
    AdamWOptions wo;
    wo.lr = 1e-3 * static_cast<double>(t + 1), wo.weight_decay = 0.01, wo.step = static_cast<int64_t>(t) + 1;
    adw.push_back({cpu::adamw_args(wo, d.p.data(), g, d.m.data(), d.v.data(), n), d.p.data(), g, d.m.data(), d.v.data(), n,
                   blocks, d.bf16, 0});
    // the scan reads its own copy of the gradient, with an inf and a NaN planted in tensor 3 (the
    // update kernels' NaN bits are the hardware's, not compared here)
    if (t == 3) {
      d.scan = d.g, d.scan[static_cast<size_t>(n / 2)] = std::numeric_limits<float>::infinity();
      d.scan[static_cast<size_t>(n - 1)] = NAN;
      d.scan_bf16.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) d.scan_bf16[static_cast<size_t>(i)] = float_to_bf16(d.scan[static_cast<size_t>(i)]);
      ref[t].scan = d.scan, ref[t].scan_bf16 = d.scan_bf16;
    }
    const void* scanned = t != 3 ? g : d.bf16 ? static_cast<const void*>(d.scan_bf16.data()) : d.scan.data();
    nfi.push_back({scanned, n, blocks, d.bf16, static_cast<int32_t>(t)});
    blocks += multi_tensor_blocks(n);
    // the cpu, tensor by tensor: momentum (+ rounding), apply with that update, then AdamW
    T& r = ref[t];
    const TensorView rg(r.bf16 ? static_cast<void*>(r.gb.data()) : r.g.data(), r.bf16 ? DType::BF16 : DType::F32, Shape{n});
    cpu->momentum(mo, r.buf.data(), rg, r.upd.data());
    cpu->round_to_comm(r.upd.data(), n, t % 2 == 0 ? DType::BF16 : DType::F32);
    cpu->apply_update(ao, r.p.data(), r.upd.data(), n);
    cpu->adamw(wo, r.p.data(), rg, r.m.data(), r.v.data());
  }
  const int count = static_cast<int>(sizes.size());
  std::vector<unsigned long long> flags(sizes.size(), ~0ull);
  launch_serial(blocks, kThreads, [&] { non_finite_multi_kernel(nfi.data(), count, flags.data()); });
  launch_serial(blocks, kThreads, [&] { momentum_multi_kernel(mom.data(), count); });
  launch_serial(blocks, kThreads, [&] { apply_multi_kernel(app.data(), count); });
  launch_serial(blocks, kThreads, [&] { adamw_multi_kernel(adw.data(), count); });
  for (size_t t = 0; t < sizes.size(); ++t) {
    const std::string what = "tensor " + std::to_string(t);
    expect_bitwise(dev[t].buf, ref[t].buf, (what + " momentum buffer").c_str());
    expect_bitwise(dev[t].upd, ref[t].upd, (what + " update").c_str());
    expect_bitwise(dev[t].p, ref[t].p, (what + " parameter").c_str());
    expect_bitwise(dev[t].m, ref[t].m, (what + " exp_avg").c_str());
    expect_bitwise(dev[t].v, ref[t].v, (what + " exp_avg_sq").c_str());
    T& r = ref[t];
    void* scanned = t != 3 ? (r.bf16 ? static_cast<void*>(r.gb.data()) : r.g.data())
                           : (r.bf16 ? static_cast<void*>(r.scan_bf16.data()) : r.scan.data());
    const int64_t first = cpu->first_non_finite(TensorView(scanned, r.bf16 ? DType::BF16 : DType::F32, Shape{sizes[t]}));
    EXPECT_EQ(flags[t], first < 0 ? ~0ull : static_cast<unsigned long long>(first)) << what << " non-finite scan";
  }
  EXPECT_EQ(flags[3], static_cast<unsigned long long>(4096 / 2)) << "the control: the scan found the planted inf";
}

// The pack kernel over random tables, against pack_reference: every conversion, runs of many rows
// and of none, strides wider than a row, and items at every byte offset (a bf16 item of odd length
// puts the next fp32 item 2 bytes off; a message may start anywhere), so each of the kernel's
// aligned, 16-bit and byte paths runs.
TEST(CudaKernelsOnHost, PackKernelMatchesTheReference) {
  std::mt19937 rng(11);
  const PackConv convs[] = {PackConv::Copy32, PackConv::F32ToBF16, PackConv::BF16ToF32, PackConv::FillNegZero32,
                            PackConv::FillNegZeroBF16};
  for (int trial = 0; trial < 40; ++trial) {
    constexpr size_t kBytes = 1 << 15;
    std::vector<std::byte> src(kBytes), want(kBytes), got(kBytes);
    for (size_t i = 0; i + 4 <= kBytes; i += 4) {
      const float f = std::uniform_real_distribution<float>(-8, 8)(rng);
      std::memcpy(&src[i], &f, 4);
    }
    std::vector<PackRun> runs;
    std::vector<int64_t> prefix{0};
    int64_t dst_at = static_cast<int64_t>(rng() % 7);
    for (int r = 0; r < 1 + static_cast<int>(rng() % 10); ++r) {
      PackRun run;
      run.src = 0, run.dst = 1, run.conv = convs[rng() % 5];
      run.len = static_cast<int64_t>(rng() % 30), run.rows = 1 + static_cast<int64_t>(rng() % 5);
      run.src_stride = run.len * 4 + static_cast<int64_t>(rng() % 9);
      run.dst_stride = run.len * 4 + static_cast<int64_t>(rng() % 9);
      run.src_off = static_cast<int64_t>(rng() % 4000);
      run.dst_off = dst_at;
      dst_at += run.rows * run.dst_stride + static_cast<int64_t>(rng() % 5);
      if (dst_at + 256 > static_cast<int64_t>(kBytes)) break;
      runs.push_back(run);
      if (run.len > 0) prefix.push_back(prefix.back() + run.len * run.rows);
    }
    std::byte* ref_bases[] = {src.data(), want.data()};
    pack_reference(runs, ref_bases);
    // the kernel's table, as the cuda backend builds it: the runs with elements and their prefix sums
    std::vector<PackRun> live;
    for (const PackRun& r : runs)
      if (r.len > 0 && r.rows > 0) live.push_back(r);
    std::byte* bases[] = {src.data(), got.data()};
    const int64_t total = prefix.back();
    if (total > 0) {
      const int64_t grid = std::min<int64_t>((total + kThreads - 1) / kThreads, 3);  // a grid-stride loop
      launch_serial(grid, kThreads, [&] { pack_kernel(live.data(), prefix.data(), static_cast<int>(live.size()), bases, total); });
    }
    ASSERT_EQ(std::memcmp(got.data(), want.data(), kBytes), 0) << "trial " << trial;
  }
}

}  // namespace
}  // namespace dmuon::cuda_host
