// Newton–Schulz with bf16 products (see ns_kernels.h). The algebra is the fp32 kernel's
// (newton_schulz.cpp); here every matrix product reads bf16 operands, so each fp32 result that feeds
// a product is rounded once to bf16. The polynomial Z = aI + b·A + c·A² takes A from the same bf16
// copy that the A² product reads (as torch.optim.Muon does): Z is then a function of one rounded A,
// whose error reaches Z through b + 2c·A, small where the iterates' σ² sit near 1 and A's rounding
// errors are largest (Jordan, A = 1.23: 0.22, against 2c·A = 5.0 when b·A used the fp32 A and A²
// the rounded one; that mix put a 64×1 output 6% off; docs/python.md has the measured errors).
// There is no bf16 Gram Newton–Schulz: it iterates on R = X·Xᵀ, whose small eigenvalues σ² sit far
// below bf16's resolution of R's large ones (tested: σ errors of 0.5 on a rank-20 200×500 input,
// against 0.015 for this kernel), so Orthogonalizer rejects it.
//
// One iteration, two product engines (bf16_products.h): oneDNN on bf16 storage, and meshmuon's widened
// products, where the same bf16 values are stored as fp32 and multiplied by the fp32 products
// (exact: a product of two bf16 values fits fp32's mantissa).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "meshmuon/bf16.h"
#include "backend/cpu/kernels/bf16_products.h"
#include "backend/cpu/kernels/ns_kernels.h"
#include "backend/cpu/kernels/products.h"

// The element-wise passes get an AVX-512 clone next to the generic one (picked at load time);
// -ffp-contract=off (CMakeLists) keeps both clones' arithmetic identical.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MESHMUON_ELEMENTWISE __attribute__((target_clones("avx512f", "default")))
#else
#define MESHMUON_ELEMENTWISE
#endif
#define MESHMUON_INLINE inline __attribute__((always_inline))

namespace meshmuon::cpu {
namespace {

// Branch-free fp32 -> bf16 (the numerics of float_to_bf16 in bf16.h: nearest even, NaN -> 0x7FC0),
// written so that the row loops below vectorize.
MESHMUON_INLINE uint16_t bf16_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}
MESHMUON_INLINE float bf16_value(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

// A bf16 operand held as its bits (oneDNN) or as the fp32 of the same value (widened).
MESHMUON_INLINE void store(uint16_t& dst, float v) { dst = bf16_bits(v); }
MESHMUON_INLINE void store(float& dst, float v) { dst = bf16_value(bf16_bits(v)); }
MESHMUON_INLINE float load(uint16_t v) { return bf16_value(v); }
MESHMUON_INLINE float load(float v) { return v; }

constexpr int64_t kTile = 32;  // tile of the mirror: its row and column writes stay in cache

// The element-wise passes work on row ranges [r0, r1) so that they run in parallel (parallel_rows);
// each row's result is the same whatever the split.

// out = bf16(in · inv), element by element (rows of `cols`).
template <class T>
MESHMUON_INLINE void scale_body(const float* __restrict in, float inv, T* __restrict out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) store(out[i], in[i] * inv);
}

// Copies the lower triangle of the s×s matrix onto its upper triangle, for the source row blocks
// [b0, b1) of kTile rows (block ib writes only columns [ib, ib + kTile) of the rows above it).
template <class T>
MESHMUON_INLINE void mirror_body(T* a, int64_t s, int64_t b0, int64_t b1) {
  for (int64_t ib = b0 * kTile; ib < std::min(b1 * kTile, s); ib += kTile)
    for (int64_t jb = 0; jb <= ib; jb += kTile)
      for (int64_t j = jb; j < std::min(jb + kTile, s); ++j) {
        T* dst = a + j * s;
        for (int64_t i = std::max(ib, j + 1); i < std::min(ib + kTile, s); ++i) dst[i] = a[i * s + j];
      }
}

// Rows [r0, r1) of the lower triangle of the fp32 G, each entry rounded once.
template <class T>
MESHMUON_INLINE void lower_body(int64_t s, const float* g, T* out, int64_t r0, int64_t r1) {
  for (int64_t i = r0; i < r1; ++i) {
    const float* gi = g + i * s;
    T* oi = out + i * s;
    for (int64_t j = 0; j <= i; ++j) store(oi[j], gi[j]);
  }
}

// Rows [r0, r1) of z = bf16(a·I + b·A + c·A2), A the bf16 matrix `ab` (full, symmetric), A2 fp32:
// the lower triangle (plain: every entry), each entry rounded once.
template <class T>
MESHMUON_INLINE void polynomial_body(int64_t s, const T* ab, const float* a2, float a, float b, float c, bool plain,
                                  T* z, int64_t r0, int64_t r1) {
  for (int64_t i = r0; i < r1; ++i) {
    const T* ai = ab + i * s;
    const float* a2i = a2 + i * s;
    T* zi = z + i * s;
    const int64_t end = plain ? s : i + 1;
    for (int64_t j = 0; j < end; ++j) store(zi[j], b * load(ai[j]) + c * a2i[j]);
    store(zi[i], b * load(ai[i]) + c * a2i[i] + a);
  }
}

// Rounds every element of the rows×cols block (row stride ld) to a bf16 value in place.
MESHMUON_INLINE void round_block_body(float* x, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) store(x[i * ld + j], x[i * ld + j]);
}

