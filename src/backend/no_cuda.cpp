// Internal: stands where the CUDA backend (cuBLAS + own kernels) will go; this build has none.
#include "backend/backend.h"
#include "backend/cuda_bench.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {

std::shared_ptr<Backend> make_cuda_backend(int device) {
  throw_error(concat("[cuda] meshmuon was built without CUDA (device ", device, " requested); use the cpu backend"));
}

double cuda_ns_flops_done(int64_t, int64_t, const NsOptions&) {
  throw_error("[cuda] meshmuon was built without CUDA");
}

CudaNsTiming time_ns_cuda(const NsOptions&, const float*, int64_t, int64_t, int, int, int64_t) {
  throw_error("[cuda] meshmuon was built without CUDA: `meshmuon bench ns --device cuda` needs a build with "
              "MESHMUON_WITH_CUDA (nvcc and the cuBLAS headers; see scripts/gpu_check.sh)");
}

}  // namespace meshmuon::detail
