// Shapes and non-owning tensor views: the currency of every meshmuon kernel and API.
//
// A TensorView is a pointer, a dtype, a shape and element strides (row-major when contiguous). It
// never owns memory; the caller keeps the buffer alive for the duration of the call that receives the
// view. Kernels state whether they read or write a view and whether outputs may alias inputs.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "meshmuon/device.h"
#include "meshmuon/dtype.h"
#include "meshmuon/error.h"
#include "meshmuon/export.h"

namespace meshmuon {

inline constexpr int kMaxDims = 4;

// Up to kMaxDims extents. Extents may be 0 (empty shards); negative extents are rejected.
class MESHMUON_API Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + ndim_; }
  std::string to_string() const;  // "[1024, 4096]"

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.ndim_ != b.ndim_) return false;
    for (int i = 0; i < a.ndim_; ++i)
      if (a.dims_[i] != b.dims_[i]) return false;
    return true;
  }

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

// Row-major element strides of a contiguous tensor of this shape.
MESHMUON_API Shape contiguous_strides(const Shape& shape);

struct MESHMUON_API TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Shape strides;  // in elements
  Device device;  // where `data` lives (CPU unless a backend says otherwise)

  TensorView() = default;
  TensorView(void* data, DType dtype, Shape shape);  // contiguous
  TensorView(void* data, DType dtype, Shape shape, Shape strides);
  TensorView(float* data, Shape shape) : TensorView(data, DType::F32, shape) {}
  TensorView(BFloat16* data, Shape shape) : TensorView(data, DType::BF16, shape) {}

  int ndim() const { return shape.ndim(); }
  int64_t numel() const { return shape.numel(); }
  // A default-constructed view (no data, no dims): "no tensor". As a gradient it means the
  // parameter has no gradient this step (torch's `grad is None`).
  bool is_none() const { return data == nullptr && shape.ndim() == 0; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;

  // Typed access; throws std::invalid_argument when the dtype differs.
  float* f32() const;
  BFloat16* bf16() const;
};

}  // namespace meshmuon
