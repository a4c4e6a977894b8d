// The emulated GPU's kernels (tests/cuda_emu, README.md there): the launchers of
// src/backend/cuda/cuda_kernels.h on the host, with the arithmetic of cuda_kernels.cu operation for
// operation (compiled with -ffp-contract=off: each product and sum rounded on its own; std::fma where
// the device code calls __fmaf_rn) and the same fixed reduction trees, so their bits are those the
// GPU kernels are written to give. Each launcher first checks that every range it will touch is one
// live device allocation: a host pointer or an overrun is cudaErrorIllegalAddress, as on a GPU.
// The arithmetic is queued on the launch's stream (streams.h): it runs when the host synchronizes.
#include "backend/cuda/cuda_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bits.h"
#include "device_memory.h"
#include "streams.h"

namespace dmuon::cuda {
namespace {

using cuda_emu::DeviceScope;
using cuda_emu::expect_device;
using cuda_emu::submit;

constexpr int kThreads = 256;  // cuda_kernels.cu's block size (the reduction trees depend on it)

int64_t blocks_for(int64_t n) { return std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 8192); }

using cuda_emu::bf16_to_float;
using cuda_emu::float_to_bf16;
using cuda_emu::float_to_bits;

float load(const void* g, bool bf16, int64_t i) {
  return bf16 ? bf16_to_float(static_cast<const uint16_t*>(g)[i]) : static_cast<const float*>(g)[i];
}
float torch_lerp(float a, float b, float w) {
  const float diff = b - a;
  return std::fabs(w) < 0.5f ? std::fma(w, diff, a) : std::fma(w - 1.0f, diff, b);
}

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

cudaError_t first_non_finite_multi(const NonFiniteItem* items, int count, int64_t blocks, unsigned long long* flags,
                                   cudaStream_t stream) {
  if (count <= 0 || blocks <= 0) return done();
  if (!ranges({{items, sizeof(NonFiniteItem) * static_cast<size_t>(count), 8}}, "first_non_finite_multi")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    if (!table_layout_ok(items, count, blocks, "first_non_finite_multi")) return false;
    for (int t = 0; t < count; ++t) {
      const NonFiniteItem it = items[t];
      const bool bf16 = it.bf16 != 0;
      unsigned long long* result = flags + it.flag;
      if (!ranges({{it.g, grad_bytes(it.n, bf16), bf16 ? 2u : 4u}, {result, sizeof *result, 8}}, "first_non_finite_multi"))
        return false;
      for (int64_t i = 0; i < it.n; ++i) {  // as first_non_finite
        const bool bad = bf16 ? (static_cast<const uint16_t*>(it.g)[i] & 0x7F80u) == 0x7F80u
                              : (float_to_bits(static_cast<const float*>(it.g)[i]) & 0x7F800000u) == 0x7F800000u;
        if (bad) *result = std::min(*result, static_cast<unsigned long long>(i));
      }
    }
    return true;
  });
  return done();
}

cudaError_t momentum_multi(const MomentumItem* items, int count, int64_t blocks, cudaStream_t stream) {
  if (count <= 0 || blocks <= 0) return done();
  if (!ranges({{items, sizeof(MomentumItem) * static_cast<size_t>(count), 8}}, "momentum_multi")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    if (!table_layout_ok(items, count, blocks, "momentum_multi")) return false;
    for (int t = 0; t < count; ++t) {
      const MomentumItem it = items[t];
      const bool bf16 = it.grad_bf16 != 0;
      if (!ranges({{it.buf, f32(it.n)}, {it.grad, grad_bytes(it.n, bf16), bf16 ? 2u : 4u}, {it.update, f32(it.n)}},
                  "momentum_multi"))
        return false;
      for (int64_t i = 0; i < it.n; ++i) {  // the cpu momentum kernels (EMA / heavy ball), then the bf16 rounding
        const float g = load(it.grad, bf16, i);
        float b, u;
        if (it.heavy_ball) {
          b = it.buf[i] * it.mu + g;
          u = it.nesterov ? std::fma(b, it.mu, g) : b;
        } else {
          b = torch_lerp(it.buf[i], g, it.w_grad);
          u = it.nesterov ? torch_lerp(g, b, it.mu) : b;
        }
        it.buf[i] = b;
        it.update[i] = it.round_bf16 ? bf16_to_float(float_to_bf16(u)) : u;
      }
    }
    return true;
  });
  return done();
}

