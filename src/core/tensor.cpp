// Shape and TensorView basics.
#include "meshmuon/tensor.h"

#include <string>

namespace meshmuon {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  MESHMUON_CHECK(dims.size() <= static_cast<size_t>(kMaxDims), "[tensor] shape has ", dims.size(),
              " dims; meshmuon supports at most ", kMaxDims);
  ndim_ = static_cast<int>(dims.size());
  for (int i = 0; i < ndim_; ++i) {
    MESHMUON_CHECK(dims[i] >= 0, "[tensor] shape extent ", dims[i], " at dim ", i, " is negative");
    dims_[i] = dims[i];
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[i];
  return n;
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (int i = 0; i < ndim_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides = shape;
  int64_t stride = 1;
  for (int i = shape.ndim() - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

TensorView::TensorView(void* data, DType dtype, Shape shape)
    : data(data), dtype(dtype), shape(shape), strides(contiguous_strides(shape)) {}

TensorView::TensorView(void* data, DType dtype, Shape shape, Shape strides)
    : data(data), dtype(dtype), shape(shape), strides(strides) {
  MESHMUON_CHECK(strides.ndim() == shape.ndim(), "[tensor] strides ", strides.to_string(),
              " do not match shape ", shape.to_string());
}

bool TensorView::is_contiguous() const {
  // Extents of 1 (and empty tensors) place no constraint on strides, as in PyTorch.
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

float* TensorView::f32() const {
  MESHMUON_CHECK(dtype == DType::F32, "[tensor] expected an fp32 tensor, got ", to_string(dtype));
  return static_cast<float*>(data);
}

BFloat16* TensorView::bf16() const {
  MESHMUON_CHECK(dtype == DType::BF16, "[tensor] expected a bf16 tensor, got ", to_string(dtype));
  return static_cast<BFloat16*>(data);
}

}  // namespace meshmuon
