// Memory spaces for testing the mpi backend's staging (src/comm/memory_space.h) without a GPU.
// - CountingFakeDeviceSpace: "device" memory is FakeDeviceMemory's PROT_NONE mapping (the fake device
//   backend's, tests/support/fake_device.h), whose writable alias only this space uses for its
//   copies. MPI touching a device pointer directly faults (or fails), so a passing test proves every
//   device byte went through staging.
// - AllDeviceSpace: every pointer counts as device memory (copies are memcpy), so the whole
//   Communicator suite runs through the staged path (MESHMUON_TEST_BACKEND=mpi-staged).
// Both count copies and pinned memory (outstanding and peak) so tests can check the pool's bound.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "../support/fake_device.h"
#include "comm/staging.h"

namespace meshmuon::test {

class CountingSpace : public detail::MemorySpace {
 public:
  bool has_devices() const override { return true; }
  void* alloc_pinned(size_t bytes) override {
    void* p = std::malloc(bytes);
    if (p == nullptr) throw std::bad_alloc();
    pinned_now += bytes;
    pinned_peak = std::max(pinned_peak, pinned_now);
    sizes_.push_back({p, bytes});
    return p;
  }
  void free_pinned(void* p) noexcept override {
    for (auto it = sizes_.begin(); it != sizes_.end(); ++it)
      if (it->first == p) {
        pinned_now -= it->second;
        sizes_.erase(it);
        break;
      }
    std::free(p);
  }
  size_t pinned_now = 0, pinned_peak = 0, to_host = 0, to_device = 0;

 private:
  std::vector<std::pair<void*, size_t>> sizes_;
};

class AllDeviceSpace final : public CountingSpace {
 public:
  std::string_view name() const override { return "all-device (test)"; }
  bool is_device(const void*) const override { return true; }
  void copy_to_host(void* host, const void* device, size_t bytes) override {
    to_host += 1;
    std::memcpy(host, device, bytes);
  }
  void copy_to_device(void* device, const void* host, size_t bytes) override {
    to_device += 1;
    std::memcpy(device, host, bytes);
  }
};

// Device memory from FakeDeviceMemory (tests/support/fake_device.h: PROT_NONE for everyone but
// this space's copies), with the copy and pinned-memory counters of CountingSpace.
class CountingFakeDeviceSpace final : public CountingSpace {
 public:
  explicit CountingFakeDeviceSpace(size_t capacity = size_t{64} << 20) : mem_(capacity) {}
  std::string_view name() const override { return "fake device (test)"; }
  bool is_device(const void* p) const override { return mem_.contains(p); }
  void* allocate(size_t bytes) { return mem_.allocate(bytes); }  // zeroed; freed with the space
  void copy_to_host(void* host, const void* device, size_t bytes) override {
    to_host += 1;
    std::memcpy(host, backing(device, bytes), bytes);
  }
  void copy_to_device(void* device, const void* host, size_t bytes) override {
    to_device += 1;
    std::memcpy(backing(device, bytes), host, bytes);
  }

 private:
  template <class T>
  T* backing(T* device, size_t bytes) const {
    if (!mem_.contains(device) || (bytes > 0 && !mem_.contains(static_cast<const std::byte*>(device) + bytes - 1)))
      throw std::runtime_error("not fake device memory");
    return mem_.alias(device);
  }
  FakeDeviceMemory mem_;
};

}  // namespace meshmuon::test
