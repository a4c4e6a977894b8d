// The cuda backend's device code run on the host with CUDA's execution model
// (tests/support/cuda_on_host.h: the kernels and launchers of src/backend/cuda/device_code.cuh,
// compiled here; barrier-free kernels thread by thread, kernels with __syncthreads as one fiber per
// CUDA thread), on every CI machine (no GPU, no CUDA toolkit). Every launcher of cuda_kernels.h is
// checked: results bitwise those of the cpu kernels, or of the formula cuda_kernels.h promises where
// no cpu kernel has that form, over shapes that are not multiples of the tiles, grids smaller than
// the work, sums longer than one staging tile, empty dimensions, batches with gaps between matrices
// (which must stay untouched), and pack items at every byte offset. Built with
// -fsanitize=alignment: an access a GPU would fault on as misaligned stops the test (x86 forgives
// it). ctest runs it three times, each block's threads in ascending, descending and alternating
// order (MESHMUON_CUDA_HOST_ORDER): a missing barrier shows in one of them. Limits (cuda_on_host.h):
// threads never overlap, so no data race or warp behavior shows; NaN results carry x86's payloads (no
// update kernel's output is compared on non-finite input). Negative controls: a transposed tile read,
// a wrong binary search and a swapped half-word each failed when the kernels were written; the
// barrier runtime's own control (BarriersOrderTheThreadsOfABlock) fails without the barrier.
// Run: build/bin/cuda_kernels_host_test
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "meshmuon/bf16.h"
#include "meshmuon/update.h"
#include "backend/cpu/kernels/update_steps.h"
#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/ns_kernels.h"
#include "backend/cpu/kernels/update_args.h"
#include "../support/cuda_on_host.h"

namespace meshmuon::cuda_host {
namespace {

// A kernel launched with a grid of the test's choosing (the launchers pick their own).
#define LAUNCH(kernel, grid, block) detail::make_launch(&kernel, #kernel, dim3(grid), dim3(block))

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
        LAUNCH(normuon_row_mean_square_kernel, grid, dim3(kRowTile, kRowWarps))(u.data(), rows, cols, got.data());
      else
        LAUNCH(normuon_column_mean_square_kernel, grid, 64)(u.data(), rows, cols, got.data());
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
    LAUNCH(normuon_norm_kernel, 1, kThreads)(v_mean.data(), len, k, &norm);
    LAUNCH(normuon_ratio_kernel, 1, kThreads)(v_mean.data(), step.data(), len, k, &norm, &ratio);
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
// The promised Σ x² of a grid of `blocks`: the block partials and the total.
double fixed_tree_sum_squares(const std::vector<float>& x, int64_t n, unsigned blocks, std::vector<double>& partials) {
  std::vector<double> lane(kThreads);
  partials.assign(blocks, 0.0);
  for (unsigned b = 0; b < blocks; ++b) {
    for (int t = 0; t < kThreads; ++t) {
      double acc = 0;
      for (int64_t i = b * int64_t{kThreads} + t; i < n; i += int64_t{blocks} * kThreads)
        acc = acc + static_cast<double>(x[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)];
      lane[static_cast<size_t>(t)] = acc;
    }
    partials[b] = tree(lane);
  }
  for (int t = 0; t < kThreads; ++t) {
    double acc = 0;
    for (unsigned i = static_cast<unsigned>(t); i < blocks; i += kThreads) acc = acc + partials[i];
    lane[static_cast<size_t>(t)] = acc;
  }
  return tree(lane);
}
TEST(CudaKernelsOnHost, SumOfSquaresFollowsItsFixedTree) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{4097}, int64_t{20000}}) {
    const std::vector<float> x = normal(static_cast<size_t>(n), static_cast<unsigned>(n + 3));
    for (unsigned blocks : {1u, 3u, 9u}) {
      std::vector<double> partials(blocks, -1.0), want_partials;
      double got = -1;
      LAUNCH(sum_squares_partial_kernel, blocks, kThreads)(x.data(), n, partials.data());
      LAUNCH(sum_partials_kernel, 1, kThreads)(partials.data(), static_cast<int>(blocks), &got);
      const double want = fixed_tree_sum_squares(x, n, blocks, want_partials);
      EXPECT_EQ(std::memcmp(partials.data(), want_partials.data(), blocks * sizeof(double)), 0) << "n " << n << " blocks " << blocks;
      EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << "n " << n << " blocks " << blocks;
    }
  }
  // The launcher's grid: one block per 256 elements, capped at kSumSquaresBlocks (300000 elements
  // would want 1172 blocks).
  for (int64_t n : {int64_t{0}, int64_t{700}, int64_t{300000}}) {
    const std::vector<float> x = normal(static_cast<size_t>(n), static_cast<unsigned>(n + 5));
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>((n + 255) / 256, 1), kSumSquaresBlocks));
    std::vector<double> partials(kSumSquaresBlocks, -1.0), want_partials;
    double got = -1;
    ASSERT_EQ(sum_squares(x.data(), n, partials.data(), &got, nullptr), cudaSuccess);
    const double want = fixed_tree_sum_squares(x, n, blocks, want_partials);
    EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << "launcher, n " << n;
    EXPECT_EQ(partials[blocks - 1], want_partials[blocks - 1]) << "launcher, n " << n;
    if (blocks < kSumSquaresBlocks) EXPECT_EQ(partials[blocks], -1.0) << "launcher, n " << n << ": a partial past its grid";
  }
}

