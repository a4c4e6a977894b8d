// The emulated GPU's kernels (tests/cuda_emu, README.md there): the launchers of
// src/backend/cuda/cuda_kernels.h run the cuda backend's own device code (device_code.cuh, compiled
// for the host by tests/support/cuda_on_host.h with -ffp-contract=off): the same kernels, grids and
// launch order as cuda_kernels.cu, not a twin of them. Each launcher first checks that every range
// it will touch is inside one live device allocation and aligned (a host pointer, an overrun or a
// misaligned access is cudaErrorIllegalAddress, as on a GPU), then queues the launch on its stream
// (streams.h): it runs when the host synchronizes, inside a device scope. Tables the kernels read
// from device memory (multi-tensor items, pack runs) are checked when the op runs, as the kernels
// read them then.
#include "backend/cuda/cuda_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "device_memory.h"
#include "streams.h"
#include "../support/cuda_on_host.h"

namespace meshmuon::cuda {
namespace {

using cuda_emu::DeviceScope;
using cuda_emu::expect_device;
using cuda_emu::submit;

size_t f32(int64_t n) { return static_cast<size_t>(n) * 4; }
size_t grad_bytes(int64_t n, bool bf16) { return static_cast<size_t>(n) * (bf16 ? 2 : 4); }

// A range a launch touches: `bytes` at p, accessed in units of `align` bytes.
struct Range {
  const void* p;
  size_t bytes;
  size_t align = 4;
};

bool aligned(const void* p, size_t align, const char* kernel) {
  if (reinterpret_cast<uintptr_t>(p) % align == 0) return true;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s: %zu-byte access at %p is misaligned (cudaErrorMisalignedAddress on a GPU)", kernel,
                align, p);
  return cuda_emu::fail_access(buf);
}

// Every range a launch touches, checked before it runs: inside one allocation, and aligned.
bool ranges(std::initializer_list<Range> rs, const char* kernel) {
  for (const Range& r : rs)
    if (!expect_device(r.p, r.bytes, kernel) || (r.bytes > 0 && !aligned(r.p, r.align, kernel))) return false;
  return true;
}

cudaError_t illegal() { return cudaErrorIllegalAddress; }
// As cuda_kernels.cu's launchers: the runtime's last error (cleared), cudaSuccess when none.
cudaError_t done() { return cudaGetLastError(); }

}  // namespace

// The tensors of one multi-tensor launch must not overlap (backend.h: a GPU runs them at once, and
// one item's writes would race another's reads or writes; the emulation's items run one after
// another and would hide it). `spans` per item: the byte ranges it reads or writes; `writes` says
// which of them it writes. Two ranges of different items may overlap only if neither is written.
struct Span {
  const void* p;
  size_t bytes;
  bool written;
  int item;
};
bool items_disjoint(std::vector<Span> spans, const char* kernel) {
  std::erase_if(spans, [](const Span& s) { return s.bytes == 0; });
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.p < b.p; });
  for (size_t i = 0; i < spans.size(); ++i) {
    const auto* end = static_cast<const std::byte*>(spans[i].p) + spans[i].bytes;
    for (size_t j = i + 1; j < spans.size() && static_cast<const std::byte*>(spans[j].p) < end; ++j)
      if (spans[i].item != spans[j].item && (spans[i].written || spans[j].written))
        return cuda_emu::fail_access(std::string(kernel) + ": tensors " + std::to_string(spans[i].item) + " and " +
                                     std::to_string(spans[j].item) + " of one launch overlap");
  }
  return true;
}

// A multi-tensor table's block layout, as the kernels' binary search assumes: item blocks start at
// 0, rise by multi_tensor_blocks(n) (n > 0) and end at the grid's `blocks`.
template <class Item>
bool table_layout_ok(const Item* items, int count, int64_t blocks, const char* kernel) {
  int64_t next = 0;
  for (int t = 0; t < count; ++t) {
    if (items[t].block0 != next || items[t].n <= 0)
      return cuda_emu::fail_access(std::string(kernel) + ": the table's blocks do not follow its sizes");
    next += multi_tensor_blocks(items[t].n);
  }
  return next == blocks || cuda_emu::fail_access(std::string(kernel) + ": the grid is not the table's blocks");
}

