// Bf16Matmul on oneDNN (bf16_matmul.h), built when CMake finds the oneDNN 3.x headers (else
// no_dnnl_matmul.cpp): oneDNN loaded at run time (dlopen) for bf16 products. Only the C API of
// oneDNN 3.x is used (libdnnl.so.3; PyPI's onednn-cpu-iomp 2023.2.0 is oneDNN 3.2): a matmul
// primitive per shape, cached.
#include "backend/cpu/kernels/bf16_matmul.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <tuple>
#include <vector>

#include "core/dl_symbol.h"
#include "core/library_loader.h"
#include "meshmuon/bf16.h"
#include "meshmuon/error.h"

#include <oneapi/dnnl/dnnl_types.h>
#include <oneapi/dnnl/dnnl_version.h>
static_assert(DNNL_VERSION_MAJOR >= 3,
              "meshmuon's bf16 products use the oneDNN 3.x C API: build against onednn-devel-cpu-iomp (scripts/requirements.txt)");

namespace meshmuon::cpu {

namespace {

constexpr const char* kInstallHint = "pip install onednn-cpu-iomp==2023.2.0 intel-cmplr-lib-rt==2023.2.0";

struct DnnlApi {
  dnnl_status_t (*engine_create)(dnnl_engine_t*, dnnl_engine_kind_t, size_t) = nullptr;
  dnnl_status_t (*stream_create)(dnnl_stream_t*, dnnl_engine_t, unsigned) = nullptr;
  dnnl_status_t (*stream_destroy)(dnnl_stream_t) = nullptr;
  dnnl_status_t (*stream_wait)(dnnl_stream_t) = nullptr;
  dnnl_status_t (*memory_desc_create_with_strides)(dnnl_memory_desc_t*, int, const dnnl_dims_t,
                                                   dnnl_data_type_t, const dnnl_dims_t) = nullptr;
  dnnl_status_t (*memory_desc_destroy)(dnnl_memory_desc_t) = nullptr;
  dnnl_status_t (*matmul_primitive_desc_create)(dnnl_primitive_desc_t*, dnnl_engine_t,
                                                const_dnnl_memory_desc_t, const_dnnl_memory_desc_t,
                                                const_dnnl_memory_desc_t, const_dnnl_memory_desc_t,
                                                const_dnnl_primitive_attr_t) = nullptr;
  dnnl_status_t (*primitive_desc_query)(const_dnnl_primitive_desc_t, dnnl_query_t, int,
                                        void*) = nullptr;
  dnnl_status_t (*primitive_desc_destroy)(dnnl_primitive_desc_t) = nullptr;
  dnnl_status_t (*primitive_create)(dnnl_primitive_t*, const_dnnl_primitive_desc_t) = nullptr;
  dnnl_status_t (*primitive_destroy)(dnnl_primitive_t) = nullptr;
  dnnl_status_t (*primitive_execute)(const_dnnl_primitive_t, dnnl_stream_t, int,
                                     const dnnl_exec_arg_t*) = nullptr;
  dnnl_status_t (*memory_create)(dnnl_memory_t*, const_dnnl_memory_desc_t, dnnl_engine_t,
                                 void*) = nullptr;
  dnnl_status_t (*memory_set_data_handle)(dnnl_memory_t, void*) = nullptr;
  dnnl_status_t (*memory_destroy)(dnnl_memory_t) = nullptr;
  const dnnl_version_t* (*version)() = nullptr;
  dnnl_cpu_isa_t (*get_effective_cpu_isa)() = nullptr;
  void (*omp_set_num_threads)(int) = nullptr;  // the OpenMP runtime oneDNN runs on (libiomp5)
  int (*omp_get_max_threads)() = nullptr;
  void (*kmp_set_blocktime)(int) = nullptr;  // Intel's OpenMP only
  dnnl_engine_t engine = nullptr;
  Bf16MatmulInfo info;
  bool amx = false;  // the ISA oneDNN runs on has AMX (its K partitioning from 16 threads: below)
};

void check(dnnl_status_t status, const char* what) {
  MESHMUON_CHECK_RUNTIME(status == dnnl_success, "[orth] oneDNN ", what, " failed with status ",
                      static_cast<int>(status));
}

// A oneDNN 3.x memory descriptor (opaque, created and destroyed through the API).
class MatrixDesc {
 public:
  MatrixDesc(const DnnlApi& api, int64_t rows, int64_t cols, int64_t ld, bool trans, dnnl_data_type_t type)
      : api_(api) {
    const dnnl_dims_t dims = {rows, cols};
    const dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
    check(api.memory_desc_create_with_strides(&md_, 2, dims, type, strides), "memory descriptor");
  }
  ~MatrixDesc() {
    if (md_) api_.memory_desc_destroy(md_);
  }
  MatrixDesc(const MatrixDesc&) = delete;
  MatrixDesc& operator=(const MatrixDesc&) = delete;
  const_dnnl_memory_desc_t get() const { return md_; }

