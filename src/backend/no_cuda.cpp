// Internal: built instead of cuda/ when the build has no CUDA: registers "cuda" as missing (with the
// reason and what to do), and the cuda-only entry points throw the same reason.
#include "backend/backend.h"
#include "backend/cuda/shared/cuda_bench.h"
#include "backend/registry.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {

void register_cuda_backend(BackendRegistry& r) {
  r.add_missing("cuda", "meshmuon was built without CUDA; use the cpu backend, or reconfigure with "
                        "-DMESHMUON_WITH_CUDA=ON on a machine with nvcc and the cuBLAS headers",
                /*indexed=*/true, "CUDA");
}

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