cudaError_t apply_multi(const ApplyItem* items, int count, int64_t blocks, cudaStream_t stream) {
  if (count <= 0 || blocks <= 0) return done();
  if (!ranges({{items, sizeof(ApplyItem) * static_cast<size_t>(count), 8}}, "apply_multi")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    if (!table_layout_ok(items, count, blocks, "apply_multi")) return false;
    for (int t = 0; t < count; ++t) {
      const ApplyItem it = items[t];
      if (!ranges({{it.p, f32(it.n)}, {it.u, f32(it.n)}}, "apply_multi")) return false;
      for (int64_t i = 0; i < it.n; ++i) {  // the cpu apply_update (cautious / decoupled)
        if (it.cautious) {
          const float x = it.p[i];
          const float decay = it.u[i] * x >= 0.0f ? it.b * x : 0.0f;
          it.p[i] = x - (it.a * it.u[i] + decay);
        } else {
          it.p[i] = std::fma(it.u[i], it.b, it.p[i] * it.a);
        }
      }
    }
    return true;
  });
  return done();
}

// The multi-tensor launch: the table is read on the emulated device when the op runs (as the kernel
// reads it), its block layout and each item's buffers checked there, each tensor then as the cpu
// AdamW kernel.
cudaError_t adamw_multi(const AdamWItem* items, int count, int64_t blocks, cudaStream_t stream) {
  if (count <= 0 || blocks <= 0) return done();
  if (!ranges({{items, sizeof(AdamWItem) * static_cast<size_t>(count), 8}}, "adamw_multi")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    if (!table_layout_ok(items, count, blocks, "adamw_multi")) return false;
    for (int t = 0; t < count; ++t) {
      const AdamWItem it = items[t];
      if (!ranges({{it.p, f32(it.n)}, {it.grad, grad_bytes(it.n, it.grad_bf16 != 0), it.grad_bf16 ? 2u : 4u},
                       {it.m, f32(it.n)}, {it.v, f32(it.n)}}, "adamw_multi"))
        return false;
      const AdamScalars& s = it.s;
      for (int64_t i = 0; i < it.n; ++i) {
        const float g = load(it.grad, it.grad_bf16 != 0, i);
        const float x = it.p[i] * s.keep, mi = torch_lerp(it.m[i], g, s.w1);
        const float vi = it.v[i] * s.beta2 + (s.one_m_b2 * g) * g;
        const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
        it.p[i] = x + (s.neg_step * mi) / denom;
        it.m[i] = mi;
        it.v[i] = vi;
      }
    }
    return true;
  });
  return done();
}

cudaError_t scale_rows(float* w, const float* factors, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols <= 0) return done();
  if (!ranges({{w, f32(rows * cols)}, {factors, f32(rows)}}, "scale_rows")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    for (int64_t i = 0; i < rows * cols; ++i)
      if (factors[i / cols] != 1.0f) w[i] = w[i] * factors[i / cols];
    return true;
  });
  return done();
}

cudaError_t round_bf16(float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{x, f32(n)}}, "round_bf16")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_float(float_to_bf16(x[i]));
    return true;
  });
  return done();
}

