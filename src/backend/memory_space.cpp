// Memory spaces (memory_space.h): the host one and the default choice.
#include "backend/memory_space.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "meshmuon/error.h"

namespace meshmuon::detail {

MemorySpace::~MemorySpace() = default;

#ifndef MESHMUON_HAVE_CUDA
void wait_on_host(DeviceEvent e, std::string_view who) {
  MESHMUON_CHECK_RUNTIME(e.empty(), "[", who, "] order_after was given a CUDA event, but meshmuon was built without CUDA");
}
#endif

namespace {

class HostMemorySpace final : public MemorySpace {
 public:
  std::string_view name() const override { return "host"; }
  bool has_devices() const override { return false; }
  bool is_device(const void*) const override { return false; }
  void* alloc_pinned(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    MESHMUON_CHECK_RUNTIME(p != nullptr, "[comm] out of host memory staging ", bytes, " bytes");
    return p;
  }
  void free_pinned(void* p) noexcept override { std::free(p); }
  void copy_to_host(void* host, const void* device, size_t bytes) override {
    if (bytes) std::memcpy(host, device, bytes);
  }
  void copy_to_device(void* device, const void* host, size_t bytes) override {
    if (bytes) std::memcpy(device, host, bytes);
  }
};

}  // namespace

std::shared_ptr<MemorySpace> host_memory_space() {
  static const std::shared_ptr<MemorySpace> space = std::make_shared<HostMemorySpace>();
  return space;
}

std::shared_ptr<MemorySpace> default_memory_space() {
#ifdef MESHMUON_HAVE_CUDA
  if (auto cuda = cuda_memory_space()) return cuda;
#endif
  return host_memory_space();
}

}  // namespace meshmuon::detail
