// Internal: all of the cuda backend's device code, kernels and launchers, written once and compiled
// twice: by nvcc in cuda_kernels.cu, and for the host by tests/support/cuda_on_host.h, which runs
// the same kernels and launchers on CPU threads with CUDA's execution model (the host test
// cuda_kernels_host_test and the CUDA emulation of tests/cuda_emu both run them that way).
//
// The includer opens a namespace and provides:
//   kThreads                         the block size of the one-dimensional launches (256)
//   MESHMUON_GRID_LOOP(i, n)            a grid-stride loop over [0, n)
//   MESHMUON_LAUNCH(kernel, grid, block, stream)(args...)   a launch
//   done()                           the launch's error (cudaGetLastError on a GPU)
//   dim3, cudaStream_t, cudaError_t, blockIdx, threadIdx, blockDim, gridDim, __syncthreads
//   the CUDA intrinsics the kernels call (__fadd_rn, __fmul_rn, __fmaf_rn, __dadd_rn, ...)
//   PackRun / PackConv (pack.h), the tables of multi_tensor.h, NormuonScratch (device_scratch.h)
// The kernels go into an unnamed namespace; the launchers (launchers.cuh) follow outside it, where
// cuda_kernels.h declares them.
#pragma once

namespace {

#include "backend/cuda/elementwise.cuh"  // bf16, the update arithmetic, multi-tensor kernels
#include "backend/cuda/pack.cuh"         // message packing
#include "backend/cuda/reductions.cuh"   // Σ x²
#include "backend/cuda/normuon.cuh"      // NorMuon
#include "backend/cuda/newton_schulz.cuh"  // normalization, polynomial, mirror, trace
#include "backend/cuda/scalings.cuh"     // MuonEq, Muon+
#include "backend/cuda/batch_probe.cuh"  // the batched GEMM probe
#include "backend/cuda/fsdp_reduce.cuh"  // FSDP's ordered sum

}  // namespace

#include "backend/cuda/launchers.cuh"