namespace {
std::mutex fault_mu;
std::string fault_next;  // the launcher whose next launch faults (fault_next_launch_of)

bool injected_fault(const char* kernel) {
  std::lock_guard<std::mutex> lock(fault_mu);
  if (fault_next.empty() || fault_next != kernel) return false;
  fault_next.clear();
  return true;
}

// Queues the real launcher `run` (a call of cuda_host's launcher) on the stream: it runs inside a
// device scope; `check` (run first, there) checks what the kernels will read from device memory.
template <class Check, class Run>
void queue(cudaStream_t stream, const char* kernel, Check check, Run run) {
  const bool fault = injected_fault(kernel);
  submit(stream, [=] {
    if (fault) return cuda_emu::fail_access(std::string(kernel) + ": an injected fault (fault_next_launch_of)");
    DeviceScope scope;
    return check() && run() == cuda_host::cudaSuccess;
  });
}
template <class Run>
void queue(cudaStream_t stream, const char* kernel, Run run) {
  queue(stream, kernel, [] { return true; }, run);
}
}  // namespace

cudaError_t first_non_finite_multi(const NonFiniteItem* items, int count, int64_t blocks, unsigned long long* flags,
                                   cudaStream_t stream) {
  if (count <= 0 || blocks <= 0) return done();
  if (!ranges({{items, sizeof(NonFiniteItem) * static_cast<size_t>(count), 8}}, "first_non_finite_multi")) return illegal();
  queue(
      stream, "first_non_finite_multi",
      [=] {
        if (!table_layout_ok(items, count, blocks, "first_non_finite_multi")) return false;
        for (int t = 0; t < count; ++t) {
          const NonFiniteItem& it = items[t];
          const bool bf16 = it.bf16 != 0;
          if (!ranges({{it.g, grad_bytes(it.n, bf16), bf16 ? 2u : 4u}, {flags + it.flag, 8, 8}}, "first_non_finite_multi"))
            return false;
        }
        return true;
      },
      [=] { return cuda_host::first_non_finite_multi(items, count, blocks, flags, stream); });
  return done();
}

cudaError_t momentum_multi(const MomentumItem* items, int count, int64_t blocks, cudaStream_t stream) {
  if (count <= 0 || blocks <= 0) return done();
  if (!ranges({{items, sizeof(MomentumItem) * static_cast<size_t>(count), 8}}, "momentum_multi")) return illegal();
  queue(
      stream, "momentum_multi",
      [=] {
        if (!table_layout_ok(items, count, blocks, "momentum_multi")) return false;
        std::vector<Span> spans;
        for (int t = 0; t < count; ++t) {
          const MomentumItem& it = items[t];
          const bool bf16 = it.grad_bf16 != 0;
          if (!ranges({{it.buf, f32(it.n)}, {it.grad, grad_bytes(it.n, bf16), bf16 ? 2u : 4u}, {it.update, f32(it.n)}},
                      "momentum_multi"))
            return false;
          spans.push_back({it.buf, f32(it.n), true, t}), spans.push_back({it.update, f32(it.n), true, t});
          spans.push_back({it.grad, grad_bytes(it.n, bf16), false, t});
        }
        return items_disjoint(std::move(spans), "momentum_multi");
      },
      [=] { return cuda_host::momentum_multi(items, count, blocks, stream); });
  return done();
}

cudaError_t apply_multi(const ApplyItem* items, int count, int64_t blocks, cudaStream_t stream) {
  if (count <= 0 || blocks <= 0) return done();
  if (!ranges({{items, sizeof(ApplyItem) * static_cast<size_t>(count), 8}}, "apply_multi")) return illegal();
  queue(
      stream, "apply_multi",
      [=] {
        if (!table_layout_ok(items, count, blocks, "apply_multi")) return false;
        std::vector<Span> spans;
        for (int t = 0; t < count; ++t) {
          if (!ranges({{items[t].p, f32(items[t].n)}, {items[t].u, f32(items[t].n)}}, "apply_multi")) return false;
          spans.push_back({items[t].p, f32(items[t].n), true, t}), spans.push_back({items[t].u, f32(items[t].n), false, t});
        }
        return items_disjoint(std::move(spans), "apply_multi");
      },
      [=] { return cuda_host::apply_multi(items, count, blocks, stream); });
  return done();
}