 private:
  const DnnlApi& api_;
  dnnl_memory_desc_t md_ = nullptr;
};

// Whether oneDNN has a bf16 matmul for this CPU, and which kernel a typical Newton–Schulz product
// gets (oneDNN 3.2 has none without AVX-512 and without AVX2 bf16 support: creation returns
// unimplemented).
void probe(DnnlApi& api) {
  const MatrixDesc src(api, 256, 256, 256, false, dnnl_bf16);
  const MatrixDesc dst(api, 256, 256, 256, false, dnnl_f32);
  dnnl_primitive_desc_t pd = nullptr;
  const dnnl_status_t status =
      api.matmul_primitive_desc_create(&pd, api.engine, src.get(), src.get(), nullptr, dst.get(), nullptr);
  if (status != dnnl_success) {
    api.info.error = detail::concat(
        "oneDNN ", api.info.version, " has no bf16 matmul for this CPU (status ", static_cast<int>(status),
        status == dnnl_unimplemented ? ", unimplemented: it needs AVX-512" : "", ")");
    return;
  }
  const char* impl = nullptr;
  if (api.primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl) api.info.kernel = impl;
  api.primitive_desc_destroy(pd);
  // Native: the ISA oneDNN runs on (the CPU's, capped by ONEDNN_MAX_CPU_ISA) has bf16 dot products
  // (AVX512-BF16, AMX, AVX2-VNNI-2). Not the kernel's name: 3.x calls its emulation "gemm:jit:bf16".
  const auto has = [](dnnl_cpu_isa_t isa, dnnl_cpu_isa_t want) { return (isa & want) == want; };
  const dnnl_cpu_isa_t isa = api.get_effective_cpu_isa();
  api.info.native = api.info.kernel.rfind("ref", 0) != 0 &&
                    (has(isa, dnnl_cpu_isa_avx512_core_bf16) || has(isa, dnnl_cpu_isa_avx2_vnni_2));
  api.amx = has(isa, dnnl_cpu_isa_avx512_core_amx);
  api.info.available = true;
}

// PyPI's libdnnl.so.3 has no RUNPATH: its dependencies (libiomp5 from intel-openmp; libsvml, libimf,
// libirng, libintlc from intel-cmplr-lib-rt) sit beside it in the environment's lib folder, where
// the loader does not look. Loading them first by path (dependencies first) lets the soname match.
void preload_beside(const std::string& library) {
  const size_t slash = library.rfind('/');
  if (slash == std::string::npos || access(library.c_str(), R_OK) != 0) return;
  const std::string dir = library.substr(0, slash + 1);
  for (const char* dep : {"libintlc.so.5", "libimf.so", "libsvml.so", "libirng.so", "libiomp5.so"}) {
    const std::string path = dir + dep;
    if (access(path.c_str(), R_OK) == 0) dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept open
  }
}

DnnlApi load() {
  DnnlApi api;
  const char* user = std::getenv("MESHMUON_DNNL_LIBRARY");
  const std::string prefix_lib = detail::install_location().prefix_lib;
  std::vector<std::string> names;
  if (user != nullptr && *user != '\0') names.emplace_back(user);
  names.emplace_back("libdnnl.so.3");
  if (!prefix_lib.empty()) names.push_back(prefix_lib + "/libdnnl.so.3");
  // the one beside the headers built against; empty in a portable build (a wheel names no path of
  // the machine that built it)
  if (*MESHMUON_DNNL_BUILD_LIBRARY != '\0') names.emplace_back(MESHMUON_DNNL_BUILD_LIBRARY);
  const detail::AcceptLibrary accept = [&api](void* h, const char*) {
    const bool ok = detail::bind_symbol(h, "dnnl_engine_create", api.engine_create) &&
                    detail::bind_symbol(h, "dnnl_stream_create", api.stream_create) &&
                    detail::bind_symbol(h, "dnnl_stream_destroy", api.stream_destroy) &&
                    detail::bind_symbol(h, "dnnl_stream_wait", api.stream_wait) &&
                    detail::bind_symbol(h, "dnnl_memory_desc_create_with_strides", api.memory_desc_create_with_strides) &&
                    detail::bind_symbol(h, "dnnl_memory_desc_destroy", api.memory_desc_destroy) &&
                    detail::bind_symbol(h, "dnnl_matmul_primitive_desc_create", api.matmul_primitive_desc_create) &&
                    detail::bind_symbol(h, "dnnl_primitive_desc_query", api.primitive_desc_query) &&
                    detail::bind_symbol(h, "dnnl_primitive_desc_destroy", api.primitive_desc_destroy) &&
                    detail::bind_symbol(h, "dnnl_primitive_create", api.primitive_create) &&
                    detail::bind_symbol(h, "dnnl_primitive_destroy", api.primitive_destroy) &&
                    detail::bind_symbol(h, "dnnl_primitive_execute", api.primitive_execute) &&
                    detail::bind_symbol(h, "dnnl_memory_create", api.memory_create) &&
                    detail::bind_symbol(h, "dnnl_memory_set_data_handle", api.memory_set_data_handle) &&
                    detail::bind_symbol(h, "dnnl_memory_destroy", api.memory_destroy) &&
                    detail::bind_symbol(h, "dnnl_version", api.version) &&
                    detail::bind_symbol(h, "dnnl_get_effective_cpu_isa", api.get_effective_cpu_isa);
    return ok ? std::string() : std::string("lacks the oneDNN 3.x C API (dnnl_matmul_primitive_desc_create)");
  };
  std::vector<const char*> candidates;
  for (const std::string& n : names) candidates.push_back(n.c_str());
  // A path's neighbours are preloaded only when that path is tried.
  const detail::OpenedLibrary lib = detail::open_first_library(
      candidates, RTLD_NOW | RTLD_LOCAL, accept, [](const char* name) { preload_beside(name); });
  if (lib.handle == nullptr) {
    api.info.error = detail::concat("could not load oneDNN 3.x: tried ", lib.tried(), "; ", kInstallHint,
                                    " (oneDNN 3.2 and its runtime libraries) or set MESHMUON_DNNL_LIBRARY");
    return api;
  }
  void* h = lib.handle;
  // dlsym on a handle searches its dependencies: the OpenMP runtime oneDNN was built with.
  if (!detail::bind_symbol(h, "omp_set_num_threads", api.omp_set_num_threads) ||
      !detail::bind_symbol(h, "omp_get_max_threads", api.omp_get_max_threads))
    api.omp_set_num_threads = nullptr, api.omp_get_max_threads = nullptr;
  detail::bind_symbol(h, "kmp_set_blocktime", api.kmp_set_blocktime);
  if (api.engine_create(&api.engine, dnnl_cpu, 0) != dnnl_success) {
    api.info.error = detail::concat(lib.name, ": could not create a CPU engine");
    return api;
  }
  const dnnl_version_t* v = api.version();
  api.info.library = lib.name;
  api.info.version = detail::concat(v->major, ".", v->minor, ".", v->patch);
  try {
    probe(api);
  } catch (const std::exception& e) {
    api.info.error = e.what();
  }
  return api;
}

const DnnlApi& dnnl() {
  static const DnnlApi api = load();
  return api;
}

}  // namespace

// oneDNN's emulation (gemm:jit:bf16, no bf16 instructions) splits the reduction across threads and
// sizes its blocking by the thread count current when a primitive is made (other bits for
// 1x1x20000 and 8x8x16384 from 2 threads, 64x64x4096 and 256x256x1024 on 3, 300x700x300 on 8), so
// its primitives are made and run on one thread: the contract holds on the forced onednn_emulated
// path too. The native kernels (brg:*) split it only in the cases below (kAmxMaxThreads, copy_plain).
// Caps oneDNN's OpenMP thread count at `cap` for the guard's life and restores it after; cap 0, or
// a runtime without omp_set_num_threads, changes nothing. Emulated bf16: 1 for making and running
// (above); AMX: kAmxMaxThreads for making (below).
class ThreadCap {
 public:
  ThreadCap(const DnnlApi& api, int cap)
      : api_(api), threads_(cap > 0 && api.omp_set_num_threads ? api.omp_get_max_threads() : 0), cap_(cap) {
    if (threads_ > cap_) api_.omp_set_num_threads(cap_);
  }
  ~ThreadCap() {
    if (threads_ > cap_) api_.omp_set_num_threads(threads_);
  }
  ThreadCap(const ThreadCap&) = delete;
  ThreadCap& operator=(const ThreadCap&) = delete;

