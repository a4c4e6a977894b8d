// The emulated cuBLASLt (tests/cuda_emu, README.md there): the entry points of
// src/backend/cuda/batched_gemm.cpp's loader, exported under cuBLASLt's names from this library,
// which the emulated tests name in MESHMUON_CUBLASLT_LIBRARY. Products as the emulated cuBLAS's
// (gemm_host.h), one per matrix of a strided batch, queued on the call's stream.
//
// What it checks, as cuBLASLt would: descriptors made by it; the attributes meshmuon sets, with their
// sizes; types (bf16 or fp32 A and B, fp32 C = D, fp32 compute and scale); that the layouts agree
// with the transposes and sizes (INVALID_VALUE); an algorithm from its own heuristic, for these
// descriptors' shape (not batch count), whose alignments the operands meet; the workspace the
// algorithm asked for; every matrix of every operand inside one live device allocation.
//
// MESHMUON_CUDA_EMU_LT_BATCH_VARIANT=1 makes a strided-batched call (batch count > 1) sum each product
// in another order than a batch-1 call (the inner dimension in two halves), as an algorithm whose
// work split depends on the batch could: bitwise layout invariance then rests on meshmuon's probe
// (batched_gemm.h), which must find the difference and run such batches matrix by matrix.
#include <cublasLt.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "device_memory.h"
#include "gemm_host.h"
#include "streams.h"

struct cublasLtContext {
  int magic = 0x17B1;
};

namespace {

using namespace meshmuon::cuda_emu;

constexpr uint64_t kDescMagic = 0xDE5C, kLayoutMagic = 0x1A70, kPrefMagic = 0x9EF0, kAlgoMagic = 0xA160;
constexpr size_t kAlgoWorkspace = size_t{1} << 20;  // what every emulated algorithm asks for

struct Desc {
  uint64_t magic;
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t ta, tb;
};
struct Layout {
  uint64_t magic;
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch;
  int64_t stride;
};
struct Pref {
  uint64_t magic;
  uint64_t max_workspace;
  uint32_t align[4];  // A, B, C, D
};
// The algorithm: the shape it was chosen for and the alignments it needs.
struct Algo {
  uint64_t magic;
  int32_t ta, tb;
  uint32_t m, n, k;
  int32_t lda, ldb, ldd;
  uint32_t align[4];
};
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(Pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t));
static_assert(sizeof(Algo) <= sizeof(cublasLtMatmulAlgo_t));

template <class T, class O>
T* as(O* o, uint64_t magic) {
  if (o == nullptr) return nullptr;
  T* t = reinterpret_cast<T*>(o->data);
  return t->magic == magic ? t : nullptr;
}

bool batch_variant() {
  static const bool on = [] {
    const char* e = std::getenv("MESHMUON_CUDA_EMU_LT_BATCH_VARIANT");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }();
  return on;
}