cudaError_t adamw_multi(const AdamWItem* items, int count, int64_t blocks, cudaStream_t stream) {
  if (count <= 0 || blocks <= 0) return done();
  if (!ranges({{items, sizeof(AdamWItem) * static_cast<size_t>(count), 8}}, "adamw_multi")) return illegal();
  queue(
      stream, "adamw_multi",
      [=] {
        if (!table_layout_ok(items, count, blocks, "adamw_multi")) return false;
        std::vector<Span> spans;
        for (int t = 0; t < count; ++t) {
          const AdamWItem& it = items[t];
          if (!ranges({{it.p, f32(it.n)}, {it.grad, grad_bytes(it.n, it.grad_bf16 != 0), it.grad_bf16 ? 2u : 4u},
                       {it.m, f32(it.n)}, {it.v, f32(it.n)}},
                      "adamw_multi"))
            return false;
          for (const void* w : {static_cast<const void*>(it.p), static_cast<const void*>(it.m), static_cast<const void*>(it.v)})
            spans.push_back({w, f32(it.n), true, t});
          spans.push_back({it.grad, grad_bytes(it.n, it.grad_bf16 != 0), false, t});
        }
        return items_disjoint(std::move(spans), "adamw_multi");
      },
      [=] { return cuda_host::adamw_multi(items, count, blocks, stream); });
  return done();
}

cudaError_t scale_rows(float* w, const float* factors, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols <= 0) return done();
  if (!ranges({{w, f32(rows * cols)}, {factors, f32(rows)}}, "scale_rows")) return illegal();
  queue(stream, "scale_rows", [=] { return cuda_host::scale_rows(w, factors, rows, cols, stream); });
  return done();
}

cudaError_t round_bf16(float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{x, f32(n)}}, "round_bf16")) return illegal();
  queue(stream, "round_bf16", [=] { return cuda_host::round_bf16(x, n, stream); });
  return done();
}

cudaError_t pack(const PackRun* runs, const int64_t* prefix, int nruns, std::byte* const* bases, int64_t total,
                 cudaStream_t stream) {
  if (total <= 0 || nruns <= 0) return done();
  if (!ranges({{runs, sizeof(PackRun) * static_cast<size_t>(nruns), 8},
               {prefix, sizeof(int64_t) * static_cast<size_t>(nruns + 1), 8}},
              "pack (table)"))
    return illegal();
  queue(
      stream, "pack",
      [=] {
        // The table is device memory: read inside the scope, each run's ranges checked.
        if (prefix[0] != 0 || prefix[nruns] != total) return cuda_emu::fail_access("pack: the prefix sums miss the total");
        for (int r = 0; r < nruns; ++r) {
          const PackRun& run = runs[r];
          if (run.len <= 0 || run.rows <= 0 || prefix[r + 1] - prefix[r] != run.len * run.rows)
            return cuda_emu::fail_access("pack: a run without elements, or prefix sums that miss its size");
          if (!expect_device(bases + run.dst, sizeof(std::byte*), "pack (bases)")) return false;
          const size_t dst_elem = run.conv == PackConv::F32ToBF16 || run.conv == PackConv::FillNegZeroBF16 ? 2 : 4;
          const size_t src_elem = run.conv == PackConv::BF16ToF32 ? 2 : 4;
          const bool reads =
              run.conv == PackConv::Copy32 || run.conv == PackConv::F32ToBF16 || run.conv == PackConv::BF16ToF32;
          const std::byte* d = bases[run.dst] + run.dst_off;
          const size_t dst_span =
              static_cast<size_t>((run.rows - 1) * run.dst_stride) + static_cast<size_t>(run.len) * dst_elem;
          if (!expect_device(d, dst_span, "pack (destination run)")) return false;
          // (any alignment: the kernel moves misaligned items in 16- or 8-bit pieces; it reads the
          // source's base for every run, fills included)
          if (!expect_device(bases + run.src, sizeof(std::byte*), "pack (bases)")) return false;
          if (reads) {
            const std::byte* src = bases[run.src] + run.src_off;
            const size_t src_span =
                static_cast<size_t>((run.rows - 1) * run.src_stride) + static_cast<size_t>(run.len) * src_elem;
            if (!expect_device(src, src_span, "pack (source run)")) return false;
          }
        }
        return true;
      },
      [=] { return cuda_host::pack(runs, prefix, nruns, bases, total, stream); });
  return done();
}

