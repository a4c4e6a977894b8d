// Internal: one operation of the nccl transport (nccl_transport.cpp posts it): its device and pinned
// scratch, the CUDA event that ends it, the copies of bounce buffers into host receive buffers on
// completion; and the CUDA / NCCL translations the transport uses.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <vector>

#include "comm/nccl/nccl_transport.h"
#include "meshmuon/comm_transport.h"

namespace meshmuon::detail::nccl {

// The transport's CUDA errors: std::runtime_error "<what>: <runtime's text>" (the Communicator words
// the operation's error around it); not the backend's detail::check_cuda.
void check_cuda(cudaError_t e, const char* what);
ncclDataType_t nccl_type(CommType t);
ncclRedOp_t nccl_op(ReduceOp op);
// Device or managed memory (a pointer the runtime does not know is host memory).
bool is_device_pointer(const void* p);

// Device memory and pinned memory of one operation.
struct Scratch {
  std::vector<void*> device, pinned;
  ~Scratch() {
    for (void* p : device) (void)cudaFree(p);
    for (void* p : pinned) (void)cudaFreeHost(p);
  }
};

class NcclOp final : public TransportOp {
 public:
  NcclOp(std::shared_ptr<NcclShared> shared, ncclComm_t comm) : shared_(std::move(shared)), comm_(comm) {}
  ~NcclOp() override {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }

  bool test() override;


  struct CopyOut {
    void* host;
    const void* pinned;
    size_t bytes;
  };
  Scratch scratch;
  std::vector<CopyOut> copy_out_;
  cudaEvent_t event_ = nullptr;

 private:
  std::shared_ptr<NcclShared> shared_;
  ncclComm_t comm_;
};

}  // namespace meshmuon::detail::nccl