// The multi-tensor kernels (momentum with the comm rounding, apply, AdamW, the non-finite scan) on
// one table of tensors of odd sizes, both gradient dtypes and per-tensor options, their blocks laid
// out as the cuda backend lays them (multi_tensor_blocks): every tensor bitwise what the cpu backend
// gives it alone. A block that found the wrong tensor, or a stride that skipped or repeated
// elements, changes bits here.
TEST(CudaKernelsOnHost, MultiTensorKernelsAreTheCpuKernelsPerTensor) {
  auto cpu = ::meshmuon::detail::make_cpu_backend();
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
  first_non_finite_multi(nfi.data(), count, blocks, flags.data(), nullptr);
  momentum_multi(mom.data(), count, blocks, nullptr);
  apply_multi(app.data(), count, blocks, nullptr);
  adamw_multi(adw.data(), count, blocks, nullptr);
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
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 3));  // a grid-stride loop
      LAUNCH(pack_kernel, grid, kThreads)(live.data(), prefix.data(), static_cast<int>(live.size()), bases, total);
      std::vector<std::byte> by_launcher(kBytes);
      std::byte* launcher_bases[] = {src.data(), by_launcher.data()};
      pack(live.data(), prefix.data(), static_cast<int>(live.size()), launcher_bases, total, nullptr);
      ASSERT_EQ(std::memcmp(by_launcher.data(), want.data(), kBytes), 0) << "trial " << trial << " (launcher)";
    }
    ASSERT_EQ(std::memcmp(got.data(), want.data(), kBytes), 0) << "trial " << trial;
  }
}


uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
constexpr float kGap = -12345.0f;  // what lies between the matrices of a batch: must stay

// NorMuon through its launcher (mean squares per row, tiled through shared memory, or per column;
// the two ordered sums; the EMA; the scaling): the update and the state bitwise those of
// normuon_mean_square + normuon_finish, also for a tall matrix of several row tiles and column
// tiles, a single row or column, and an empty reduced dimension (the state untouched, as the cpu).
TEST(CudaKernelsOnHost, NormuonLauncherIsTheCpuKernelsBits) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{70, 33}, {33, 70}, {64, 64}, {1, 5}, {5, 1},
                                                           {1030, 40}, {45, 2000}, {40, 0}, {0, 7}};
  for (const auto& [rows, cols] : shapes) {
    const std::string what = std::to_string(rows) + "x" + std::to_string(cols);
    const int64_t len = normuon_state_size(rows, cols);
    std::vector<float> u = normal(static_cast<size_t>(rows * cols), static_cast<unsigned>(rows * 7 + cols));
    std::vector<float> v = normal(static_cast<size_t>(len), static_cast<unsigned>(rows + 3 * cols));
    for (float& x : v) x = x * x;
    std::vector<float> u_want = u, v_want = v, mean_want(static_cast<size_t>(len));
    const double beta2 = 0.95;
    if (len > 0) {
      normuon_mean_square(u_want.data(), rows, cols, mean_want.data());
      normuon_finish(u_want.data(), rows, cols, mean_want.data(), v_want.data(), beta2);
    }
    std::vector<float> mean(static_cast<size_t>(len), -1.0f), step(static_cast<size_t>(len), -1.0f);
    double norm = -1;
    float ratio = -1;
    ASSERT_EQ(normuon(u.data(), rows, cols, mean.data(), v.data(), cpu::to_scalar(1.0 - beta2), {step.data(), &norm, &ratio},
                      nullptr),
              cudaSuccess);
    expect_bitwise(u, u_want, (what + " update").c_str());
    expect_bitwise(v, v_want, (what + " state").c_str());
    if (len > 0) expect_bitwise(mean, mean_want, (what + " mean squares").c_str());
  }
}

