// Helpers shared by the unit tests: error-message checks and the plain scalar references that more
// than one test file compares against (written once, independent of the library's kernels).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "meshmuon/inventory.h"

namespace meshmuon::test {

// A model of 2-D Muon matrices, (name, rows, cols) each.
inline ModelDesc matrix_model(const std::string& name,
                              std::initializer_list<std::tuple<const char*, int64_t, int64_t>> matrices) {
  ModelDesc model{name, {}};
  for (const auto& [n, rows, cols] : matrices) {
    ParamSpec p;
    p.name = n, p.shape = Shape{rows, cols};
    model.params.push_back(p);
  }
  return model;
}

// n Gaussian values (mean 0, standard deviation `scale`) from mt19937 seeded with `seed`.
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// f() must throw std::invalid_argument whose message starts with `area` (e.g. "[orth]") and
// mentions `needle`.
template <class F>
void expect_invalid(F&& f, const std::string& needle, const std::string& area) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind(area, 0), 0u) << e.what();
  }
}

// nanochat's NorMuon variance reduction in plain double (REFERENCE.md section 2) on a row-major m×n
// update `u`, with the factored second moment `v` (m values when m ≥ n, else n) kept in double.
inline void normuon_reference(double* u, int m, int n, double* v, double beta2) {
  const bool per_row = m >= n;
  const int len = per_row ? m : n, k = per_row ? n : m;
  std::vector<double> mean(static_cast<size_t>(len), 0.0), step(static_cast<size_t>(len));
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) mean[per_row ? i : j] += u[i * n + j] * u[i * n + j] / k;
  double norm_sq = 0, new_sq = 0;
  for (int r = 0; r < len; ++r) {
    norm_sq += mean[r] * k;
    v[r] = beta2 * v[r] + (1 - beta2) * mean[r];
    step[r] = 1.0 / std::sqrt(std::max(v[r], 1e-10));
    new_sq += mean[r] * k * step[r] * step[r];
  }
  const double ratio = std::sqrt(norm_sq) / std::max(std::sqrt(new_sq), 1e-10);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) u[i * n + j] *= step[per_row ? i : j] * ratio;
}

// The message of the std::invalid_argument `f` throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace meshmuon::test