cudaError_t pack(const PackRun* runs, const int64_t* prefix, int nruns, std::byte* const* bases, int64_t total,
                 cudaStream_t stream) {
  if (total <= 0 || nruns <= 0) return done();
  if (!ranges({{runs, sizeof(PackRun) * static_cast<size_t>(nruns), 8},
               {prefix, sizeof(int64_t) * static_cast<size_t>(nruns + 1), 8}},
              "pack (table)"))
    return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    // The table itself is device memory: read it inside the scope, then check each run's ranges.
    for (int r = 0; r < nruns; ++r) {
      const PackRun& run = runs[r];
      if (!expect_device(bases + run.dst, sizeof(std::byte*), "pack (bases)")) return false;
      const size_t dst_elem = run.conv == PackConv::F32ToBF16 || run.conv == PackConv::FillNegZeroBF16 ? 2 : 4;
      const size_t src_elem = run.conv == PackConv::BF16ToF32 ? 2 : 4;
      const bool reads = run.conv == PackConv::Copy32 || run.conv == PackConv::F32ToBF16 || run.conv == PackConv::BF16ToF32;
      const std::byte* d = bases[run.dst] + run.dst_off;
      const size_t dst_span = static_cast<size_t>((run.rows - 1) * run.dst_stride) + static_cast<size_t>(run.len) * dst_elem;
      if (!expect_device(d, dst_span, "pack (destination run)")) return false;
      // (any alignment: the kernel moves misaligned items in 16- or 8-bit pieces)
      if (reads) {
        if (!expect_device(bases + run.src, sizeof(std::byte*), "pack (bases)")) return false;
        const std::byte* s = bases[run.src] + run.src_off;
        const size_t src_span =
            static_cast<size_t>((run.rows - 1) * run.src_stride) + static_cast<size_t>(run.len) * src_elem;
        if (!expect_device(s, src_span, "pack (source run)")) return false;
      }
      if (prefix[r + 1] - prefix[r] != run.len * run.rows) return false;
    }
    for (int r = 0; r < nruns; ++r) {
      const PackRun& run = runs[r];
      for (int64_t row = 0; row < run.rows; ++row) {
        std::byte* d = bases[run.dst] + run.dst_off + row * run.dst_stride;
        const std::byte* s = bases[run.src] + run.src_off + row * run.src_stride;
        for (int64_t k = 0; k < run.len; ++k) switch (run.conv) {
            case PackConv::Copy32: std::memcpy(d + 4 * k, s + 4 * k, 4); break;
            case PackConv::F32ToBF16: {
              float f;
              std::memcpy(&f, s + 4 * k, 4);
              const uint16_t b = float_to_bf16(f);
              std::memcpy(d + 2 * k, &b, 2);
              break;
            }
            case PackConv::BF16ToF32: {
              uint16_t b;
              std::memcpy(&b, s + 2 * k, 2);
              const uint32_t u = static_cast<uint32_t>(b) << 16;
              std::memcpy(d + 4 * k, &u, 4);
              break;
            }
            case PackConv::FillNegZero32: {
              const uint32_t u = 0x80000000u;
              std::memcpy(d + 4 * k, &u, 4);
              break;
            }
            case PackConv::FillNegZeroBF16: {
              const uint16_t u = 0x8000u;
              std::memcpy(d + 2 * k, &u, 2);
              break;
            }
          }
      }
    }
    return true;
  });
  return done();
}

// The device's fixed trees: per block, thread t sums i = b·256 + t + j·grid·256 in order, then a
// halving tree over the 256 partials; then one block sums the block partials the same way.
namespace {
double tree(std::vector<double>& partial) {
  for (int w = kThreads / 2; w > 0; w /= 2)
    for (int t = 0; t < w; ++t) partial[static_cast<size_t>(t)] = partial[static_cast<size_t>(t)] + partial[static_cast<size_t>(t + w)];
  return partial[0];
}
}  // namespace

cudaError_t sum_squares(const float* x, int64_t n, double* partials, double* out, cudaStream_t stream) {
  const int64_t blocks = std::min<int64_t>(blocks_for(n), kSumSquaresBlocks);
  if (!ranges({{x, f32(n)}, {partials, sizeof(double) * static_cast<size_t>(blocks), 8}, {out, sizeof(double), 8}},
              "sum_squares"))
    return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    std::vector<double> partial(kThreads);
    for (int64_t b = 0; b < blocks; ++b) {
      for (int t = 0; t < kThreads; ++t) {
        double acc = 0;
        for (int64_t i = b * kThreads + t; i < n; i += blocks * kThreads) {
          const double v = x[i];
          acc = acc + v * v;
        }
        partial[static_cast<size_t>(t)] = acc;
      }
      partials[b] = tree(partial);
    }
    for (int t = 0; t < kThreads; ++t) {
      double acc = 0;
      for (int64_t i = t; i < blocks; i += kThreads) acc = acc + partials[i];
      partial[static_cast<size_t>(t)] = acc;
    }
    *out = tree(partial);
    return true;
  });
  return done();
}

