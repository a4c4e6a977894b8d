// Internal: batched products with layout-invariant bits (batched_gemm.h).
#include "backend/cuda/batched_gemm.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "backend/cuda/cublas_loader.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/dl_symbol.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {
namespace {

// ---- cuBLASLt, loaded at run time ------------------------------------------------------------------

struct CublasLt {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatrixLayoutSetAttribute) layout_set = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmulAlgoCheck) algo_check = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

// Required, like cuBLAS (the same nvidia-cublas package): a rank that ran its bf16 products another
// way would compute other bits than its peers, so a missing cuBLASLt is an error, not a fallback.
// Only the soname of cuBLAS 13 (another version could choose other algorithms).
CublasLt load_lt() {
  CublasLt api;
  open_cublas_family("MESHMUON_CUBLASLT_LIBRARY", "libcublasLt.so.13", "cuBLASLt (bf16 Newton–Schulz products)",
                     "missing cublasLt entry points", [&api](void* h, const char*) {
                       return bind_symbol(h, "cublasLtCreate", api.create) && bind_symbol(h, "cublasLtDestroy", api.destroy) &&
                              bind_symbol(h, "cublasLtMatmulDescCreate", api.desc_create) &&
                              bind_symbol(h, "cublasLtMatmulDescDestroy", api.desc_destroy) &&
                              bind_symbol(h, "cublasLtMatmulDescSetAttribute", api.desc_set) &&
                              bind_symbol(h, "cublasLtMatrixLayoutCreate", api.layout_create) &&
                              bind_symbol(h, "cublasLtMatrixLayoutDestroy", api.layout_destroy) &&
                              bind_symbol(h, "cublasLtMatrixLayoutSetAttribute", api.layout_set) &&
                              bind_symbol(h, "cublasLtMatmulPreferenceCreate", api.pref_create) &&
                              bind_symbol(h, "cublasLtMatmulPreferenceDestroy", api.pref_destroy) &&
                              bind_symbol(h, "cublasLtMatmulPreferenceSetAttribute", api.pref_set) &&
                              bind_symbol(h, "cublasLtMatmulAlgoGetHeuristic", api.heuristic) &&
                              bind_symbol(h, "cublasLtMatmulAlgoCheck", api.algo_check) &&
                              bind_symbol(h, "cublasLtMatmul", api.matmul);
                     });
  return api;
}

const CublasLt& lt() {
  static const CublasLt api = load_lt();
  return api;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_error(concat("[cuda] ", what, ": ", cudaGetErrorString(e)));
}

