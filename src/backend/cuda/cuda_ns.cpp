// Internal: the cuda backend's Newton–Schulz orchestration (cuda_ns.h): the scratch layout of a
// batch, the batched symmetric products, the iteration, NorMuon after it, and the Gram form.
#include "backend/cuda/cuda_ns.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "backend/cuda/batched_gemm.h"
#include "backend/cuda/cublas_loader.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/shared/cuda_error.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/shared/device_guard.h"
#include "backend/cuda/thread_resources.h"
#include "meshmuon/error.h"
#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/ns_kernels.h"

namespace meshmuon::detail {
namespace {

// The scratch a muon_batch call takes at most at a time (set_cuda_ns_batch_bytes): the batch is cut
// into parts that fit, one matrix at least. Each part's matrices get the bits they would get alone.
std::atomic<size_t> ns_batch_bytes{size_t{512} << 20};

// Newton–Schulz of one call on one device, for one backend (its fence and its comm rounding).
class CudaNs {
 public:
  CudaNs(Backend& backend, int device) : backend_(backend), device_(device) {}

  // The matrices of every unit, ns_batch_bytes of scratch at a time (set_cuda_ns_batch_bytes): Newton–Schulz on the whole
  // batch (orthogonalize, one batched call per product), then per matrix the copy back, NorMuon and
  // the comm rounding. A matrix's bits do not depend on its batch (batched_gemm.h).
  void muon_batch(Orthogonalizer& orth, std::span<const Backend::UnitRef> units, int64_t rows, int64_t cols,
                  float* v_mean, double beta2, DType comm) {
    if (rows == 0 || cols == 0) return;
    MESHMUON_CHECK(rows <= INT_MAX && cols <= INT_MAX, "[orth] matrix ", rows, "x", cols,
                " exceeds the BLAS int range; split it or orthogonalize per expert");
    const int64_t len = normuon_state_size(rows, cols);
    std::vector<Matrix> mats;
    for (const Backend::UnitRef& r : units)
      for (int64_t e = 0; e < r.batch; ++e)
        mats.push_back({r.u + e * rows * cols, r.v != nullptr ? r.v + e * len : nullptr});
    if (mats.empty()) return;
    for (const Matrix& x : mats)
      MESHMUON_CHECK(x.v == nullptr || v_mean != nullptr, "[cuda] muon_units: NorMuon needs the v_mean scratch");
    const DeviceGuard guard = enter();
    const bool bf16 = orth.options().matmul_dtype == DType::BF16;
    NsPointers unused;
    const size_t per_matrix = ns_layout(rows, cols, bf16, len, 2, nullptr, unused) - ns_layout(rows, cols, bf16, len, 1, nullptr, unused);
    const size_t cap = std::max<size_t>(1, ns_batch_bytes.load() / std::max<size_t>(per_matrix, 1));
    const float w_v = cpu::to_scalar(1.0 - beta2);  // normuon_finish's weight
    for (size_t first = 0; first < mats.size(); first += cap) {
      const std::span<const Matrix> part(mats.data() + first, std::min(cap, mats.size() - first));
      NsWork w(device_, rows, cols, bf16, len, static_cast<int64_t>(part.size()));
      const float* result = orthogonalize(orth, part, rows, cols, w);
      for (size_t i = 0; i < part.size(); ++i) {
        float* x = part[i].x;
        check_cuda(cudaMemcpyAsync(x, result + static_cast<int64_t>(i) * w.sx, static_cast<size_t>(rows * cols) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, tl_stream),
                   "ns copy");
        if (part[i].v != nullptr) check_cuda(cuda::normuon(x, rows, cols, v_mean, part[i].v, w_v, w.nm, tl_stream), "normuon");
        backend_.round_to_comm(x, rows * cols, comm);
      }
    }
  }