cudaError_t normalize(const float* in, float* out, int64_t n, const double* norm2, double scale, double eps, bool add,
                      cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{in, f32(n)}, {out, f32(n)}, {norm2, sizeof(double), 8}}, "normalize")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    const double norm = std::sqrt(*norm2), scaled = norm * scale;
    const double denom = add ? scaled + eps : (scaled < eps ? eps : scaled);
    const bool zero = norm == 0 || denom == 0;
    const float inv = zero ? 0.0f : static_cast<float>(1.0 / denom);
    for (int64_t i = 0; i < n; ++i) out[i] = zero ? 0.0f : in[i] * inv;
    return true;
  });
  return done();
}

cudaError_t normuon(float* u, int64_t rows, int64_t cols, float* v_mean, float* v, float w, NormuonScratch sc,
                    cudaStream_t stream) {
  const bool per_row = rows >= cols;
  const int64_t len = per_row ? rows : cols;
  const double k = static_cast<double>(per_row ? cols : rows);
  if (len <= 0) return done();
  if (!ranges({{u, f32(rows * cols)}, {v_mean, f32(len)}, {v, f32(len)}, {sc.step, f32(len)},
               {sc.norm, sizeof(double), 8}, {sc.ratio, sizeof(float)}},
              "normuon"))
    return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    for (int64_t t = 0; t < len; ++t) {
      double sum = 0;
      const int64_t count = per_row ? cols : rows;
      for (int64_t j = 0; j < count; ++j) {
        const double x = per_row ? u[t * cols + j] : u[j * cols + t];
        sum = sum + x * x;
      }
      v_mean[t] = count > 0 ? static_cast<float>(sum / static_cast<double>(count)) : 0.0f;
    }
    if (k == 0) return true;
    double sum = 0;
    for (int64_t i = 0; i < len; ++i) sum = sum + static_cast<double>(v_mean[i]);
    *sc.norm = std::sqrt(sum * k);
    for (int64_t i = 0; i < len; ++i) {
      const float vi = torch_lerp(v[i], v_mean[i], w);
      v[i] = vi;
      sc.step[i] = 1.0f / std::sqrt(vi < 1e-10f ? 1e-10f : vi);
    }
    double sum_new = 0;
    for (int64_t i = 0; i < len; ++i) {
      const double s = sc.step[i];
      sum_new = sum_new + (static_cast<double>(v_mean[i]) * k) * (s * s);
    }
    const double norm_new = std::sqrt(sum_new);
    *sc.ratio = static_cast<float>(*sc.norm / (norm_new < 1e-10 ? 1e-10 : norm_new));
    const float r = *sc.ratio;
    for (int64_t i = 0; i < rows * cols; ++i) {
      const int64_t t = per_row ? i / cols : i % cols;
      u[i] = u[i] * (sc.step[t] * r);
    }
    return true;
  });
  return done();
}

cudaError_t scale(const float* in, float* out, int64_t n, float inv, cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{in, f32(n)}, {out, f32(n)}}, "scale")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] * inv;
    return true;
  });
  return done();
}

cudaError_t ns_polynomial(const float* g, const float* g2, float* z, int64_t side, int64_t stride, int64_t batch,
                          float a, float b, float c, cudaStream_t stream) {
  if (side <= 0 || batch <= 0) return done();
  const int64_t n = side * side, span = (batch - 1) * stride + n;
  if (!ranges({{g, f32(span)}, {g2, f32(span)}, {z, f32(span)}}, "ns_polynomial")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    for (int64_t e = 0; e < batch; ++e)
      for (int64_t r = 0; r < n; ++r) {
        const int64_t i = e * stride + r;
        float v = b * g[i] + c * g2[i];
        if (r / side == r % side) v = v + a;
        z[i] = v;
      }
    return true;
  });
  return done();
}