 private:
  const DnnlApi& api_;
  int threads_, cap_;
};

// oneDNN 3.2's native bf16 kernels also split the reduction (K) across threads where their blocking
// heuristics see too little work in M x N, which would make the bits depend on the thread count:
// - a transposed A (its "backward by weights" heuristic; bf16 with a power-of-two K >= 2048: the
//   Gram product X^T X of a tall matrix, whose K is the rows) on 2 threads and more, AVX512-BF16 and
//   AMX alike: A is never handed over transposed, a transposed view is copied into a plain buffer;
// - AMX with 16 threads and more (up to threads / 8 K-partitions): primitives are made with at most
//   15 threads there (a primitive runs on the thread count it was made with).
// Tested bitwise on 1-32 threads (orthogonalize_test, BitwiseAcrossThreadCountsForManyShapes).
constexpr int kAmxMaxThreads = 15;

// Element (i, p) of the m x k transposed view `a` (stored k x m) into row-major `out`, in tiles.
void copy_plain(int64_t m, int64_t k, Bf16Operand a, BFloat16* out) {
  constexpr int64_t kTile = 64;
  for (int64_t p0 = 0; p0 < k; p0 += kTile)
    for (int64_t i0 = 0; i0 < m; i0 += kTile)
      for (int64_t p = p0; p < std::min(k, p0 + kTile); ++p)
        for (int64_t i = i0; i < std::min(m, i0 + kTile); ++i) out[i * k + p] = a.data[p * a.ld + i];
}

struct Bf16Matmul::Impl {
  struct Entry {
    dnnl_primitive_t primitive = nullptr;
    dnnl_memory_t src = nullptr, weights = nullptr, dst = nullptr;
  };
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, int64_t, bool, int64_t, bool>;
  dnnl_stream_t stream = nullptr;
  std::map<Key, Entry> cache;
  std::vector<BFloat16> plain_a;  // a transposed A, copied plain (above)
  // bf16 results on AMX: oneDNN's bf16-out AMX kernels give other bits on 15 threads than on one
  // (seen for 512x128x3000, where its fp32-out kernels do not), so there the products are formed in
  // fp32 and rounded to nearest even here: the fp32 path's bits, rounded (tested on 1-32 threads; it
  // costs the extra fp32 pass, measured 824 vs 1275 GFLOP/s for 1024x4096x1024 NN on 2 threads).
  // AVX512-BF16's bf16-out kernels keep their bits on 1-32 threads (tested) and run as they are.
  std::vector<float> acc;

