// Internal: owning buffers (backend.h).
#include "backend/backend.h"

#include <charconv>

#include "meshmuon/error.h"

namespace meshmuon::detail {

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

}  // namespace meshmuon::detail