  // The gram_allreduce strategy's iteration, as the cpu backend's: per step the local slice's Gram
  // matrix (exactly symmetric: the lower triangle mirrored), summed over the shard group by `reduce`
  // on device memory (the communicator stages or runs NCCL), A² and the polynomial, X ← a·X + Z·X.
  // Step 0's Gram of the unnormalized slice gives ‖G‖² as its trace: one host synchronization there.
  void gram_newton_schulz(const NsOptions& ns, float* x, int64_t m, int64_t n, bool wide, int64_t sd,
                          const GramReduce& reduce, DType comm) {
    const DeviceGuard guard = enter();
    const int64_t ld = wide ? n : m, numel = m * n, ss = sd * sd;
    MESHMUON_CHECK(sd <= INT_MAX && ld <= INT_MAX && m <= INT_MAX && n <= INT_MAX, "[cuda] gram_newton_schulz: ", m, "x",
                n, " (Gram side ", sd, ") exceeds the BLAS int range");
    // A, A², the copy of X and the norm in the thread's scratch, each 256-byte aligned
    const auto up = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t a_bytes = up(static_cast<size_t>(ss) * sizeof(float)), tmp_bytes = up(static_cast<size_t>(numel) * sizeof(float));
    std::byte* work = thread_scratch(device_, 2 * a_bytes + tmp_bytes + sizeof(double), kAuxScratch);
    float *a = reinterpret_cast<float*>(work), *a2 = reinterpret_cast<float*>(work + a_bytes),
          *tmp = reinterpret_cast<float*>(work + 2 * a_bytes);
    auto* norm_dev = reinterpret_cast<double*>(work + 2 * a_bytes + tmp_bytes);
    const auto gram = [&](int step) {
      if (ld > 0) {
        // row-major x is column-major xᵀ (ld n): wide A = X·Xᵀ = (xᵀ)ᵀ·xᵀ; tall A = Xᵀ·X = xᵀ·(xᵀ)ᵀ.
        if (wide) gemm(true, false, sd, sd, n, x, n, x, n, a, sd, false);
        else gemm(false, true, sd, sd, m, x, n, x, n, a, sd, false);
        check_cuda(cuda::mirror_lower(a, sd, ss, 1, tl_stream), "gram mirror");
      } else {
        check_cuda(cudaMemsetAsync(a, 0, static_cast<size_t>(ss) * sizeof(float), tl_stream), "cudaMemset");
      }
      const Fence written = backend_.fence(nullptr);  // the collective reads it on its own stream, after this point
      reduce(a, static_cast<size_t>(ss), step, written.event());
    };
    const std::vector<Coefficients> coef = make_schedule(ns);
    gram(0);
    check_cuda(cuda::trace(a, sd, norm_dev, tl_stream), "gram trace");
    double norm2 = 0;
    thread_download(device_, &norm2, norm_dev, sizeof norm2);
    const double norm = std::sqrt(norm2) * ns.scale;
    const double d = ns.eps_mode == EpsMode::Add ? norm + ns.eps : std::max(norm, static_cast<double>(ns.eps));
    if (norm2 == 0 || d == 0) {  // every rank sees the same sum: all leave here together
      check_cuda(cudaMemsetAsync(x, 0, static_cast<size_t>(numel) * sizeof(float), tl_stream), "gram zeros");
      return;
    }
    const float inv = static_cast<float>(1.0 / d), inv2 = static_cast<float>(1.0 / (d * d));
    check_cuda(cuda::scale(x, x, numel, inv, tl_stream), "gram normalize");
    check_cuda(cuda::scale(a, a, ss, inv2, tl_stream), "gram normalize");
    const int S = static_cast<int>(sd), M = static_cast<int>(m), N = static_cast<int>(n);
    for (size_t t = 0; t < coef.size(); ++t) {
      if (t > 0) gram(static_cast<int>(t));
      // a2 = c·A·A + b·A (row-major products through column-major identities; A is symmetric)
      gemm(false, false, S, S, S, a, S, a, S, a2, S, false, static_cast<float>(coef[t].c));
      check_cuda(cuda::add_scaled(a2, a, ss, static_cast<float>(coef[t].b), tl_stream), "gram polynomial");
      if (numel == 0) continue;
      check_cuda(cudaMemcpyAsync(tmp, x, static_cast<size_t>(numel) * sizeof(float), cudaMemcpyDeviceToDevice, tl_stream),
                 "gram copy");
      // wide: X = a2·tmp + a·X (row-major) = column-major xᵀ = tmpᵀ·a2ᵀ + a·xᵀ; tall: X = tmp·a2 + a·X.
      if (wide) gemm(false, false, N, M, S, tmp, N, a2, S, x, N, false, 1.0f, static_cast<float>(coef[t].a));
      else gemm(false, false, N, M, S, a2, S, tmp, N, x, N, false, 1.0f, static_cast<float>(coef[t].a));
    }
    backend_.round_to_comm(x, numel, comm);
  }

 private:
  // The device, current for the calling scope; the caller's current device comes back at its end.
  DeviceGuard enter() const { return DeviceGuard(device_); }