// MuonEq through its launcher (row sums tiled through shared memory in the cpu's 8-lane order, the
// rows added in order, the scaling): bitwise cpu::muon_eq_rows, for widths below, at and past a
// multiple of 8 and of the 32-column tile, several row tiles, a single row or column, a zero row (its
// norm clamped) and an all-zero matrix (zeros), out of place and in place. Negative control: the
// same sums in one sequential pass per row (the order a naive kernel would use) differ somewhere.
TEST(CudaKernelsOnHost, MuonEqLauncherIsTheCpuKernelsBits) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{70, 33}, {33, 70}, {64, 64}, {1, 5}, {5, 1},
                                                           {1030, 40}, {45, 2000}, {3, 8}, {7, 39}};
  bool order_shows = false;
  for (const auto& [rows, cols] : shapes)
    for (const int variant : {0, 1, 2}) {  // 0: Gaussian, 1: row 0 zero, 2: all zero
      const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " variant " + std::to_string(variant);
      std::vector<float> x = normal(static_cast<size_t>(rows * cols), static_cast<unsigned>(rows * 5 + cols + variant));
      for (int64_t j = 0; j < cols; ++j) x[static_cast<size_t>(j)] *= variant == 0 ? 1000.0f : 0.0f;
      if (variant == 2) std::fill(x.begin(), x.end(), 0.0f);
      std::vector<float> want(x.size());
      std::vector<double> scratch;
      cpu::muon_eq_rows(x.data(), want.data(), rows, cols, scratch);
      std::vector<double> row_sq(static_cast<size_t>(rows), -1.0);
      double target = -1;
      std::vector<float> got(x.size(), -1.0f);
      ASSERT_EQ(muon_eq(x.data(), got.data(), rows, cols, row_sq.data(), &target, cpu::kMuonEqMinRowNorm, nullptr), cudaSuccess);
      expect_bitwise(got, want, (what + " out of place").c_str());
      std::vector<float> in_place = x;
      ASSERT_EQ(muon_eq(in_place.data(), in_place.data(), rows, cols, row_sq.data(), &target, cpu::kMuonEqMinRowNorm, nullptr),
                cudaSuccess);
      expect_bitwise(in_place, want, (what + " in place").c_str());
      for (int64_t r = 0; r < rows && variant == 0; ++r) {
        double sequential = 0;
        for (int64_t j = 0; j < cols; ++j) sequential += double(x[r * cols + j]) * x[r * cols + j];
        order_shows |= sequential != row_sq[static_cast<size_t>(r)];
      }
    }
  EXPECT_TRUE(order_shows) << "no row sum differs from a sequential one: the order check above proves nothing";
}

