// The conformance suite's fixture: each case runs once per backend of conformance_backends()
// (gtest parameter), on that backend's memory (device memory where it has it), and compares with
// the cpu backend on host memory: bitwise, or within the backend's stated bound (backends.h).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backends.h"
#include "meshmuon/bf16.h"
#include "../unit/test_support.h"

namespace meshmuon::conformance {

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    spec_ = &conformance_backend(GetParam());
    std::string why;
    be_ = spec_->make(&why);
    if (!be_) GTEST_SKIP() << "backend " << GetParam() << " unavailable here: " << why;
    cpu_ = detail::make_cpu_backend();
  }
  void TearDown() override {
    if (be_) be_->synchronize();
    keep_.clear();
  }
  detail::Backend& be() { return *be_; }
  detail::Backend& cpu() { return *cpu_; }
  const ConformanceBackend& spec() const { return *spec_; }
  bool bitwise_products() const { return spec_->ns_fp32 == 0; }

  // Memory of the backend under test (device memory where it has it), filled from `host`.
  template <class T>
  T* put(const std::vector<T>& host) {
    T* p = static_cast<T*>(alloc(host.size() * sizeof(T)));
    if (!host.empty()) be_->copy(p, host.data(), host.size() * sizeof(T));
    return p;
  }
  void* alloc(size_t bytes) {
    const detail::MemoryKind kind = be_->capabilities().device_memory ? detail::MemoryKind::Device : detail::MemoryKind::Host;
    keep_.push_back(be_->allocate(bytes, kind));
    return keep_.back().data();
  }
  // n values at p, once the calling thread's work is done.
  template <class T>
  std::vector<T> get(const T* p, size_t n) {
    be_->synchronize();
    std::vector<T> host(n);
    if (n) be_->copy(host.data(), p, n * sizeof(T));
    return host;
  }
  TensorView view(void* p, DType dt, int64_t n) {
    TensorView v(p, dt, Shape{n});
    v.device = be_->device();
    return v;
  }

 private:
  const ConformanceBackend* spec_ = nullptr;
  std::shared_ptr<detail::Backend> be_, cpu_;
  std::vector<detail::Buffer> keep_;
};

using test::randn;  // tests/unit/test_support.h
inline std::vector<BFloat16> to_bf16(const std::vector<float>& v) {
  std::vector<BFloat16> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16(v[i]);
  return b;
}

// Index of the first element whose bits differ, or -1 (sizes must match).
template <class T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return -1;
}
#define EXPECT_BITWISE(got, want, what)                                                              \
  do {                                                                                              \
    const auto& g_ = (got);                                                                         \
    const auto& w_ = (want);                                                                        \
    ASSERT_EQ(g_.size(), w_.size()) << (what);                                                      \
    const int64_t at_ = ::meshmuon::conformance::first_difference(g_, w_);                          \
    EXPECT_EQ(at_, -1) << (what) << ": first differing element " << at_;                            \
  } while (0)

// ‖a − b‖_F / ‖b‖_F in double.
inline double relative_distance(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) d += double(a[i] - b[i]) * (a[i] - b[i]), r += double(b[i]) * b[i];
  return r == 0 ? std::sqrt(d) : std::sqrt(d / r);
}

}  // namespace meshmuon::conformance
