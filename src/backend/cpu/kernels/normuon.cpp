// NorMuon variance reduction (nanochat): a factored second moment per row or per column of the
// orthogonalized update, split into a full-matrix reduction and a finishing pass.
#include <algorithm>
#include <vector>

#include "backend/cpu/kernels/update_steps.h"
#include "backend/cpu/kernels/elementwise.h"

namespace meshmuon {
namespace {

void check_matrix(const float* u, int64_t rows, int64_t cols, const void* state, const char* what) {
  MESHMUON_CHECK(rows >= 0 && cols >= 0, "[normuon] matrix shape ", rows, "x", cols, " is negative");
  cpu::check_buffer(u, rows * cols, "normuon", "update");
  cpu::check_buffer(state, normuon_state_size(rows, cols), "normuon", what);
}

}  // namespace

int64_t normuon_state_size(int64_t rows, int64_t cols) { return rows >= cols ? rows : cols; }

Shape normuon_state_shape(const Shape& global_shape, bool expert_stack) {
  const MatrixDims d = matrix_dims(global_shape, expert_stack);
  const bool per_row = d.rows >= d.cols;
  if (expert_stack) return per_row ? Shape{d.batch, d.rows, 1} : Shape{d.batch, 1, d.cols};
  return per_row ? Shape{d.rows, 1} : Shape{1, d.cols};
}

void normuon_mean_square(const float* u, int64_t rows, int64_t cols, float* v_mean) {
  check_matrix(u, rows, cols, v_mean, "v_mean");
  if (rows >= cols) {  // per row: reduce over the columns
    for (int64_t i = 0; i < rows; ++i) {
      const float* row = u + i * cols;
      double sum = 0;
      for (int64_t j = 0; j < cols; ++j) sum += static_cast<double>(row[j]) * row[j];
      v_mean[i] = cols > 0 ? static_cast<float>(sum / static_cast<double>(cols)) : 0.0f;
    }
    return;
  }
  std::vector<double> sums(static_cast<size_t>(cols), 0.0);  // per column: reduce over the rows
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = u + i * cols;
    for (int64_t j = 0; j < cols; ++j) sums[j] += static_cast<double>(row[j]) * row[j];
  }
  for (int64_t j = 0; j < cols; ++j)
    v_mean[j] = rows > 0 ? static_cast<float>(sums[j] / static_cast<double>(rows)) : 0.0f;
}

void normuon_finish(float* u, int64_t rows, int64_t cols, const float* v_mean, float* v,
                    double beta2) {
  cpu::check_nonnegative_rate(beta2, "normuon", "beta2");
  check_matrix(u, rows, cols, v_mean, "v_mean");
  cpu::check_buffer(v, normuon_state_size(rows, cols), "normuon", "v");
  const bool per_row = rows >= cols;
  const int64_t len = normuon_state_size(rows, cols);
  const double k = static_cast<double>(per_row ? cols : rows);
  if (len == 0 || k == 0) return;

  // pass 1: norm of the incoming update from its mean squares (needs the whole matrix's v_mean).
  double sum_mean = 0;
  for (int64_t i = 0; i < len; ++i) sum_mean += v_mean[i];
  const double norm = std::sqrt(sum_mean * k);
  // pass 2: EMA of the second moment and the per-row/column step; the norm after scaling.
  const float w = cpu::to_scalar(1.0 - beta2);
  std::vector<float> step(static_cast<size_t>(len));
  double sum_new = 0;
  for (int64_t i = 0; i < len; ++i) {
    v[i] = cpu::torch_lerp(v[i], v_mean[i], w);
    step[i] = 1.0f / std::sqrt(std::max(v[i], 1e-10f));
    const double s = step[i];
    sum_new += static_cast<double>(v_mean[i]) * k * (s * s);
  }
  const double norm_new = std::sqrt(sum_new);
  // pass 3: rescale so the update keeps its Frobenius norm.
  const float ratio = static_cast<float>(norm / std::max(norm_new, 1e-10));
  for (int64_t i = 0; i < len; ++i) step[i] *= ratio;
  if (per_row) {
    for (int64_t i = 0; i < rows; ++i) {
      float* row = u + i * cols;
      for (int64_t j = 0; j < cols; ++j) row[j] *= step[i];
    }
  } else {
    for (int64_t i = 0; i < rows; ++i) {
      float* row = u + i * cols;
      for (int64_t j = 0; j < cols; ++j) row[j] *= step[j];
    }
  }
}

void normuon_apply(float* u, int64_t rows, int64_t cols, float* v, double beta2) {
  cpu::check_nonnegative_rate(beta2, "normuon", "beta2");
  std::vector<float> v_mean(static_cast<size_t>(std::max<int64_t>(normuon_state_size(rows, cols), 0)));
  normuon_mean_square(u, rows, cols, v_mean.data());
  normuon_finish(u, rows, cols, v_mean.data(), v, beta2);
}

}  // namespace meshmuon