// Muon+ through its launcher: Σ x² by sum_squares's fixed tree, then x · fp32(sqrt(min(m, n)) /
// max(sqrt(Σ), 1e-6)); within an ulp or two of cpu::muon_plus (whose Σ runs in another order); an
// all-zero matrix stays zero; a matrix with an empty side is untouched.
TEST(CudaKernelsOnHost, MuonPlusIsItsFormula) {
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{70, 33}, {33, 700}, {1, 5}, {300, 300}}) {
    const std::string what = std::to_string(rows) + "x" + std::to_string(cols);
    const std::vector<float> x = normal(static_cast<size_t>(rows * cols), static_cast<unsigned>(rows + 11 * cols));
    std::vector<double> partials(kSumSquaresBlocks, -1.0);
    double norm2 = -1;
    ASSERT_EQ(sum_squares(x.data(), rows * cols, partials.data(), &norm2, nullptr), cudaSuccess);
    const double norm = std::max(std::sqrt(norm2), cpu::kMuonPlusMinNorm);
    const float s = static_cast<float>(std::sqrt(static_cast<double>(std::min(rows, cols))) / norm);
    std::vector<float> want(x.size()), cpu_x = x, got = x;
    for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] * s;
    ASSERT_EQ(muon_plus(got.data(), rows, cols, partials.data(), &norm2, cpu::kMuonPlusMinNorm, nullptr), cudaSuccess);
    expect_bitwise(got, want, (what + " formula").c_str());
    cpu::muon_plus(cpu_x.data(), rows, cols);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got[i], cpu_x[i], 4e-7 * std::fabs(cpu_x[i])) << what << " vs cpu at " << i;
  }
  std::vector<float> zeros(40, 0.0f);
  std::vector<double> partials(kSumSquaresBlocks);
  double norm2 = -1;
  ASSERT_EQ(muon_plus(zeros.data(), 5, 8, partials.data(), &norm2, cpu::kMuonPlusMinNorm, nullptr), cudaSuccess);
  for (float v : zeros) ASSERT_EQ(v, 0.0f) << "an all-zero matrix must stay zero";
  norm2 = -1;
  ASSERT_EQ(muon_plus(zeros.data(), 0, 8, partials.data(), &norm2, cpu::kMuonPlusMinNorm, nullptr), cudaSuccess);
  EXPECT_EQ(norm2, -1) << "an empty matrix launches nothing";
}

// X₀'s normalization from the device's Σ x²: in · fp32(1 / denom), denom = sqrt(Σ)·scale + eps or
// max(sqrt(Σ)·scale, eps); +0 everywhere for a zero norm or denominator.
TEST(CudaKernelsOnHost, NormalizeIsTheOrthogonalizersFormula) {
  const std::vector<float> x = normal(1500, 3);
  for (const bool add : {true, false})
    for (const double norm2 : {0.0, 1e-30, 2.5, 1234.5}) {
      const double scale = 1.01, eps = 1e-7;
      std::vector<float> got(x.size(), -1.0f), want(x.size());
      const double norm = std::sqrt(norm2), scaled = norm * scale;
      const double denom = add ? scaled + eps : std::max(scaled, eps);
      const float inv = norm == 0 || denom == 0 ? 0.0f : static_cast<float>(1.0 / denom);
      for (size_t i = 0; i < x.size(); ++i) want[i] = inv == 0.0f ? 0.0f : x[i] * inv;
      ASSERT_EQ(normalize(x.data(), got.data(), static_cast<int64_t>(x.size()), &norm2, scale, eps, add, nullptr), cudaSuccess);
      expect_bitwise(got, want, ("norm² " + std::to_string(norm2) + (add ? " add" : " max")).c_str());
    }
  std::vector<float> scaled(x.size(), -1.0f), want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] * 0.375f;
  ASSERT_EQ(scale(x.data(), scaled.data(), static_cast<int64_t>(x.size()), 0.375f, nullptr), cudaSuccess);
  expect_bitwise(scaled, want, "scale");
}

// The Gram polynomial and the mirror over batches whose matrices lie `stride` apart with gaps
// between them: z = b·g + c·g2 (+ a on the diagonal), the upper triangle copied from the lower one,
// and the gaps untouched.
TEST(CudaKernelsOnHost, PolynomialAndMirrorKeepEachMatrixOfABatch) {
  for (const int64_t side : {int64_t{1}, int64_t{5}, int64_t{70}}) {
    const int64_t ss = side * side, stride = ss + 13, batch = 3, total = (batch - 1) * stride + ss + 13;
    std::vector<float> g = normal(static_cast<size_t>(total), 1), g2 = normal(static_cast<size_t>(total), 2);
    std::vector<float> z(static_cast<size_t>(total), kGap), want = z;
    const float a = 3.4445f, b = -4.775f, c = 2.0315f;
    for (int64_t e = 0; e < batch; ++e)
      for (int64_t r = 0; r < ss; ++r) {
        const size_t i = static_cast<size_t>(e * stride + r);
        const float bg = b * g[i], cg = c * g2[i];
        float v = bg + cg;
        if (r / side == r % side) v = v + a;
        want[i] = v;
      }
    ASSERT_EQ(ns_polynomial(g.data(), g2.data(), z.data(), side, stride, batch, a, b, c, nullptr), cudaSuccess);
    expect_bitwise(z, want, ("polynomial, side " + std::to_string(side)).c_str());

    std::vector<float> m = normal(static_cast<size_t>(total), 4);
    for (int64_t e = 0; e < batch; ++e)
      for (int64_t k = 0; k < 13; ++k) m[static_cast<size_t>(e * stride + ss + k)] = kGap;
    std::vector<float> mirrored = m;
    for (int64_t e = 0; e < batch; ++e)
      for (int64_t i = 0; i < side; ++i)
        for (int64_t j = i + 1; j < side; ++j)
          mirrored[static_cast<size_t>(e * stride + i * side + j)] = mirrored[static_cast<size_t>(e * stride + j * side + i)];
    ASSERT_EQ(mirror_lower(m.data(), side, stride, batch, nullptr), cudaSuccess);
    expect_bitwise(m, mirrored, ("mirror, side " + std::to_string(side)).c_str());
  }
}