cudaError_t sum_squares(const float* x, int64_t n, double* partials, double* out, cudaStream_t stream) {
  const int64_t blocks = std::min<int64_t>(cuda_host::blocks_for(n), kSumSquaresBlocks);
  if (!ranges({{x, f32(n)}, {partials, sizeof(double) * static_cast<size_t>(blocks), 8}, {out, sizeof(double), 8}},
              "sum_squares"))
    return illegal();
  queue(stream, "sum_squares", [=] { return cuda_host::sum_squares(x, n, partials, out, stream); });
  return done();
}

cudaError_t normalize(const float* in, float* out, int64_t n, const double* norm2, double scale, double eps, bool add,
                      cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{in, f32(n)}, {out, f32(n)}, {norm2, sizeof(double), 8}}, "normalize")) return illegal();
  queue(stream, "normalize", [=] { return cuda_host::normalize(in, out, n, norm2, scale, eps, add, stream); });
  return done();
}

cudaError_t normuon(float* u, int64_t rows, int64_t cols, float* v_mean, float* v, float w, NormuonScratch sc,
                    cudaStream_t stream) {
  const int64_t len = rows >= cols ? rows : cols;
  if (len <= 0) return done();
  if (!ranges({{u, f32(rows * cols)}, {v_mean, f32(len)}, {v, f32(len)}, {sc.step, f32(len)},
               {sc.norm, sizeof(double), 8}, {sc.ratio, sizeof(float)}},
              "normuon"))
    return illegal();
  queue(stream, "normuon", [=] { return cuda_host::normuon(u, rows, cols, v_mean, v, w, sc, stream); });
  return done();
}

cudaError_t muon_eq(const float* in, float* out, int64_t rows, int64_t cols, double* row_sq, double* target,
                    double min_row_norm, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return done();
  if (!ranges({{in, f32(rows * cols)}, {out, f32(rows * cols)}, {row_sq, sizeof(double) * static_cast<size_t>(rows), 8},
               {target, sizeof(double), 8}},
              "muon_eq"))
    return illegal();
  queue(stream, "muon_eq",
        [=] { return cuda_host::muon_eq(in, out, rows, cols, row_sq, target, min_row_norm, stream); });
  return done();
}

cudaError_t muon_plus(float* x, int64_t rows, int64_t cols, double* partials, double* norm2, double min_norm,
                      cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return done();
  const int64_t blocks = std::min<int64_t>(cuda_host::blocks_for(n), kSumSquaresBlocks);
  if (!ranges({{x, f32(n)}, {partials, sizeof(double) * static_cast<size_t>(blocks), 8}, {norm2, sizeof(double), 8}},
              "muon_plus"))
    return illegal();
  queue(stream, "muon_plus", [=] { return cuda_host::muon_plus(x, rows, cols, partials, norm2, min_norm, stream); });
  return done();
}

cudaError_t scale(const float* in, float* out, int64_t n, float inv, cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{in, f32(n)}, {out, f32(n)}}, "scale")) return illegal();
  queue(stream, "scale", [=] { return cuda_host::scale(in, out, n, inv, stream); });
  return done();
}