  ~Impl() {
    const DnnlApi& api = dnnl();
    for (auto& [key, e] : cache) {
      api.memory_destroy(e.src);
      api.memory_destroy(e.weights);
      api.memory_destroy(e.dst);
      api.primitive_destroy(e.primitive);
    }
    if (stream) api.stream_destroy(stream);
  }

  Entry& entry(int64_t m, int64_t n, int64_t k, Bf16Operand a, Bf16Operand b, int64_t ldc,
               bool bf16_out) {
    const Key key{m, n, k, a.ld, a.trans, b.ld, b.trans, ldc, bf16_out};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    const DnnlApi& api = dnnl();
    const MatrixDesc src(api, m, k, a.ld, a.trans, dnnl_bf16);
    const MatrixDesc wei(api, k, n, b.ld, b.trans, dnnl_bf16);
    const MatrixDesc dst(api, m, n, ldc, false, bf16_out ? dnnl_bf16 : dnnl_f32);
    dnnl_primitive_desc_t pd = nullptr;
    const ThreadCap creation(api, api.amx ? kAmxMaxThreads : 0);
    check(api.matmul_primitive_desc_create(&pd, api.engine, src.get(), wei.get(), nullptr, dst.get(), nullptr),
          "matmul primitive");
    Entry e;
    const dnnl_status_t made = api.primitive_create(&e.primitive, pd);
    api.primitive_desc_destroy(pd);
    check(made, "primitive creation");
    check(api.memory_create(&e.src, src.get(), api.engine, DNNL_MEMORY_NONE), "memory");
    check(api.memory_create(&e.weights, wei.get(), api.engine, DNNL_MEMORY_NONE), "memory");
    check(api.memory_create(&e.dst, dst.get(), api.engine, DNNL_MEMORY_NONE), "memory");
    return cache.emplace(key, e).first->second;
  }