// The bf16 conversions are meshmuon/bf16.h's: ties to even, NaN to 0x7FC0, infinities and signed zeros
// kept, overflow to infinity, subnormals.
TEST(CudaKernelsOnHost, Bf16ConversionsAreMeshmuonsBf16) {
  std::vector<float> x = normal(3000, 9);
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u, 0x7F800001u,
                              0x3F808000u, 0x3F818000u, 0x3F80FFFFu, 0x7F7FFFFFu, 0x00000001u, 0x807FFFFFu, 0x00408000u};
  for (const uint32_t u : special) x.push_back(std::bit_cast<float>(u));
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> got(x.size(), 0xDEAD);
  ASSERT_EQ(to_bf16(x.data(), got.data(), n, nullptr), cudaSuccess);
  std::vector<float> back(x.size(), -1.0f), rounded = x;
  ASSERT_EQ(from_bf16(got.data(), back.data(), n, nullptr), cudaSuccess);
  ASSERT_EQ(round_bf16(rounded.data(), n, nullptr), cudaSuccess);
  for (size_t i = 0; i < x.size(); ++i) {
    const BFloat16 want = float_to_bf16(x[i]);
    ASSERT_EQ(got[i], want.bits) << "element " << i << " bits " << std::hex << bits(x[i]);
    ASSERT_EQ(bits(back[i]), bits(bf16_to_float(want))) << "element " << i;
    ASSERT_EQ(bits(rounded[i]), bits(bf16_to_float(want))) << "element " << i;
  }
}

// QK-clip's row scaling: rows whose factor is exactly 1 keep their bits, the others are scaled.
TEST(CudaKernelsOnHost, ScaleRowsTouchesOnlyClippedRows) {
  const int64_t rows = 7, cols = 301;
  std::vector<float> w = normal(static_cast<size_t>(rows * cols), 5), want = w;
  const std::vector<float> factors = {1.0f, 0.5f, 1.0f, 0.123f, 1.0f, 0.999f, 1.0f};
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float f = factors[static_cast<size_t>(i / cols)];
    if (f != 1.0f) want[static_cast<size_t>(i)] = want[static_cast<size_t>(i)] * f;
  }
  w[5] = std::numeric_limits<float>::quiet_NaN();  // row 0: factor 1, must stay this NaN's bits
  want[5] = w[5];
  ASSERT_EQ(scale_rows(w.data(), factors.data(), rows, cols, nullptr), cudaSuccess);
  expect_bitwise(w, want, "scale_rows");
}

// FSDP's ordered sum and the mean's division: the cpu backend's bits, fp32 and bf16 blocks.
TEST(CudaKernelsOnHost, OrderedSumAndDivideAreTheCpuBackends) {
  auto cpu = ::meshmuon::detail::make_cpu_backend();
  const int64_t n = 2049;
  for (const bool bf16 : {false, true})
    for (const int blocks_n : {1, 2, 5}) {
      const std::vector<float> f = normal(static_cast<size_t>(n * blocks_n), static_cast<unsigned>(blocks_n));
      std::vector<BFloat16> b(f.size());
      for (size_t i = 0; i < f.size(); ++i) b[i] = float_to_bf16(f[i]);
      const void* blocks = bf16 ? static_cast<const void*>(b.data()) : f.data();
      std::vector<float> got(static_cast<size_t>(n), -1.0f), want(static_cast<size_t>(n));
      ASSERT_EQ(ordered_sum(blocks, bf16, n, blocks_n, got.data(), nullptr), cudaSuccess);
      cpu->ordered_sum(blocks, bf16 ? DType::BF16 : DType::F32, n, blocks_n, want.data());
      const std::string what = std::string(bf16 ? "bf16" : "fp32") + " blocks " + std::to_string(blocks_n);
      expect_bitwise(got, want, (what + " sum").c_str());
      ASSERT_EQ(divide(got.data(), n, 3.0f, nullptr), cudaSuccess);
      cpu->divide(want.data(), n, 3.0f);
      expect_bitwise(got, want, (what + " divided").c_str());
    }
}

