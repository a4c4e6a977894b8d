// Internal: backend selection, owning buffers, device names (backend.h).
#include "backend/backend.h"

#include "dmuon/error.h"

namespace dmuon {
std::string to_string(const Device& d) {
  return d.kind == DeviceKind::Cpu ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}
}  // namespace dmuon

namespace dmuon::detail {

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this == &o) return *this;
  reset();
  data_ = o.data_, bytes_ = o.bytes_, kind_ = o.kind_, device_ = o.device_, free_ = std::move(o.free_);
  o.data_ = nullptr, o.bytes_ = 0, o.free_ = nullptr;
  return *this;
}

void Buffer::reset() {
  if (data_ && free_) free_(data_);
  data_ = nullptr, bytes_ = 0, free_ = nullptr;
}

std::shared_ptr<Backend> make_backend(std::string_view name) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cuda") return make_cuda_backend(0);
  throw_invalid_argument(concat("[backend] unknown backend '", name, "'; use cpu or cuda"));
}

}  // namespace dmuon::detail