// The workspace every algorithm is chosen for (cuBLAS's recommendation for Hopper): a constant, so
// the choice does not depend on memory that happens to be free. A thread allocates what its
// algorithms ask for, up to this.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// The descriptors of one cublasLtMatmul (batch count and strides set on the layouts): host objects
// that name no pointer, so one set serves every call of its shape (ThreadLt keeps them).
class Descriptors {
 public:
  Descriptors(const GemmCall& c, int64_t batch) {
    const CublasLt& api = lt();
    check_blas(api.desc_create(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const int32_t ta = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_blas(api.desc_set(op_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "cublasLtMatmulDescSetAttribute");
    check_blas(api.desc_set(op_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "cublasLtMatmulDescSetAttribute");
    layout(&a_, CUDA_R_16BF, c.ta ? c.k : c.m, c.ta ? c.m : c.k, c.lda, batch, c.stride_a);
    layout(&b_, CUDA_R_16BF, c.tb ? c.n : c.k, c.tb ? c.k : c.n, c.ldb, batch, c.stride_b);
    layout(&d_, CUDA_R_32F, c.m, c.n, c.ldd, batch, c.stride_d);
  }
  ~Descriptors() {
    const CublasLt& api = lt();
    for (cublasLtMatrixLayout_t l : {a_, b_, d_})
      if (l != nullptr) (void)api.layout_destroy(l);
    if (op_ != nullptr) (void)api.desc_destroy(op_);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;  // C is D (beta 0)

 private:
  static void layout(cublasLtMatrixLayout_t* l, cudaDataType t, int rows, int cols, int ld, int64_t batch,
                     int64_t stride) {
    const CublasLt& api = lt();
    check_blas(api.layout_create(l, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
               "cublasLtMatrixLayoutCreate");
    if (batch == 1) return;
    const int32_t count = static_cast<int32_t>(batch);
    check_blas(api.layout_set(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
               "cublasLtMatrixLayoutSetAttribute");
    check_blas(api.layout_set(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
               "cublasLtMatrixLayoutSetAttribute");
  }
};

// The calling thread's cuBLASLt handle and workspace per device, and its descriptors, freed when the
// thread ends.
struct ThreadLt {
  struct OnDevice {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    bool legacy = false;  // the workspace was used on the legacy stream
    // At least `bytes` of workspace, on `stream` (a thread's cuBLASLt calls run on one stream: its
    // compute jobs'). A growth is stream-ordered: the old block goes once that stream's earlier
    // products have run (cudaFree would wait for the whole device).
    void* workspace_for(size_t bytes, cudaStream_t stream) {
      if (bytes > workspace_bytes) {
        if (workspace != nullptr) check(cudaFreeAsync(workspace, stream), "cudaFreeAsync (cuBLASLt workspace)");
        workspace = nullptr, workspace_bytes = 0;
        check(cudaMallocAsync(&workspace, bytes, stream), "cudaMallocAsync (cuBLASLt workspace)");
        workspace_bytes = bytes;
      }
      legacy = legacy || stream == nullptr;
      return workspace;
    }
  };
  std::vector<OnDevice> devices;
  // Per call shape and batch layout: (ta, tb, m, n, k, lda, ldb, ldd, batch, stride a, b, d). A step
  // meets a handful; a process that keeps meeting new ones starts over past kMaxDescriptors.
  using DescKey = std::tuple<bool, bool, int, int, int, int, int, int, int64_t, int64_t, int64_t, int64_t>;
  static constexpr size_t kMaxDescriptors = 512;
  std::map<DescKey, std::unique_ptr<Descriptors>> descriptors;
  const Descriptors& descriptors_for(const GemmCall& c, int64_t batch) {
    const DescKey key{c.ta, c.tb, c.m, c.n, c.k, c.lda, c.ldb, c.ldd, batch,
                      batch == 1 ? 0 : c.stride_a, batch == 1 ? 0 : c.stride_b, batch == 1 ? 0 : c.stride_d};
    auto it = descriptors.find(key);
    if (it != descriptors.end()) return *it->second;
    if (descriptors.size() >= kMaxDescriptors) descriptors.clear();
    return *descriptors.emplace(key, std::make_unique<Descriptors>(c, batch)).first->second;
  }
  ~ThreadLt() {
    descriptors.clear();
    for (size_t d = 0; d < devices.size(); ++d) {
      OnDevice& r = devices[d];
      if (r.handle == nullptr && r.workspace == nullptr) continue;
      if (cudaSetDevice(static_cast<int>(d)) != cudaSuccess) continue;
      if (r.legacy) (void)cudaStreamSynchronize(nullptr);  // as ThreadResources (thread_resources.cpp)
      if (r.handle != nullptr) (void)lt().destroy(r.handle);
      if (r.workspace != nullptr) (void)cudaFree(r.workspace);
    }
  }
  OnDevice& on(int device) {
    if (static_cast<int>(devices.size()) <= device) devices.resize(static_cast<size_t>(device) + 1);
    OnDevice& r = devices[static_cast<size_t>(device)];
    if (r.handle == nullptr) check_blas(lt().create(&r.handle), "cublasLtCreate");
    return r;
  }
};
thread_local ThreadLt tl_lt;

// ---- the plans ---------------------------------------------------------------------------------------

uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// A call shape: what the algorithm is chosen for (never the batch count or the strides).
struct Key {
  int device;
  bool ta, tb;
  int m, n, k, lda, ldb, ldd;
  uint32_t align_a, align_b, align_d;
  auto tie() const { return std::tie(device, ta, tb, m, n, k, lda, ldb, ldd, align_a, align_b, align_d); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Plan {
  bool has_algo = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  // Per (batch count, strides of A, B, D): cublasLtMatmulAlgoCheck and the probe passed, and the
  // workspace the batched call needs.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::pair<bool, size_t>> batch_ok;
};

std::mutex plans_mutex;
std::map<Key, Plan> plans;  // process-wide: every thread runs a shape with the same algorithm

std::atomic<bool> probe_on{true};
std::atomic<uint64_t> n_batched{0}, n_single{0}, n_gemm_ex{0}, n_probes{0}, n_probe_mismatch{0};

// The algorithm of a shape: the heuristic's first at batch 1, no split-K, the fixed workspace, the
// operands' alignments.
Plan choose(const GemmCall& c, const Key& key, cublasLtHandle_t handle) {
  const CublasLt& api = lt();
  Plan plan;
  const Descriptors desc(c, 1);
  cublasLtMatmulPreference_t pref = nullptr;
  check_blas(api.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { (void)lt().pref_destroy(p); }
  } guard{pref};
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t no_split = CUBLASLT_REDUCTION_SCHEME_NONE;
  check_blas(api.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "cublasLtMatmulPreferenceSetAttribute");
  check_blas(api.pref_set(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_split, sizeof no_split),
             "cublasLtMatmulPreferenceSetAttribute");
  check_blas(api.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a, sizeof key.align_a),
             "cublasLtMatmulPreferenceSetAttribute");
  check_blas(api.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b, sizeof key.align_b),
             "cublasLtMatmulPreferenceSetAttribute");
  check_blas(api.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_d, sizeof key.align_d),
             "cublasLtMatmulPreferenceSetAttribute");
  check_blas(api.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_d, sizeof key.align_d),
             "cublasLtMatmulPreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s =
      api.heuristic(handle, desc.op_, desc.a_, desc.b_, desc.d_, desc.d_, pref, 1, &result, &found);
  if (s == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS &&
      result.workspaceSize <= kWorkspaceBytes) {
    plan.has_algo = true;
    plan.algo = result.algo;
    plan.workspace = result.workspaceSize;
  }
  return plan;
}

void lt_matmul(const GemmCall& c, int64_t batch, const cublasLtMatmulAlgo_t& algo, ThreadLt::OnDevice& res,
               size_t workspace, cudaStream_t stream, const char* what) {
  const Descriptors& desc = tl_lt.descriptors_for(c, batch);
  const float one = 1.0f, zero = 0.0f;
  void* ws = workspace > 0 ? res.workspace_for(workspace, stream) : nullptr;
  check_blas(lt().matmul(res.handle, desc.op_, &one, c.a, desc.a_, c.b, desc.b_, &zero, c.d, desc.d_, c.d, desc.d_, &algo,
                         ws, workspace, stream),
             what);
}

// Matrix i of the batch as a call of its own.
GemmCall slot(const GemmCall& c, int64_t i) {
  GemmCall one = c;
  one.a = static_cast<const std::byte*>(c.a) + i * c.stride_a * (c.bf16 ? 2 : 4);
  one.b = static_cast<const std::byte*>(c.b) + i * c.stride_b * (c.bf16 ? 2 : 4);
  one.d = c.d + i * c.stride_d;
  return one;
}

// Elements an operand spans (column-major rows × cols, ld).
int64_t span(int rows, int cols, int ld) {
  return rows == 0 || cols == 0 ? 0 : static_cast<int64_t>(cols - 1) * ld + rows;
}

// True when the batched call gives every matrix the bits of the batch-1 call: `batch` copies of
// one operand pair of hashed values (at the real operands' alignments), batched into D, once alone
// into a reference, every element compared. Synchronizes the stream once.
bool probe(const GemmCall& c, int64_t batch, const Plan& plan, size_t workspace, ThreadLt::OnDevice& res,
           cudaStream_t stream) {
  n_probes.fetch_add(1);
  const int64_t span_a = span(c.ta ? c.k : c.m, c.ta ? c.m : c.k, c.lda);
  const int64_t span_b = span(c.tb ? c.n : c.k, c.tb ? c.k : c.n, c.ldb);
  const int64_t span_d = span(c.m, c.n, c.ldd);
  const auto off = [](const void* p, size_t elem) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) % 256 / elem); };
  const int64_t off_a = off(c.a, 2), off_b = off(c.b, 2), off_d = off(c.d, 4);
  const int64_t n_a = off_a + (batch - 1) * c.stride_a + span_a, n_b = off_b + (batch - 1) * c.stride_b + span_b;
  const int64_t n_d = off_d + (batch - 1) * c.stride_d + span_d;
  const auto up = [](int64_t bytes) { return static_cast<size_t>((bytes + 255) / 256 * 256); };
  const size_t bytes_a = up(n_a * 2), bytes_b = up(n_b * 2), bytes_d = up(n_d * 4), bytes_r = up((off_d + span_d) * 4);
  // Stream-ordered memory of its own (cudaMallocAsync): no device-wide wait, nothing kept after.
  void* mem = nullptr;
  check(cudaMallocAsync(&mem, bytes_a + bytes_b + bytes_d + bytes_r + 256, stream), "batched gemm probe (cudaMallocAsync)");
  struct Free {
    void* p;
    cudaStream_t s;
    ~Free() { (void)cudaFreeAsync(p, s); }
  } release{mem, stream};
  auto* base = static_cast<std::byte*>(mem);
  auto* a = reinterpret_cast<uint16_t*>(base);
  auto* b = reinterpret_cast<uint16_t*>(base + bytes_a);
  auto* d = reinterpret_cast<float*>(base + bytes_a + bytes_b);
  auto* r = reinterpret_cast<float*>(base + bytes_a + bytes_b + bytes_d);
  auto* flag = reinterpret_cast<unsigned int*>(base + bytes_a + bytes_b + bytes_d + bytes_r);
  // Every matrix of the batch the same values: the pattern repeats with the stride, from the slot's start.
  check(cuda::probe_fill(a + off_a, n_a - off_a, c.stride_a > 0 ? c.stride_a : n_a, stream), "batched gemm probe");
  check(cuda::probe_fill(b + off_b, n_b - off_b, c.stride_b > 0 ? c.stride_b : n_b, stream), "batched gemm probe");
  check(cudaMemsetAsync(d, 0, bytes_d, stream), "batched gemm probe");  // elements no product writes compare equal
  check(cudaMemsetAsync(r, 0, bytes_r, stream), "batched gemm probe");
  check(cudaMemsetAsync(flag, 0, sizeof(unsigned int), stream), "batched gemm probe");
  GemmCall p = c;
  p.a = a + off_a, p.b = b + off_b, p.d = d + off_d;
  lt_matmul(p, batch, plan.algo, res, workspace, stream, "cublasLtMatmul (probe, batched)");
  GemmCall ref = p;
  ref.d = r + off_d;
  lt_matmul(ref, 1, plan.algo, res, plan.workspace, stream, "cublasLtMatmul (probe, one)");
  check(cuda::any_mismatch(d + off_d, c.stride_d, batch, r + off_d, span_d, flag, stream), "batched gemm probe");
  unsigned int mismatches = 0;
  check(cudaMemcpyAsync(&mismatches, flag, sizeof mismatches, cudaMemcpyDeviceToHost, stream), "batched gemm probe");
  check(cudaStreamSynchronize(stream), "batched gemm probe");
  if (mismatches != 0) n_probe_mismatch.fetch_add(1);
  return mismatches == 0;
}

}  // namespace

void batched_gemm(const GemmCall& c, int64_t batch, int device, cudaStream_t stream, cublasContext* blas) {
  if (batch <= 0 || c.m == 0 || c.n == 0) return;
  const auto gemm_ex_each = [&] {
    for (int64_t i = 0; i < batch; ++i) {
      const GemmCall one = slot(c, i);
      gemm(blas, c.ta, c.tb, c.m, c.n, c.k, one.a, c.lda, one.b, c.ldb, one.d, c.ldd, c.bf16, 1.0f, 0.0f,
           c.bf16 ? "cublasGemmEx (bf16)" : "cublasGemmEx (fp32)");
    }
    n_gemm_ex.fetch_add(static_cast<uint64_t>(batch));
  };
  if (!c.bf16) return gemm_ex_each();
  // Every matrix at the first one's alignment (strides of whole 256-byte blocks), so one algorithm
  // fits them all; else each matrix runs alone with the algorithm of its own alignment.
  const auto whole = [](int64_t stride, size_t elem) { return static_cast<uint64_t>(stride) * elem % 256 == 0; };
  if (batch > 1 && !(whole(c.stride_a, 2) && whole(c.stride_b, 2) && whole(c.stride_d, 4))) {
    for (int64_t i = 0; i < batch; ++i) batched_gemm(slot(c, i), 1, device, stream, blas);
    return;
  }
  ThreadLt::OnDevice& res = tl_lt.on(device);
  const Key key{device, c.ta, c.tb, c.m, c.n, c.k, c.lda, c.ldb, c.ldd, alignment(c.a), alignment(c.b), alignment(c.d)};
  Plan plan;
  bool known = false, ok = false;
  size_t batched_ws = 0;
  {
    std::lock_guard<std::mutex> lock(plans_mutex);
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, choose(c, key, res.handle)).first;
    plan = it->second;
    if (auto b = plan.batch_ok.find({batch, c.stride_a, c.stride_b, c.stride_d}); b != plan.batch_ok.end())
      known = true, ok = b->second.first, batched_ws = b->second.second;
  }
  if (!plan.has_algo) return gemm_ex_each();
  if (batch == 1) {
    lt_matmul(c, 1, plan.algo, res, plan.workspace, stream, "cublasLtMatmul");
    n_single.fetch_add(1);
    return;
  }
  if (!known) {
    // An algorithm that takes the batched layouts, and the probe (outside the lock: it
    // synchronizes the stream).
    {
      const Descriptors& desc = tl_lt.descriptors_for(c, batch);
      cublasLtMatmulHeuristicResult_t r{};
      ok = lt().algo_check(res.handle, desc.op_, desc.a_, desc.b_, desc.d_, desc.d_, &plan.algo, &r) ==
               CUBLAS_STATUS_SUCCESS &&
           r.workspaceSize <= kWorkspaceBytes;
      batched_ws = r.workspaceSize;
    }
    if (ok && probe_on.load()) ok = probe(c, batch, plan, batched_ws, res, stream);
    std::lock_guard<std::mutex> lock(plans_mutex);
    plans[key].batch_ok.emplace(std::make_tuple(batch, c.stride_a, c.stride_b, c.stride_d), std::make_pair(ok, batched_ws));
  }
  if (ok) {
    lt_matmul(c, batch, plan.algo, res, batched_ws, stream, "cublasLtMatmul (batched)");
    n_batched.fetch_add(1);
    return;
  }
  for (int64_t i = 0; i < batch; ++i)
    lt_matmul(slot(c, i), 1, plan.algo, res, plan.workspace, stream, "cublasLtMatmul");
  n_single.fetch_add(static_cast<uint64_t>(batch));
}

BatchedGemmCounters batched_gemm_counters() {
  return {n_batched.load(), n_single.load(), n_gemm_ex.load(), n_probes.load(), n_probe_mismatch.load()};
}

void set_batched_gemm_probe(bool on) {
  probe_on = on;
  std::lock_guard<std::mutex> lock(plans_mutex);
  for (auto& [key, plan] : plans) plan.batch_ok.clear();  // verdicts made under the other setting go
}

}  // namespace meshmuon::detail
