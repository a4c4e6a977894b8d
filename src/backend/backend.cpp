// Internal: backend selection, owning buffers, device names (backend.h).
#include "backend/backend.h"

#include <charconv>
#include <string>

#include "meshmuon/error.h"

namespace meshmuon {
std::string to_string(const Device& d) {
  return d.kind == DeviceKind::Cpu ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

std::optional<Device> parse_device(std::string_view name) {
  if (name == "cpu") return Device{};
  if (name == "cuda") return Device{DeviceKind::Cuda, 0};
  if (!name.starts_with("cuda:")) return std::nullopt;
  const std::string_view digits = name.substr(5);
  int index = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || index < 0) return std::nullopt;
  return Device{DeviceKind::Cuda, index};
}
}  // namespace meshmuon

namespace meshmuon::detail {

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this == &o) return *this;
  reset();
  data_ = o.data_, bytes_ = o.bytes_, kind_ = o.kind_, device_ = o.device_, free_ = std::move(o.free_);
  o.data_ = nullptr, o.bytes_ = 0, o.free_ = nullptr;
  return *this;
}

void check_ns_method(std::string_view backend, const KernelCaps& caps, const NsOptions& o) {
  for (NsMethod m : caps.ns_methods)
    if (m == o.method) return;
  std::string have;
  for (NsMethod m : caps.ns_methods) have += (have.empty() ? "" : ", ") + std::string(to_string(m));
  throw_invalid_argument(concat("[", backend, "] orthogonalization method '", to_string(o.method),
                                     "' is not implemented by the ", backend, " backend (it implements: ",
                                     have.empty() ? std::string("none") : have, "); set the group's NsOptions::method (Python: ns_method) to one of those, ",
                                     "or run this parameter group on a backend that implements '",
                                     to_string(o.method), "' (cpu)"));
}

void Buffer::reset() {
  if (data_ && free_) free_(data_);
  data_ = nullptr, bytes_ = 0, free_ = nullptr;
}

}  // namespace meshmuon::detail