  // A matrix of a muon_batch call and its NorMuon state (or null).
  struct Matrix {
    float* x;
    float* v;
  };
  // Device pointers of a muon_batch part's scratch (NsWork's pieces). Each matrix of the part has a
  // slot `sx` (m×n) or `sg` (s×s) elements apart in the slabs, padded to 128 elements so that every
  // slot starts at the first one's 256-byte alignment (fp32 and bf16 alike).
  struct NsPointers {
    double *norm2 = nullptr, *partials = nullptr;
    double *row_sq = nullptr, *eq_target = nullptr;  // MuonEq's, used by one matrix after another
    cuda::NormuonScratch nm{};
    float *x0 = nullptr, *x1 = nullptr, *g = nullptr, *g2 = nullptr, *z = nullptr;
    uint16_t *xb = nullptr, *gb = nullptr, *zb = nullptr;
    int64_t sx = 0, sg = 0;
  };
  // Lays the pieces out from `base` (256-byte aligned; base null: only measures) and returns the
  // bytes: the norm and its partial sums, MuonEq's row sums and target, NorMuon's step (len floats) and scalars (used by one
  // matrix after another, stream-ordered), the ping-pong X slabs, the G, G², Z slabs, and the bf16
  // operand copies.
  static size_t ns_layout(int64_t m, int64_t n, bool bf16, int64_t len, int64_t batch, std::byte* base, NsPointers& p) {
    const auto pad = [](int64_t e) { return (e + 127) / 128 * 128; };
    p.sx = pad(m * n), p.sg = pad(std::min(m, n) * std::min(m, n));
    const size_t bx = static_cast<size_t>(batch * p.sx), bg = static_cast<size_t>(batch * p.sg);
    size_t off = 0;
    auto take = [&](size_t bytes) {
      std::byte* at = base ? base + off : nullptr;
      off += (bytes + 255) / 256 * 256;
      return at;
    };
    p.norm2 = reinterpret_cast<double*>(take(sizeof(double)));
    p.partials = reinterpret_cast<double*>(take(cuda::kSumSquaresBlocks * sizeof(double)));
    p.row_sq = reinterpret_cast<double*>(take(static_cast<size_t>(m) * sizeof(double)));
    p.eq_target = reinterpret_cast<double*>(take(sizeof(double)));
    p.nm.norm = reinterpret_cast<double*>(take(sizeof(double)));
    p.nm.ratio = reinterpret_cast<float*>(take(sizeof(float)));
    p.nm.step = reinterpret_cast<float*>(take(static_cast<size_t>(len) * sizeof(float)));
    p.x0 = reinterpret_cast<float*>(take(bx * sizeof(float)));
    p.x1 = reinterpret_cast<float*>(take(bx * sizeof(float)));
    p.g = reinterpret_cast<float*>(take(bg * sizeof(float)));
    p.g2 = reinterpret_cast<float*>(take(bg * sizeof(float)));
    p.z = reinterpret_cast<float*>(take(bg * sizeof(float)));
    if (bf16) {
      p.xb = reinterpret_cast<uint16_t*>(take(bx * sizeof(uint16_t)));
      p.gb = reinterpret_cast<uint16_t*>(take(bg * sizeof(uint16_t)));
      p.zb = reinterpret_cast<uint16_t*>(take(bg * sizeof(uint16_t)));
    }
    return off;
  }
  // Scratch of one muon_batch part, laid out in the thread's scratch on the device (call enter()
  // first). Valid until the thread's next muon_batch.
  struct NsWork : NsPointers {
    NsWork(int device, int64_t m, int64_t n, bool bf16, int64_t len, int64_t batch) : s(std::min(m, n)), batch(batch) {
      NsPointers unused;
      ns_layout(m, n, bf16, len, batch,
                thread_scratch(device, ns_layout(m, n, bf16, len, batch, nullptr, unused), kNsScratch), *this);
    }
    int64_t s, batch;
  };

  // Column-major C (M×N) = alpha·op(A)·op(B) + beta·C, fp32 or bf16 operands with fp32 accumulation and
  // output (gram_newton_schulz's products: one matrix, alpha and beta).
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B, int64_t ldb,
            float* C, int64_t ldc, bool bf16, float alpha = 1.0f, float beta = 0.0f) {
    detail::gemm(blas_handle(device_), ta, tb, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), A,
                 static_cast<int>(lda), B, static_cast<int>(ldb), C, static_cast<int>(ldc), bf16, alpha, beta,
                 bf16 ? "cublasGemmEx (bf16)" : "cublasGemmEx (fp32)");
  }