// The cloned entry points, one per storage kind.
MESHMUON_ELEMENTWISE void scale_range(const float* in, float inv, uint16_t* out, int64_t b, int64_t e) {
  scale_body(in, inv, out, b, e);
}
MESHMUON_ELEMENTWISE void scale_range(const float* in, float inv, float* out, int64_t b, int64_t e) {
  scale_body(in, inv, out, b, e);
}
MESHMUON_ELEMENTWISE void mirror_blocks(uint16_t* a, int64_t s, int64_t b0, int64_t b1) { mirror_body(a, s, b0, b1); }
MESHMUON_ELEMENTWISE void mirror_blocks(float* a, int64_t s, int64_t b0, int64_t b1) { mirror_body(a, s, b0, b1); }
MESHMUON_ELEMENTWISE void lower_rows(int64_t s, const float* g, uint16_t* out, int64_t r0, int64_t r1) {
  lower_body(s, g, out, r0, r1);
}
MESHMUON_ELEMENTWISE void lower_rows(int64_t s, const float* g, float* out, int64_t r0, int64_t r1) {
  lower_body(s, g, out, r0, r1);
}
MESHMUON_ELEMENTWISE void polynomial_rows(int64_t s, const uint16_t* ab, const float* a2, float a, float b, float c,
                                       bool plain, uint16_t* z, int64_t r0, int64_t r1) {
  polynomial_body(s, ab, a2, a, b, c, plain, z, r0, r1);
}
MESHMUON_ELEMENTWISE void polynomial_rows(int64_t s, const float* ab, const float* a2, float a, float b, float c,
                                       bool plain, float* z, int64_t r0, int64_t r1) {
  polynomial_body(s, ab, a2, a, b, c, plain, z, r0, r1);
}
MESHMUON_ELEMENTWISE void round_block(float* x, int64_t rows, int64_t cols, int64_t ld) {
  round_block_body(x, rows, cols, ld);
}

