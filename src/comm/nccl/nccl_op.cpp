// One operation of the nccl transport (nccl_op.h): its completion test, and the CUDA / NCCL
// translations.
#include "comm/nccl/nccl_op.h"

#include <cstring>
#include <stdexcept>

#include "meshmuon/error.h"

namespace meshmuon::detail::nccl {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(concat(what, ": ", cudaGetErrorString(e)));
}

ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::F32: return ncclFloat32;
    case CommType::BF16: return ncclBfloat16;
    case CommType::I32: return ncclInt32;
    case CommType::I64: return ncclInt64;
    case CommType::U64: return ncclUint64;
    case CommType::U8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

bool NcclOp::test() {
  if (shared_->aborted) throw std::runtime_error("the NCCL communicator was aborted after a timeout");
  ncclResult_t state = ncclSuccess;
  shared_->check(comm_, shared_->api->comm_get_async_error(comm_, &state), "ncclCommGetAsyncError");
  if (state != ncclSuccess && state != ncclInProgress)
    throw std::runtime_error(concat("NCCL reported ", shared_->error_text(comm_, state)));
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: cleared where the runtime left it as the last error
    return false;
  }
  check_cuda(e, "cudaEventQuery");
  for (const CopyOut& c : copy_out_) std::memcpy(c.host, c.pinned, c.bytes);
  copy_out_.clear();
  return true;
}

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

}  // namespace meshmuon::detail::nccl
