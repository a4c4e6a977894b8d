// Internal: the device scratch some of the cuda backend's launches need, as plain C++ (no CUDA
// types), so that cuda_kernels.h, the launchers (launchers.cuh) and their host run
// (tests/support/cuda_on_host.h) share one definition.
#pragma once

namespace meshmuon::cuda {

// Σ x² (sum_squares) sums at most this many block partials: its `partials` scratch holds as many
// doubles.
inline constexpr int kSumSquaresBlocks = 1024;

// NorMuon's device scratch: step (normuon_state_size floats), the norm (one double), the ratio (one
// float).
struct NormuonScratch {
  float* step;
  double* norm;
  float* ratio;
};

}  // namespace meshmuon::cuda