// The passes over whole matrices, in parallel.
template <class T>
void scale_to(const float* in, float inv, T* out, int64_t rows, int64_t cols) {
  parallel_rows(rows, cols, [&](int64_t r0, int64_t r1) { scale_range(in, inv, out, r0 * cols, r1 * cols); });
}
template <class T>
void mirror(T* a, int64_t s) {
  parallel_rows((s + kTile - 1) / kTile, s * kTile / 2, [&](int64_t b0, int64_t b1) { mirror_blocks(a, s, b0, b1); });
}
// out = the symmetric matrix whose lower triangle is the fp32 G's, each entry rounded once. Reading
// only the lower triangle is what lets the products skip the upper blocks.
template <class T>
void lower_to_full(int64_t s, const float* g, T* out) {
  parallel_rows(s, s / 2, [&](int64_t r0, int64_t r1) { lower_rows(s, g, out, r0, r1); });
  mirror(out, s);
}
// Every entry of the s×s fp32 matrix rounded once.
template <class T>
void round_all(const float* g, T* out, int64_t s) {
  scale_to(g, 1.0f, out, s, s);
}
template <class T>
void polynomial(int64_t s, const T* ab, const float* a2, float a, float b, float c, bool plain, T* z) {
  parallel_rows(s, plain ? s : s / 2, [&](int64_t r0, int64_t r1) { polynomial_rows(s, ab, a2, a, b, c, plain, z, r0, r1); });
  if (!plain) mirror(z, s);
}

// The m×n matrix X seen from the Gram side: wide (m ≤ n) R = X·Xᵀ, tall R = Xᵀ·X.
struct GramSide {
  int64_t m, n, s, k;
  bool wide;
  GramSide(int64_t m_, int64_t n_) : m(m_), n(n_), s(std::min(m_, n_)), k(std::max(m_, n_)), wide(m_ <= n_) {}
};

// oneDNN on bf16 bits. Symmetric results on their lower block triangle (Bf16Matmul::lower_product).
struct OneDnnEngine {
  using T = uint16_t;
  Bf16Matmul& mm;
  static const BFloat16* bf(const T* p) { return reinterpret_cast<const BFloat16*>(p); }
  // r = X·Xᵀ (wide) or Xᵀ·X (tall) in fp32: its lower triangle, or in full when plain.
  void gram(const GramSide& g, const T* x, bool plain, float* r) {
    mm.lower_product(g.s, g.k, {bf(x), g.n, !g.wide}, {bf(x), g.n, g.wide}, r, plain);
  }
  // c = A² for the symmetric s×s A: its lower triangle in fp32 (in full when plain).
  void square(int64_t s, const T* a, bool plain, float* c) { mm.lower_product(s, s, {bf(a), s}, {bf(a), s}, c, plain); }
  // dst = Z·X (wide) or X·Z (tall): rounded to bf16, or fp32 for the last step.
  template <class Out>
  void apply(const GramSide& g, const T* z, const T* x, Out* dst) {
    if (g.wide)
      mm.gemm(g.m, g.n, g.m, {bf(z), g.s}, {bf(x), g.n}, out(dst), g.n);
    else
      mm.gemm(g.m, g.n, g.n, {bf(x), g.n}, {bf(z), g.s}, out(dst), g.n);
  }
  static BFloat16* out(uint16_t* p) { return reinterpret_cast<BFloat16*>(p); }
  static float* out(float* p) { return p; }
};

// meshmuon's widened products: bf16 values stored as fp32, fp32 products (products.h).
struct WidenedEngine {
  using T = float;
  void gram(const GramSide& g, const T* x, bool plain, float* r) {
    const int s = static_cast<int>(g.s), k = static_cast<int>(g.k), ld = static_cast<int>(g.n);
    if (plain)
      sgemm(!g.wide, g.wide, s, s, k, 1.0f, x, ld, x, ld, 0.0f, r, s);
    else
      ssyrk_lower(!g.wide, s, k, 1.0f, x, ld, 0.0f, r, s);
  }
  void square(int64_t s64, const T* a, bool plain, float* c) {
    const int s = static_cast<int>(s64);
    if (plain)
      sgemm(false, false, s, s, s, 1.0f, a, s, a, s, 0.0f, c, s);
    else
      ssyrk_lower(false, s, s, 1.0f, a, s, 0.0f, c, s);  // A symmetric: A·Aᵀ = A²
  }
  // `round`: each tile of the result rounded to bf16 values as it is finished (while in cache).
  void apply(const GramSide& g, const T* z, const T* x, float* dst, bool round) {
    const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), s = static_cast<int>(g.s);
    const TileEpilogue rounding = [dst, n](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
      round_block(dst + r0 * n + c0, r1 - r0, c1 - c0, n);
    };
    const TileEpilogue* epilogue = round ? &rounding : nullptr;
    if (g.wide)
      sgemm(false, false, m, n, m, 1.0f, z, s, x, n, 0.0f, dst, n, epilogue);
    else
      sgemm(false, false, m, n, n, 1.0f, x, n, z, s, 0.0f, dst, n, epilogue);
  }
};

