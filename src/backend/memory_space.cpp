// Memory spaces (memory_space.h): the host one and the default choice.
#include "backend/memory_space.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "backend/registry.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {

MemorySpace::~MemorySpace() = default;

void MemorySpace::wait_on_host(DeviceEvent e, std::string_view who) {
  MESHMUON_CHECK_RUNTIME(e.empty(), "[", who, "] order_after was given a device event, but memory space '", name(),
                         "' has no device (no device backend of this build can run in this process)");
}

void MemorySpace::check_device_index(int index, std::string_view who) const {
  MESHMUON_CHECK(index == 0, who, ": memory space '", name(), "' has one device; name index 0");
}

void wait_on_host(DeviceEvent e, std::string_view who) {
  if (!e.empty()) default_memory_space()->wait_on_host(e, who);
}

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
  if (auto device = backend_registry().device_space()) return device;
  return host_memory_space();
}

}  // namespace meshmuon::detail
