// Tensors across the boundary, zero-copy both ways: DLPack arrays in as TensorViews, engine state out
// as torch tensors that alias it. Conversion failures are caller mistakes (ValueError).
#include "bindings.h"
#include "meshmuon/error.h"

namespace meshmuon::python {

namespace {

// DLPack device types (dlpack.h DLDeviceType): the ones meshmuon takes.
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3;

Device array_device(const Array& a, const char* what) {
  const int32_t type = a.device_type();
  if (type == kDLCPU || type == kDLCUDAHost) return Device{};  // pinned host memory is CPU memory
  if (type == kDLCUDA) return Device{DeviceKind::Cuda, a.device_id()};
  detail::throw_invalid_argument(detail::concat("[python] ", what, ": DLPack device type ", type, " (device ",
                                                a.device_id(), ") is not supported; meshmuon takes CPU and CUDA "
                                                "tensors"));
}

}  // namespace

TensorView to_view(const Array& a, const char* what) {
  DType dtype;
  const nb::dlpack::dtype dt = a.dtype();
  if (dt == nb::dtype<float>()) {
    dtype = DType::F32;
  } else if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16 &&
             dt.lanes == 1) {
    dtype = DType::BF16;
  } else {
    detail::throw_invalid_argument(detail::concat("[python] ", what, ": dtype code ", int(dt.code),
                                                  " with ", int(dt.bits),
                                                  " bits is not supported; use float32 or bfloat16"));
  }
  MESHMUON_CHECK(a.ndim() <= static_cast<size_t>(kMaxDims), "[python] ", what, " has ", a.ndim(),
              " dims; at most ", kMaxDims, " are supported");
  Shape shape, strides;
  int64_t dims[kMaxDims], steps[kMaxDims];
  for (size_t i = 0; i < a.ndim(); ++i) {
    dims[i] = static_cast<int64_t>(a.shape(i));
    steps[i] = a.stride(i);
  }
  shape = Shape(std::span<const int64_t>(dims, a.ndim()));
  strides = Shape(std::span<const int64_t>(steps, a.ndim()));
  TensorView v(const_cast<void*>(a.data()), dtype, shape, strides);
  v.device = array_device(a, what);
  return v;
}

TensorView to_cpu_view(const Array& a, const char* what) {
  TensorView v = to_view(a, what);
  MESHMUON_CHECK(v.device.kind == DeviceKind::Cpu, "[python] ", what, " is on ", to_string(v.device),
              "; this function runs on the CPU: pass a CPU tensor (.cpu())");
  return v;
}

std::vector<TensorView> views(const std::vector<Array>& arrays, const char* what) {
  std::vector<TensorView> out;
  out.reserve(arrays.size());
  for (const Array& a : arrays) out.push_back(to_view(a, what));
  return out;
}

std::vector<TensorView> grad_views(const std::vector<Grad>& grads) {
  std::vector<TensorView> out;
  out.reserve(grads.size());
  for (const Grad& g : grads) out.push_back(g ? to_view(*g, "gradient") : TensorView());
  return out;
}

StateTensor state_tensor(const TensorView& v, nb::handle owner) {
  size_t shape[kMaxDims];
  for (int i = 0; i < v.ndim(); ++i) shape[i] = static_cast<size_t>(v.shape[i]);
  // An empty local shard may have no storage: any non-null pointer is fine for 0 elements.
  static float dummy = 0;
  float* data = v.numel() == 0 ? &dummy : v.f32();
  const bool cuda = v.device.kind == DeviceKind::Cuda;
  return StateTensor(data, static_cast<size_t>(v.ndim()), shape, owner, nullptr, nb::dtype<float>(),
                     cuda ? kDLCUDA : kDLCPU, cuda ? v.device.index : 0);
}

}  // namespace meshmuon::python
