// Internal: owning buffers and the refusal of an undeclared orthogonalization method (backend.h).
#include "backend/backend.h"

#include <string>

#include "meshmuon/error.h"

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
