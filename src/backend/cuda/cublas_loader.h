// Internal: cuBLAS, loaded at run time (dlopen) so that libdmuon links only the static cudart and
// loads on machines without a GPU, a driver or cuBLAS. Search order: $DMUON_CUBLAS_LIBRARY,
// libcublas.so.13 on the loader path, the nvidia-cublas wheel found at configure time, libcublas.so.
#pragma once

#include <cublas_api.h>

#include <string>

namespace dmuon::detail {

// The entry points dmuon calls. cublasGemmEx is overloaded in C++ (cudaDataType / cublasComputeType_t):
// the compute-type form is the one held.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  std::string library;  // the name that loaded
};

// Loaded on first use; throws dmuon::Error naming what was tried and the package to install.
const Cublas& cublas();

// Throws dmuon::Error "[cuda] <what>: cuBLAS status N" unless `s` is CUBLAS_STATUS_SUCCESS.
void check_blas(cublasStatus_t s, const char* what);

}  // namespace dmuon::detail