cudaError_t ns_polynomial(const float* g, const float* g2, float* z, int64_t side, int64_t stride, int64_t batch,
                          float a, float b, float c, cudaStream_t stream) {
  if (side <= 0 || batch <= 0) return done();
  const int64_t span = (batch - 1) * stride + side * side;
  if (!ranges({{g, f32(span)}, {g2, f32(span)}, {z, f32(span)}}, "ns_polynomial")) return illegal();
  queue(stream, "ns_polynomial", [=] { return cuda_host::ns_polynomial(g, g2, z, side, stride, batch, a, b, c, stream); });
  return done();
}

cudaError_t mirror_lower(float* a, int64_t side, int64_t stride, int64_t batch, cudaStream_t stream) {
  if (side <= 1 || batch <= 0) return done();
  if (!ranges({{a, f32((batch - 1) * stride + side * side)}}, "mirror_lower")) return illegal();
  queue(stream, "mirror_lower", [=] { return cuda_host::mirror_lower(a, side, stride, batch, stream); });
  return done();
}

cudaError_t probe_fill(uint16_t* x, int64_t n, int64_t period, cudaStream_t stream) {
  if (n <= 0 || period <= 0) return done();
  if (!ranges({{x, static_cast<size_t>(n) * 2, 2}}, "probe_fill")) return illegal();
  queue(stream, "probe_fill", [=] { return cuda_host::probe_fill(x, n, period, stream); });
  return done();
}

cudaError_t any_mismatch(const float* d, int64_t stride, int64_t batch, const float* ref, int64_t n, unsigned int* flag,
                         cudaStream_t stream) {
  if (n <= 0 || batch <= 0) return done();
  if (!ranges({{d, f32((batch - 1) * stride + n)}, {ref, f32(n)}, {flag, sizeof(unsigned int)}}, "any_mismatch"))
    return illegal();
  queue(stream, "any_mismatch", [=] { return cuda_host::any_mismatch(d, stride, batch, ref, n, flag, stream); });
  return done();
}

cudaError_t trace(const float* a, int64_t side, double* out, cudaStream_t stream) {
  if (!ranges({{a, f32(side * side)}, {out, sizeof(double), 8}}, "trace")) return illegal();
  queue(stream, "trace", [=] { return cuda_host::trace(a, side, out, stream); });
  return done();
}

cudaError_t add_scaled(float* y, const float* x, int64_t n, float b, cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{y, f32(n)}, {x, f32(n)}}, "add_scaled")) return illegal();
  queue(stream, "add_scaled", [=] { return cuda_host::add_scaled(y, x, n, b, stream); });
  return done();
}

cudaError_t to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{x, f32(n)}, {y, static_cast<size_t>(n) * 2, 2}}, "to_bf16")) return illegal();
  queue(stream, "to_bf16", [=] { return cuda_host::to_bf16(x, y, n, stream); });
  return done();
}

cudaError_t from_bf16(const uint16_t* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{x, static_cast<size_t>(n) * 2, 2}, {y, f32(n)}}, "from_bf16")) return illegal();
  queue(stream, "from_bf16", [=] { return cuda_host::from_bf16(x, y, n, stream); });
  return done();
}

cudaError_t ordered_sum(const void* blocks, bool bf16, int64_t n, int blocks_n, float* out, cudaStream_t stream) {
  if (n <= 0) return done();
  if (blocks_n < 1) {
    cuda_emu::fail_access("ordered_sum: no block to sum (the kernel reads the first)");
    return illegal();
  }
  if (!ranges({{blocks, grad_bytes(n * blocks_n, bf16), bf16 ? 2u : 4u}, {out, f32(n)}}, "ordered_sum")) return illegal();
  queue(stream, "ordered_sum", [=] { return cuda_host::ordered_sum(blocks, bf16, n, blocks_n, out, stream); });
  return done();
}

cudaError_t divide(float* x, int64_t n, float d, cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{x, f32(n)}}, "divide")) return illegal();
  queue(stream, "divide", [=] { return cuda_host::divide(x, n, d, stream); });
  return done();
}

}  // namespace meshmuon::cuda

namespace meshmuon::cuda_emu {
void fault_next_launch_of(const char* kernel) {
  std::lock_guard<std::mutex> lock(cuda::fault_mu);
  cuda::fault_next = kernel;
}
}  // namespace meshmuon::cuda_emu