bool type_ok(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }
size_t elem(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

// The shape of a matmul from its descriptors, checked: op(A) m×k, op(B) k×n, C = D m×n.
struct Shape {
  const Desc* op;
  const Layout *a, *b, *c, *d;
  uint64_t m, n, k;
};
cublasStatus_t shape_of(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t A,
                        cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, Shape& s) {
  if (h == nullptr || h->magic != 0x17B1) return CUBLAS_STATUS_NOT_INITIALIZED;
  s.op = as<Desc>(desc, kDescMagic);
  s.a = as<Layout>(A, kLayoutMagic), s.b = as<Layout>(B, kLayoutMagic);
  s.c = as<Layout>(C, kLayoutMagic), s.d = as<Layout>(D, kLayoutMagic);
  if (!s.op || !s.a || !s.b || !s.c || !s.d) return CUBLAS_STATUS_INVALID_VALUE;
  if ((s.op->compute != CUBLAS_COMPUTE_32F && s.op->compute != CUBLAS_COMPUTE_32F_PEDANTIC) || s.op->scale != CUDA_R_32F ||
      !type_ok(s.a->type) || s.a->type != s.b->type || s.c->type != CUDA_R_32F || s.d->type != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool ta = s.op->ta == CUBLAS_OP_T, tb = s.op->tb == CUBLAS_OP_T;
  s.m = s.d->rows, s.n = s.d->cols;
  s.k = ta ? s.a->rows : s.a->cols;
  const uint64_t a_m = ta ? s.a->cols : s.a->rows, b_k = tb ? s.b->cols : s.b->rows, b_n = tb ? s.b->rows : s.b->cols;
  const auto ld_ok = [](const Layout* l) { return l->ld >= static_cast<int64_t>(l->rows > 0 ? l->rows : 1); };
  const bool same_cd = s.c->rows == s.d->rows && s.c->cols == s.d->cols && s.c->ld == s.d->ld &&
                       s.c->batch == s.d->batch && s.c->stride == s.d->stride;
  if (a_m != s.m || b_k != s.k || b_n != s.n || !same_cd || !ld_ok(s.a) || !ld_ok(s.b) || !ld_ok(s.d) ||
      s.a->batch != s.d->batch || s.b->batch != s.d->batch || s.d->batch < 1) {
    std::fprintf(stderr, "[cuda_emu] cublasLt: descriptors disagree (m %llu n %llu k %llu)\n",
                 static_cast<unsigned long long>(s.m), static_cast<unsigned long long>(s.n),
                 static_cast<unsigned long long>(s.k));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

bool algo_fits(const Algo& g, const Shape& s) {
  return g.magic == kAlgoMagic && g.ta == s.op->ta && g.tb == s.op->tb && g.m == s.m && g.n == s.n && g.k == s.k &&
         g.lda == s.a->ld && g.ldb == s.b->ld && g.ldd == s.d->ld;
}

// Every matrix of the batch inside one allocation, at the algorithm's alignment.
bool operand_ok(const void* p, const Layout* l, uint32_t align, const char* name) {
  if (reinterpret_cast<uintptr_t>(p) % align != 0 || (l->batch > 1 && l->stride * static_cast<int64_t>(elem(l->type)) % align != 0)) {
    std::fprintf(stderr, "[cuda_emu] cublasLtMatmul operand %s: not aligned to the algorithm's %u bytes\n", name, align);
    return fail_access("cublasLtMatmul: misaligned operand (the algorithm's requirement)");
  }
  const size_t one = gemm_span(static_cast<int64_t>(l->rows), static_cast<int64_t>(l->cols), l->ld, elem(l->type));
  const size_t all = one == 0 ? 0 : static_cast<size_t>(l->batch - 1) * static_cast<size_t>(l->stride) * elem(l->type) + one;
  return gemm_operand_ok(p, all, elem(l->type), "cublasLtMatmul", name);
}

}  // namespace

extern "C" {

#define EMU_API __attribute__((visibility("default")))

EMU_API cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (h == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasLtContext;
  count_made(Made::BlasHandle);
  return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (h == nullptr || h->magic != 0x17B1) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->magic = 0;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

EMU_API cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                                cudaDataType_t scale) {
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  count_made(Made::LtDescriptor);
  *d = new cublasLtMatmulDescOpaque_t{};
  new ((*d)->data) Desc{kDescMagic, compute, scale, CUBLAS_OP_N, CUBLAS_OP_N};
  return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  if (!as<Desc>(d, kDescMagic)) return CUBLAS_STATUS_INVALID_VALUE;
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                      const void* buf, size_t bytes) {
  Desc* x = as<Desc>(d, kDescMagic);
  if (x == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr != CUBLASLT_MATMUL_DESC_TRANSA && attr != CUBLASLT_MATMUL_DESC_TRANSB) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (bytes != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
  int32_t v;
  std::memcpy(&v, buf, sizeof v);
  if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
  (attr == CUBLASLT_MATMUL_DESC_TRANSA ? x->ta : x->tb) = v;
  return CUBLAS_STATUS_SUCCESS;
}

EMU_API cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows,
                                                  uint64_t cols, int64_t ld) {
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *l = new cublasLtMatrixLayoutOpaque_t{};
  new ((*l)->data) Layout{kLayoutMagic, type, rows, cols, ld, 1, 0};
  return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  if (!as<Layout>(l, kLayoutMagic)) return CUBLAS_STATUS_INVALID_VALUE;
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                        const void* buf, size_t bytes) {
  Layout* x = as<Layout>(l, kLayoutMagic);
  if (x == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) {
    if (bytes != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&x->batch, buf, bytes);
    return x->batch >= 1 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
  }
  if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) {
    if (bytes != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&x->stride, buf, bytes);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

EMU_API cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *p = new cublasLtMatmulPreferenceOpaque_t{};
  new ((*p)->data) Pref{kPrefMagic, 0, {256, 256, 256, 256}};
  return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  if (!as<Pref>(p, kPrefMagic)) return CUBLAS_STATUS_INVALID_VALUE;
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
EMU_API cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                            cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                            size_t bytes) {
  Pref* x = as<Pref>(p, kPrefMagic);
  if (x == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      if (bytes != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&x->max_workspace, buf, bytes);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:  // the emulation never splits K
      return bytes == sizeof(uint32_t) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
      if (bytes != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      uint32_t v;
      std::memcpy(&v, buf, bytes);
      x->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = v;
      return CUBLAS_STATUS_SUCCESS;
    }
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

// One algorithm, needing the alignments the preference allows (at most 16 bytes, as vectorized
// loads would) and 1 MiB of workspace; none when the preference allows less workspace.
EMU_API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                                                      cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                                      cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                                      cublasLtMatmulPreference_t pref, int requested,
                                                      cublasLtMatmulHeuristicResult_t results[], int* found) {
  Shape s{};
  if (const cublasStatus_t st = shape_of(h, desc, A, B, C, D, s); st != CUBLAS_STATUS_SUCCESS) return st;
  const Pref* p = as<Pref>(pref, kPrefMagic);
  if (p == nullptr || requested < 1 || results == nullptr || found == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *found = 0;
  if (p->max_workspace < kAlgoWorkspace) return CUBLAS_STATUS_NOT_SUPPORTED;
  Algo g{kAlgoMagic, s.op->ta, s.op->tb, static_cast<uint32_t>(s.m), static_cast<uint32_t>(s.n),
         static_cast<uint32_t>(s.k), static_cast<int32_t>(s.a->ld), static_cast<int32_t>(s.b->ld),
         static_cast<int32_t>(s.d->ld), {}};
  for (int i = 0; i < 4; ++i) g.align[i] = p->align[i] < 16 ? p->align[i] : 16;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  std::memcpy(results[0].algo.data, &g, sizeof g);
  results[0].workspaceSize = kAlgoWorkspace;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

EMU_API cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t A,
                                               cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                                               cublasLtMatrixLayout_t D, const cublasLtMatmulAlgo_t* algo,
                                               cublasLtMatmulHeuristicResult_t* result) {
  Shape s{};
  if (const cublasStatus_t st = shape_of(h, desc, A, B, C, D, s); st != CUBLAS_STATUS_SUCCESS) return st;
  if (algo == nullptr || result == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Algo g;
  std::memcpy(&g, algo->data, sizeof g);
  if (!algo_fits(g, s)) return CUBLAS_STATUS_INVALID_VALUE;
  *result = cublasLtMatmulHeuristicResult_t{};
  result->workspaceSize = kAlgoWorkspace;
  result->state = CUBLAS_STATUS_SUCCESS;
  return CUBLAS_STATUS_SUCCESS;
}

EMU_API cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                                      cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                                      const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                                      cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream) {
  Shape s{};
  if (const cublasStatus_t st = shape_of(h, desc, Adesc, Bdesc, Cdesc, Ddesc, s); st != CUBLAS_STATUS_SUCCESS) return st;
  if (alpha == nullptr || beta == nullptr || algo == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Algo g;
  std::memcpy(&g, algo->data, sizeof g);
  if (!algo_fits(g, s)) {
    std::fprintf(stderr, "[cuda_emu] cublasLtMatmul: the algorithm was chosen for another shape\n");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (workspace_bytes < kAlgoWorkspace) return CUBLAS_STATUS_INVALID_VALUE;
  if (!expect_device(workspace, kAlgoWorkspace, "cublasLtMatmul workspace")) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (C != D) return CUBLAS_STATUS_NOT_SUPPORTED;  // the emulation runs in place only, as meshmuon calls it
  float alpha_v, beta_v;
  std::memcpy(&alpha_v, alpha, 4), std::memcpy(&beta_v, beta, 4);
  if (s.m == 0 || s.n == 0) return CUBLAS_STATUS_SUCCESS;
  if ((s.k > 0 && alpha_v != 0.0f && (!operand_ok(A, s.a, g.align[0], "A") || !operand_ok(B, s.b, g.align[1], "B"))) ||
      !operand_ok(D, s.d, g.align[3], "D"))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  const Layout a = *s.a, b = *s.b, d = *s.d;
  const bool ta = s.op->ta == CUBLAS_OP_T, tb = s.op->tb == CUBLAS_OP_T;
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  const bool split = batch_variant() && d.batch > 1 && k > 1;
  submit(stream, [=] {
    DeviceScope scope;
    for (int32_t i = 0; i < d.batch; ++i) {
      const auto* ai = static_cast<const std::byte*>(A) + static_cast<size_t>(i) * static_cast<size_t>(a.stride) * elem(a.type);
      const auto* bi = static_cast<const std::byte*>(B) + static_cast<size_t>(i) * static_cast<size_t>(b.stride) * elem(b.type);
      float* di = static_cast<float*>(D) + static_cast<size_t>(i) * static_cast<size_t>(d.stride);
      if (!split) {
        host_gemm(ta, tb, m, n, k, alpha_v, ai, a.type, a.ld, bi, b.type, b.ld, beta_v, di, d.ld);
        continue;
      }
      // The inner dimension in two halves: op(A)[:, 0:h]·op(B)[0:h, :] then the rest added.
      const int half = k / 2;
      const size_t ea = elem(a.type), eb = elem(b.type);
      const auto* a2 = ai + (ta ? static_cast<size_t>(half) : static_cast<size_t>(half) * static_cast<size_t>(a.ld)) * ea;
      const auto* b2 = bi + (tb ? static_cast<size_t>(half) * static_cast<size_t>(b.ld) : static_cast<size_t>(half)) * eb;
      host_gemm(ta, tb, m, n, half, alpha_v, ai, a.type, a.ld, bi, b.type, b.ld, beta_v, di, d.ld);
      host_gemm(ta, tb, m, n, k - half, alpha_v, a2, a.type, a.ld, b2, b.type, b.ld, 1.0f, di, d.ld);
    }
    return true;
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