// The batched GEMM probe's operands: a function of i mod period, both signs, exponents 2⁻¹²..2¹²
// (all 25 of them used), 7-bit mantissas; its comparison finds one flipped bit in any matrix of a
// batch and ignores the gaps between them.
TEST(CudaKernelsOnHost, ProbeOperandsAndComparison) {
  const int64_t n = 6000, period = 1000;
  std::vector<uint16_t> x(static_cast<size_t>(n), 0);
  ASSERT_EQ(probe_fill(x.data(), n, period, nullptr), cudaSuccess);
  std::vector<int> exponents(256, 0);
  int negative = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = x[static_cast<size_t>(i)];
    ASSERT_EQ(v, x[static_cast<size_t>(i % period)]) << "element " << i;
    const int e = (v >> 7) & 0xFF;
    ASSERT_GE(e, 115) << "element " << i;
    ASSERT_LE(e, 139) << "element " << i;
    ++exponents[static_cast<size_t>(e)];
    negative += v >> 15;
  }
  for (int e = 115; e <= 139; ++e) EXPECT_GT(exponents[static_cast<size_t>(e)], 0) << "exponent " << e;
  EXPECT_GT(negative, n / 4);
  EXPECT_LT(negative, 3 * n / 4);

  const int64_t len = 777, stride = len + 9, batch = 3;
  const std::vector<float> ref = normal(static_cast<size_t>(len), 8);
  std::vector<float> d(static_cast<size_t>(batch * stride), kGap);
  for (int64_t e = 0; e < batch; ++e) std::copy(ref.begin(), ref.end(), d.begin() + e * stride);
  unsigned flag = 0;
  ASSERT_EQ(any_mismatch(d.data(), stride, batch, ref.data(), len, &flag, nullptr), cudaSuccess);
  EXPECT_EQ(flag, 0u) << "equal copies, gaps ignored";
  d[static_cast<size_t>(2 * stride + len - 1)] = std::bit_cast<float>(bits(ref[len - 1]) ^ 1u);
  ASSERT_EQ(any_mismatch(d.data(), stride, batch, ref.data(), len, &flag, nullptr), cudaSuccess);
  EXPECT_EQ(flag, 1u) << "one bit of the last matrix's last element";
}

// The Gram path's trace (in index order, double) and scaled add (y + fp32(b·x)).
TEST(CudaKernelsOnHost, TraceAndScaledAdd) {
  const int64_t side = 37;
  const std::vector<float> a = normal(static_cast<size_t>(side * side), 6);
  double want = 0, got = -1;
  for (int64_t i = 0; i < side; ++i) want = want + static_cast<double>(a[static_cast<size_t>(i * side + i)]);
  ASSERT_EQ(trace(a.data(), side, &got, nullptr), cudaSuccess);
  EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0);
  std::vector<float> y = normal(5000, 7), y_want = y;
  const std::vector<float> x = normal(5000, 8);
  for (size_t i = 0; i < y.size(); ++i) {
    const float bx = -0.7f * x[i];
    y_want[i] = y_want[i] + bx;
  }
  ASSERT_EQ(add_scaled(y.data(), x.data(), static_cast<int64_t>(y.size()), -0.7f, nullptr), cudaSuccess);
  expect_bitwise(y, y_want, "add_scaled");
}

