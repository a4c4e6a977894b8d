// Internal: the per-matrix Muon math that LocalOptimizer and the distributed executor share, so that
// both run literally the same code on every element (the basis of bitwise layout invariance).
#pragma once

#include <cstdint>

#include "dmuon/dtype.h"
#include "dmuon/orthogonalize.h"
#include "dmuon/tensor.h"

namespace dmuon::detail {

// Rounds n values to the communication dtype and back, in place (bf16: round to nearest even, as
// the wire format; fp32: no-op). Where values travel, every layout rounds them the same way.
void round_to_comm(float* x, int64_t n, DType comm);

// One matrix (rows × cols, row-major) whose input was already rounded to the comm dtype:
// orthogonalize in place, then NorMuon when `v` is not null (v: this matrix's state,
// normuon_state_size(rows, cols) values; v_mean: scratch of the same size), then round the result
// to the comm dtype (the value that travels back to the shard holders).
void muon_unit(Orthogonalizer& orth, float* u, int64_t rows, int64_t cols, float* v, float* v_mean,
               double beta2, DType comm);

// Index of the first non-finite element of a contiguous fp32 / bf16 view, or -1.
int64_t first_non_finite(const TensorView& g);

}  // namespace dmuon::detail