// Per step: A = bf16(X·Xᵀ), A², Z = aI + bA + cA², X ← Z·X (bf16 between steps, fp32 at the end).
template <class Engine>
void iterate(Engine& e, const float* in, float inv, float* out, const GramSide& g,
             const std::vector<Coefficients>& coefficients, bool plain, typename Engine::T* x,
             typename Engine::T* x2, float* r, float* sq, typename Engine::T* rb, typename Engine::T* zb) {
  scale_to(in, inv, x, g.m, g.n);  // `in` is read only here
  const int steps = static_cast<int>(coefficients.size());
  for (int step = 0; step < steps; ++step) {
    const Coefficients& k = coefficients[static_cast<size_t>(step)];
    e.gram(g, x, plain, r);
    if (plain)
      round_all(r, rb, g.s);
    else
      lower_to_full(g.s, r, rb);
    e.square(g.s, rb, plain, sq);  // A² (fp32 only: it feeds the polynomial)
    polynomial(g.s, rb, sq, static_cast<float>(k.a), static_cast<float>(k.b), static_cast<float>(k.c), plain, zb);
    const bool last = step == steps - 1;
    if constexpr (std::is_same_v<Engine, WidenedEngine>) {
      e.apply(g, zb, x, last ? out : x2, !last);
    } else if (last) {
      e.apply(g, zb, x, out);
    } else {
      e.apply(g, zb, x, x2);
    }
    if (!last) std::swap(x, x2);
  }
}

}  // namespace

void newton_schulz_bf16_products(const float* in, float inv, float* out, int64_t m, int64_t n,
                                 const std::vector<Coefficients>& coefficients, bool plain,
                                 int threads, NsScratch& sc) {
  const GramSide g(m, n);
  const int64_t mn = m * n, ss = g.s * g.s;
  float* r = sc.ensure(sc.r, ss);
  float* sq = sc.ensure(sc.s, ss);
  note_bf16_product_run(sc.bf16_path);
  if (sc.bf16_path == Bf16ProductPath::Widened) {
    WidenedEngine e;
    iterate(e, in, inv, out, g, coefficients, plain, sc.ensure(sc.x, mn), sc.ensure(sc.x2, mn), r, sq,
            sc.ensure(sc.z, ss), sc.ensure(sc.q, ss));
    return;
  }
  if (!sc.matmul) sc.matmul = std::make_unique<Bf16Matmul>();
  Bf16Matmul& mm = *sc.matmul;
  struct ThreadsGuard {  // the caller's OpenMP thread count is restored on every exit
    Bf16Matmul& mm;
    int previous;
    ~ThreadsGuard() { mm.set_threads(previous); }
  } guard{mm, mm.set_threads(threads)};
  OneDnnEngine e{mm};
  const auto bits = [](std::vector<BFloat16>& v) { return reinterpret_cast<uint16_t*>(v.data()); };
  sc.ensure(sc.xb, mn), sc.ensure(sc.xb2, mn), sc.ensure(sc.rb, ss), sc.ensure(sc.zb, ss);
  iterate(e, in, inv, out, g, coefficients, plain, bits(sc.xb), bits(sc.xb2), r, sq, bits(sc.rb), bits(sc.zb));
}

}  // namespace meshmuon::cpu