// The host runtime itself: a block's threads exchange values through shared memory across a
// barrier, so thread t reads what thread t + 1 wrote. Its negative control: the same kernel without
// the barrier reads the value from before (this block's threads run one after another).
void neighbours_kernel(int* out, bool barrier) {
  static thread_local int shared[64];
  const unsigned t = threadIdx.x;
  shared[t] = static_cast<int>(blockIdx.x * 1000 + t);
  if (barrier) __syncthreads();
  out[blockIdx.x * 64 + t] = shared[(t + 1) % 64];
}
TEST(CudaKernelsOnHost, BarriersOrderTheThreadsOfABlock) {
  for (const bool barrier : {true, false}) {
    std::vector<int> out(3 * 64, -1);
    detail::run_blocks(dim3(3), dim3(64), "neighbours_kernel", [&] { neighbours_kernel(out.data(), barrier); }, true);
    int wrong = 0;
    for (unsigned b = 0; b < 3; ++b)
      for (unsigned t = 0; t < 64; ++t) wrong += out[b * 64 + t] != static_cast<int>(b * 1000 + (t + 1) % 64);
    if (barrier) EXPECT_EQ(wrong, 0);
    else EXPECT_GT(wrong, 0) << "the negative control: without the barrier a thread reads before its neighbour wrote";
  }
}
// A block that restages a shared tile each iteration while thread 0 sums the last one (the shape of
// NorMuon's ordered sums): correct in every order with the barrier that ends each iteration; without
// it a GPU races, and here the threads that restage before thread 0 sums (descending, alternating)
// give another sum, so the host test's three orders find a missing barrier that ascending order
// alone would hide (a review's finding: NorMuon's two sums lost their last barrier unnoticed).
void staged_sum_kernel(const int* x, int n, long long* out, bool end_barrier) {
  static thread_local int tile[64];
  long long sum = 0;
  for (int base = 0; base < n; base += 64) {
    tile[threadIdx.x] = base + static_cast<int>(threadIdx.x) < n ? x[base + threadIdx.x] : 0;
    __syncthreads();
    if (threadIdx.x == 0)
      for (int t = 0; t < 64; ++t) sum += tile[t];
    if (end_barrier) __syncthreads();
  }
  if (end_barrier) __syncthreads();  // (the same barrier count in both forms: one per iteration + 1)
  else {
    __syncthreads();
    for (int base = 0; base < n; base += 64) __syncthreads();
  }
  if (threadIdx.x == 0) *out = sum;
}
TEST(CudaKernelsOnHost, EveryThreadOrderFindsAMissingBarrier) {
  std::vector<int> x(300);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int>(i * i % 97);
  long long want = 0;
  for (int v : x) want += v;
  const detail::Order saved = detail::order();
  for (const bool end_barrier : {true, false}) {
    int wrong_orders = 0;
    for (const detail::Order o : {detail::Order::Ascending, detail::Order::Descending, detail::Order::Alternating}) {
      detail::set_order(o);
      long long got = -1;
      detail::run_blocks(dim3(1), dim3(64), "staged_sum_kernel",
                         [&] { staged_sum_kernel(x.data(), static_cast<int>(x.size()), &got, end_barrier); }, true);
      wrong_orders += got != want;
      if (end_barrier) EXPECT_EQ(got, want) << "order " << static_cast<int>(o);
    }
    if (!end_barrier) EXPECT_EQ(wrong_orders, 2) << "the control: descending and alternating see the race";
  }
  detail::set_order(saved);
}

// A grid-stride loop covers work beyond its grid (8192 blocks of 256 threads: 2,097,152 elements).
TEST(CudaKernelsOnHost, GridStrideLoopsCoverWorkBeyondTheGrid) {
  const int64_t n = int64_t{8192} * 256 + 1001;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>(3 * (i % 1000));
  ASSERT_EQ(divide(x.data(), n, 3.0f, nullptr), cudaSuccess);
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += x[static_cast<size_t>(i)] != static_cast<float>(i % 1000);
  EXPECT_EQ(wrong, 0);
}

TEST(CudaKernelsOnHostDeathTest, ThreadsThatReachDifferentBarrierCountsStop) {
  EXPECT_DEATH(detail::run_blocks(dim3(1), dim3(64), "uneven",
                                  [] {
                                    if (threadIdx.x == 5) __syncthreads();
                                  },
                                  true),
               "different numbers of __syncthreads");
}

TEST(CudaKernelsOnHostDeathTest, AnUnlistedKernelThatWaitsAtABarrierStops) {
  std::vector<int> out(64);
  EXPECT_DEATH(detail::run_blocks(dim3(1), dim3(64), "neighbours_kernel", [&] { neighbours_kernel(out.data(), true); }, false),
               "__syncthreads in a kernel not listed");
}

}  // namespace
}  // namespace meshmuon::cuda_host