cudaError_t mirror_lower(float* a, int64_t side, int64_t stride, int64_t batch, cudaStream_t stream) {
  if (side <= 1 || batch <= 0) return done();
  if (!ranges({{a, f32((batch - 1) * stride + side * side)}}, "mirror_lower")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    for (int64_t e = 0; e < batch; ++e) {
      float* m = a + e * stride;
      for (int64_t i = 0; i < side; ++i)
        for (int64_t j = i + 1; j < side; ++j) m[i * side + j] = m[j * side + i];
    }
    return true;
  });
  return done();
}

cudaError_t probe_fill(uint16_t* x, int64_t n, int64_t period, cudaStream_t stream) {
  if (n <= 0 || period <= 0) return done();
  if (!ranges({{x, static_cast<size_t>(n) * 2, 2}}, "probe_fill")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t h = static_cast<uint32_t>(i % period) * 2654435761u;
      h ^= h >> 15;
      h *= 2246822519u;
      h ^= h >> 13;
      x[i] = static_cast<uint16_t>(((h >> 31) << 15) | ((115u + (h >> 8) % 25u) << 7) | (h & 0x7Fu));
    }
    return true;
  });
  return done();
}

cudaError_t any_mismatch(const float* d, int64_t stride, int64_t batch, const float* ref, int64_t n, unsigned int* flag,
                         cudaStream_t stream) {
  if (n <= 0 || batch <= 0) return done();
  if (!ranges({{d, f32((batch - 1) * stride + n)}, {ref, f32(n)}, {flag, sizeof(unsigned int)}}, "any_mismatch"))
    return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    for (int64_t e = 0; e < batch; ++e)
      for (int64_t i = 0; i < n; ++i)
        if (std::memcmp(d + e * stride + i, ref + i, 4) != 0) *flag = 1u;
    return true;
  });
  return done();
}

cudaError_t trace(const float* a, int64_t side, double* out, cudaStream_t stream) {
  if (!ranges({{a, f32(side * side)}, {out, sizeof(double), 8}}, "trace")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    double sum = 0;
    for (int64_t i = 0; i < side; ++i) sum = sum + static_cast<double>(a[i * side + i]);
    *out = sum;
    return true;
  });
  return done();
}

cudaError_t add_scaled(float* y, const float* x, int64_t n, float b, cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{y, f32(n)}, {x, f32(n)}}, "add_scaled")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] + b * x[i];
    return true;
  });
  return done();
}

cudaError_t to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{x, f32(n)}, {y, static_cast<size_t>(n) * 2, 2}}, "to_bf16")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]);
    return true;
  });
  return done();
}

cudaError_t from_bf16(const uint16_t* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{x, static_cast<size_t>(n) * 2, 2}, {y, f32(n)}}, "from_bf16")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]);
    return true;
  });
  return done();
}

cudaError_t ordered_sum(const void* blocks, bool bf16, int64_t n, int blocks_n, float* out, cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{blocks, grad_bytes(n * blocks_n, bf16), bf16 ? 2u : 4u}, {out, f32(n)}}, "ordered_sum")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    for (int64_t i = 0; i < n; ++i) {
      float acc = load(blocks, bf16, i);
      for (int j = 1; j < blocks_n; ++j) acc = acc + load(blocks, bf16, static_cast<int64_t>(j) * n + i);
      out[i] = acc;
    }
    return true;
  });
  return done();
}

cudaError_t divide(float* x, int64_t n, float d, cudaStream_t stream) {
  if (n <= 0) return done();
  if (!ranges({{x, f32(n)}}, "divide")) return illegal();
  submit(stream, [=] {
    DeviceScope scope;
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] / d;
    return true;
  });
  return done();
}

}  // namespace dmuon::cuda
