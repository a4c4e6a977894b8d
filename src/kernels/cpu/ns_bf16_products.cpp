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
#include <algorithm>
#include <bit>
#include <cstdint>
#include <utility>

#include "dmuon/bf16.h"
#include "kernels/cpu/ns_kernels.h"

// The element-wise passes get an AVX-512 clone next to the generic one (picked at load time);
// -ffp-contract=off (CMakeLists) keeps both clones' arithmetic identical.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DMUON_ELEMENTWISE __attribute__((target_clones("avx512f", "default")))
#else
#define DMUON_ELEMENTWISE
#endif

namespace dmuon::cpu {
namespace {

// The m×n matrix X (bf16, row-major) seen from the Gram side: wide (m ≤ n) R = X·Xᵀ, tall R = Xᵀ·X.
struct GramSide {
  int64_t m, n, s, k;
  bool wide;
  GramSide(int64_t m_, int64_t n_) : m(m_), n(n_), s(std::min(m_, n_)), k(std::max(m_, n_)), wide(m_ <= n_) {}
  Bf16Operand left(const BFloat16* x) const { return {x, n, !wide}; }   // s×k
  Bf16Operand right(const BFloat16* x) const { return {x, n, wide}; }   // k×s
};

void to_bf16(const float* src, BFloat16* dst, int64_t count) {
  float_to_bf16(src, dst, static_cast<size_t>(count));
}


constexpr int64_t kTile = 32;  // tile of the bf16 mirror: its row and column writes stay in cache

// Branch-free fp32 -> bf16 (the numerics of float_to_bf16 in bf16.h: nearest even, NaN -> 0x7FC0),
// written so that the row loops below vectorize.
inline uint16_t bf16_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

// out = bf16(in · inv), element by element.
DMUON_ELEMENTWISE void scale_to_bf16(const float* __restrict in, float inv, BFloat16* __restrict x,
                                     int64_t count) {
  auto* out = reinterpret_cast<uint16_t*>(x);
  for (int64_t i = 0; i < count; ++i) out[i] = bf16_bits(in[i] * inv);
}

// Copies the lower triangle of the s×s bf16 matrix onto its upper triangle, tile by tile.
DMUON_ELEMENTWISE void mirror_lower_bf16(uint16_t* a, int64_t s) {
  for (int64_t ib = 0; ib < s; ib += kTile)
    for (int64_t jb = 0; jb <= ib; jb += kTile)
      for (int64_t j = jb; j < std::min(jb + kTile, s); ++j) {
        uint16_t* dst = a + j * s;
        for (int64_t i = std::max(ib, j + 1); i < std::min(ib + kTile, s); ++i) dst[i] = a[i * s + j];
      }
}

inline float bf16_value(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

// full (s×s bf16) = the symmetric matrix whose lower triangle is the fp32 G's, each entry rounded
// once. Reading only the lower triangle is what lets the products skip the upper blocks.
DMUON_ELEMENTWISE void lower_to_full_bf16(int64_t s, const float* g, BFloat16* full) {
  auto* out = reinterpret_cast<uint16_t*>(full);
  for (int64_t i = 0; i < s; ++i) {
    const float* gi = g + i * s;
    uint16_t* oi = out + i * s;
    for (int64_t j = 0; j <= i; ++j) oi[j] = bf16_bits(gi[j]);
  }
  mirror_lower_bf16(out, s);
}

// zb = bf16(a·I + b·A + c·A2), A the bf16 matrix `ab` (full, symmetric), A2 fp32: the lower
// triangle then a mirror (plain: every entry, no mirror), each entry rounded once.
DMUON_ELEMENTWISE void polynomial_to_bf16(int64_t s, const BFloat16* ab, const float* a2, float a,
                                          float b, float c, bool plain, BFloat16* zb) {
  const auto* in = reinterpret_cast<const uint16_t*>(ab);
  auto* out = reinterpret_cast<uint16_t*>(zb);
  for (int64_t i = 0; i < s; ++i) {
    const uint16_t* ai = in + i * s;
    const float* a2i = a2 + i * s;
    uint16_t* oi = out + i * s;
    const int64_t end = plain ? s : i + 1;
    for (int64_t j = 0; j < end; ++j) oi[j] = bf16_bits(b * bf16_value(ai[j]) + c * a2i[j]);
    oi[i] = bf16_bits(b * bf16_value(ai[i]) + c * a2i[i] + a);
  }
  if (!plain) mirror_lower_bf16(out, s);
}

// R = X·Xᵀ (wide) or Xᵀ·X (tall): fp32 into r (lower triangle, or full when plain), then its full
// bf16 copy into rb, the only form of R that is used.
void gram_bf16(Bf16Matmul& mm, const GramSide& g, const BFloat16* x, bool plain, float* r,
               BFloat16* rb) {
  mm.lower_product(g.s, g.k, g.left(x), g.right(x), r, plain);
  if (plain) return to_bf16(r, rb, g.s * g.s);
  lower_to_full_bf16(g.s, r, rb);
}

// c = A² for the s×s symmetric A (bf16): its lower triangle in fp32 (in full when plain).
void square_symmetric(Bf16Matmul& mm, int64_t s, const BFloat16* a, bool plain, float* c) {
  mm.lower_product(s, s, {a, s}, {a, s}, c, plain);
}

// zb = bf16(a·I + b·A + c·A2) from the bf16 A (rb) and the fp32 A2 (lower triangle, full when plain).
void polynomial_bf16(const Coefficients& k, int64_t s, const BFloat16* ab, const float* a2, bool plain,
                     BFloat16* zb) {
  polynomial_to_bf16(s, ab, a2, static_cast<float>(k.a), static_cast<float>(k.b),
                     static_cast<float>(k.c), plain, zb);
}

// dst = Z·X (wide) or X·Z (tall), fp32 or bf16 output.
template <class Out>
void apply_factor(Bf16Matmul& mm, const GramSide& g, const BFloat16* z, const BFloat16* x, Out* dst) {
  if (g.wide)
    mm.gemm(g.m, g.n, g.m, {z, g.s}, {x, g.n}, dst, g.n);
  else
    mm.gemm(g.m, g.n, g.n, {x, g.n}, {z, g.s}, dst, g.n);
}

}  // namespace

void newton_schulz_bf16_products(const float* in, float inv, float* out, int64_t m, int64_t n,
                                 const std::vector<Coefficients>& coefficients, bool plain,
                                 int threads, NsScratch& sc) {
  if (!sc.matmul) sc.matmul = std::make_unique<Bf16Matmul>();
  Bf16Matmul& mm = *sc.matmul;
  struct ThreadsGuard {  // the caller's OpenMP thread count is restored on every exit
    Bf16Matmul& mm;
    int previous;
    ~ThreadsGuard() { mm.set_threads(previous); }
  } guard{mm, mm.set_threads(threads)};
  const GramSide g(m, n);
  const int64_t mn = m * n, ss = g.s * g.s;
  BFloat16* x = sc.ensure(sc.xb, mn);
  BFloat16* x2 = sc.ensure(sc.xb2, mn);
  float* r = sc.ensure(sc.r, ss);
  float* sq = sc.ensure(sc.s, ss);
  BFloat16* rb = sc.ensure(sc.rb, ss);
  BFloat16* zb = sc.ensure(sc.zb, ss);
  scale_to_bf16(in, inv, x, mn);  // `in` is read only here
  const int steps = static_cast<int>(coefficients.size());

  // Per step: A = bf16(X·Xᵀ), A², Z = aI + bA + cA², X ← Z·X (bf16 between steps, fp32 at the end).
  for (int step = 0; step < steps; ++step) {
    gram_bf16(mm, g, x, plain, r, rb);
    square_symmetric(mm, g.s, rb, plain, sq);  // A² (fp32 only: it feeds the polynomial)
    polynomial_bf16(coefficients[static_cast<size_t>(step)], g.s, rb, sq, plain, zb);
    if (step == steps - 1) {
      apply_factor(mm, g, zb, x, out);
    } else {
      apply_factor(mm, g, zb, x, x2);
      std::swap(x, x2);
    }
  }
}

}  // namespace dmuon::cpu
