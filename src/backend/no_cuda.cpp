// Internal: stands where the CUDA backend (cuBLAS + own kernels) will go; this build has none.
#include "backend/backend.h"
#include "dmuon/error.h"

namespace dmuon::detail {

std::shared_ptr<Backend> make_cuda_backend(int device) {
  throw_error(concat("[cuda] dmuon was built without CUDA (device ", device, " requested); use the cpu backend"));
}

}  // namespace dmuon::detail