  void run(int64_t m, int64_t n, int64_t k, Bf16Operand a, Bf16Operand b, void* c, int64_t ldc,
           bool bf16_out) {
    if (m == 0 || n == 0) return;
    const DnnlApi& api = dnnl();
    const ThreadCap emulated(api, api.info.native ? 0 : 1);
    if (a.trans) {
      plain_a.resize(size_t(m * k));
      copy_plain(m, k, a, plain_a.data());
      a = Bf16Operand{plain_a.data(), k, false};
    }
    const bool round_here = bf16_out && api.amx;  // see acc
    if (round_here) acc.resize(size_t(m * n));
    Entry& e = entry(m, n, k, a, b, round_here ? n : ldc, bf16_out && !round_here);
    check(api.memory_set_data_handle(e.src, const_cast<BFloat16*>(a.data)), "set src");
    check(api.memory_set_data_handle(e.weights, const_cast<BFloat16*>(b.data)), "set weights");
    check(api.memory_set_data_handle(e.dst, round_here ? acc.data() : c), "set dst");
    const dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, e.src}, {DNNL_ARG_WEIGHTS, e.weights}, {DNNL_ARG_DST, e.dst}};
    check(api.primitive_execute(e.primitive, stream, 3, args), "matmul");
    check(api.stream_wait(stream), "stream wait");
    if (round_here)  // the fp32 products rounded to nearest even here (see acc)
      for (int64_t i = 0; i < m; ++i) float_to_bf16(acc.data() + i * n, static_cast<BFloat16*>(c) + i * ldc, size_t(n));
  }
};

Bf16MatmulInfo bf16_matmul_info() { return dnnl().info; }

void require_bf16_matmul(const char* who) {
  const Bf16MatmulInfo& info = dnnl().info;
  MESHMUON_CHECK_RUNTIME(info.available, "[orth] ", who, ": oneDNN cannot form bf16 products here: ", info.error);
}

Bf16Matmul::Bf16Matmul() : impl_(std::make_unique<Impl>()) {
  require_bf16_matmul("bf16 matmul");
  check(dnnl().stream_create(&impl_->stream, dnnl().engine, dnnl_stream_default_flags), "stream");
}

Bf16Matmul::~Bf16Matmul() = default;

int Bf16Matmul::set_threads(int n) {
  // libiomp5's workers spin 200 ms (KMP_BLOCKTIME) after each parallel region: after a bf16 product
  // they would take the cores from the fp32 products and the BLAS that follow (measured: SGEMM
  // right after bf16 products at 0.65x its rate). They sleep at once for the regions this thread forks.
  thread_local bool blocktime_set = false;
  if (dnnl().kmp_set_blocktime && !blocktime_set && std::getenv("KMP_BLOCKTIME") == nullptr) {
    dnnl().kmp_set_blocktime(0);
    blocktime_set = true;
  }
  if (!dnnl().omp_set_num_threads) return n;
  const int previous = dnnl().omp_get_max_threads();
  if (previous != n) dnnl().omp_set_num_threads(std::max(1, n));
  return previous;
}

void Bf16Matmul::gemm(int64_t m, int64_t n, int64_t k, Bf16Operand a, Bf16Operand b, float* c,
                      int64_t ldc) {
  impl_->run(m, n, k, a, b, c, ldc, false);
}

void Bf16Matmul::gemm(int64_t m, int64_t n, int64_t k, Bf16Operand a, Bf16Operand b, BFloat16* c,
                      int64_t ldc) {
  impl_->run(m, n, k, a, b, c, ldc, true);
}

}  // namespace meshmuon::cpu