  // `batch` column-major products C_i (M×N) = op(A_i)·op(B_i), the operands' matrices sa / sb / sc
  // elements apart (batched_gemm.h: the same bits for a matrix whatever the batch).
  void bgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, int64_t sa, const void* B,
             int64_t ldb, int64_t sb, float* C, int64_t ldc, int64_t sc, bool bf16, int64_t batch) {
    GemmCall c;
    c.ta = ta, c.tb = tb, c.m = static_cast<int>(M), c.n = static_cast<int>(N), c.k = static_cast<int>(K);
    c.a = A, c.lda = static_cast<int>(lda), c.stride_a = sa;
    c.b = B, c.ldb = static_cast<int>(ldb), c.stride_b = sb;
    c.d = C, c.ldd = static_cast<int>(ldc), c.stride_d = sc;
    c.bf16 = bf16;
    batched_gemm(c, batch, device_, tl_stream, blas_handle(device_));
  }

  // `batch` s×s symmetric products into the row-major slab `out` (matrices `stride` apart):
  // symmetric, the column-major view's block columns [c0, c1) over rows [0, c1) (the row-major lower
  // block triangle; cuda::lower_blocks) then a mirror; else one full product. `block(c0, c1)` issues
  // the batched GEMM of one block column with c1 rows. Every matrix gets the same calls whatever its
  // batch (bitwise layout invariance).
  template <class Block>
  void symmetric_product(int64_t s, float* out, int64_t stride, int64_t batch, bool symmetric, Block&& block) {
    const int64_t blocks = symmetric ? cuda::lower_blocks(s) : 1;
    for (int64_t b = 0; b < blocks; ++b)
      block(symmetric ? cuda::lower_bound(s, b) : 0, symmetric ? cuda::lower_bound(s, b + 1) : s);
    if (blocks > 1) check_cuda(cuda::mirror_lower(out, s, stride, batch, tl_stream), "ns mirror");
  }

  // G = X·Xᵀ (wide) or Xᵀ·X (tall) of the row-major m×n matrices of the slab `xa` (fp32 or bf16,
  // w.sx apart) into the s×s slab g (w.sg apart). In the column-major view A = xa (n×m, ld n): wide
  // G = Aᵀ·A, block Aᵀ[0:c1]·A[:, c0:c1]; tall G = A·Aᵀ, block A[0:c1, :]·(A[c0:c1, :])ᵀ.
  void gram_product(const void* xa, int64_t m, int64_t n, float* g, bool bf16, bool symmetric, const NsWork& w) {
    const int64_t s = w.s, k = std::max(m, n);
    const size_t elem = bf16 ? 2 : 4;
    const auto* base = static_cast<const std::byte*>(xa);
    symmetric_product(s, g, w.sg, w.batch, symmetric, [&](int64_t c0, int64_t c1) {
      if (m <= n)
        bgemm(true, false, c1, c1 - c0, k, base, n, w.sx, base + static_cast<size_t>(c0 * n) * elem, n, w.sx, g + c0 * s,
              s, w.sg, bf16, w.batch);
      else
        bgemm(false, true, c1, c1 - c0, k, base, n, w.sx, base + static_cast<size_t>(c0) * elem, n, w.sx, g + c0 * s, s,
              w.sg, bf16, w.batch);
    });
  }

  // g2 = G·G for the symmetric s×s matrices of the slab `ga` (fp32 or bf16): block G[0:c1, :]·G[:, c0:c1].
  void square_product(const void* ga, float* g2, bool bf16, bool symmetric, const NsWork& w) {
    const int64_t s = w.s;
    const size_t elem = bf16 ? 2 : 4;
    const auto* base = static_cast<const std::byte*>(ga);
    symmetric_product(s, g2, w.sg, w.batch, symmetric, [&](int64_t c0, int64_t c1) {
      bgemm(false, false, c1, c1 - c0, s, base, s, w.sg, base + static_cast<size_t>(c0 * s) * elem, s, w.sg, g2 + c0 * s,
            s, w.sg, bf16, w.batch);
    });
  }

  // Newton–Schulz on the row-major m×n device matrices `mats`, as the cpu Orthogonalizer::run, into
  // the slab it returns (w.x0 or w.x1, matrices w.sx apart): MuonEq's row equilibration when on
  // (bitwise the cpu's), X₀ = x / (‖x‖·scale + eps) (or max), per step G = X·Xᵀ (wide) / XᵀX (tall),
  // Z = aI + bG + cG², X ← Z·X / X·Z, then Muon+'s renormalization when on. Row-major X is
  // column-major Xᵀ (ld n) for cuBLAS. G and G² are formed on their block triangle (gram_product,
  // square_product) unless the method is plain (method gram never reaches here: this backend does
  // not declare it, and make_orthogonalizer refuses it by name). Each product is
  // one batched call over the part; the scalings and the norm run per matrix (its own bits whatever
  // the batch).
  const float* orthogonalize(Orthogonalizer& orth, std::span<const Matrix> mats, int64_t m, int64_t n, NsWork& w) {
    const NsOptions& o = orth.options();
    const bool bf16 = o.matmul_dtype == DType::BF16;
    const int64_t b = w.batch;
    // X₀ = x / denom with the norm kept on the device (no host synchronization per matrix); an
    // all-zero x gives +0 throughout, which the products keep exactly (the cpu returns zeros too).
    for (int64_t i = 0; i < b; ++i) {
      const float* x = mats[static_cast<size_t>(i)].x;
      if (o.muon_eq) {  // equilibrated into X₀'s slot, normalized there in place
        check_cuda(cuda::muon_eq(x, w.x0 + i * w.sx, m, n, w.row_sq, w.eq_target, cpu::kMuonEqMinRowNorm, tl_stream),
                   "muon_eq");
        x = w.x0 + i * w.sx;
      }
      check_cuda(cuda::sum_squares(x, m * n, w.partials, w.norm2, tl_stream), "ns norm");
      check_cuda(cuda::normalize(x, w.x0 + i * w.sx, m * n, w.norm2, static_cast<double>(o.scale), static_cast<double>(o.eps),
                                 o.eps_mode == EpsMode::Add, tl_stream),
                 "ns normalize");
    }
    const bool wide = m <= n;
    const bool symmetric = o.method != NsMethod::Plain;
    const int64_t s = w.s;
    float* cur = w.x0;
    float* other = w.x1;
    for (const Coefficients& k : orth.coefficients()) {
      const void* xa = cur;
      if (bf16) check_cuda(cuda::to_bf16(cur, w.xb, b * w.sx, tl_stream), "ns bf16"), xa = w.xb;
      gram_product(xa, m, n, w.g, bf16, symmetric, w);
      const void* ga = w.g;
      if (bf16) check_cuda(cuda::to_bf16(w.g, w.gb, b * w.sg, tl_stream), "ns bf16"), ga = w.gb;
      square_product(ga, w.g2, bf16, symmetric, w);
      check_cuda(cuda::ns_polynomial(w.g, w.g2, w.z, s, w.sg, b, static_cast<float>(k.a), static_cast<float>(k.b),
                                     static_cast<float>(k.c), tl_stream),
                 "ns polynomial");
      const void* za = w.z;
      if (bf16) check_cuda(cuda::to_bf16(w.z, w.zb, b * w.sg, tl_stream), "ns bf16"), za = w.zb;
      if (wide) bgemm(false, false, n, m, m, xa, n, w.sx, za, m, w.sg, other, n, w.sx, bf16, b);
      else bgemm(false, false, n, m, n, za, n, w.sg, xa, n, w.sx, other, n, w.sx, bf16, b);
      std::swap(cur, other);
    }
    if (o.muon_plus)
      for (int64_t i = 0; i < b; ++i)
        check_cuda(cuda::muon_plus(cur + i * w.sx, m, n, w.partials, w.norm2, cpu::kMuonPlusMinNorm, tl_stream),
                   "muon_plus");
    return cur;
  }

  Backend& backend_;
  int device_;
};

}  // namespace

size_t set_cuda_ns_batch_bytes(size_t bytes) { return ns_batch_bytes.exchange(bytes); }

void cuda_muon_batch(Backend& backend, int device, Orthogonalizer& orth, std::span<const Backend::UnitRef> units,
                     int64_t rows, int64_t cols, float* v_mean, double beta2, DType comm) {
  CudaNs(backend, device).muon_batch(orth, units, rows, cols, v_mean, beta2, comm);
}

void cuda_gram_newton_schulz(Backend& backend, int device, const NsOptions& ns, float* x, int64_t m, int64_t n,
                             bool wide, int64_t sd, const GramReduce& reduce, DType comm) {
  CudaNs(backend, device).gram_newton_schulz(ns, x, m, n, wide, sd, reduce, comm);
}

}  // namespace meshmuon::detail
