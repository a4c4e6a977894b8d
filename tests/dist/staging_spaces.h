// Memory spaces for testing the mpi backend's staging (src/comm/memory_space.h) without a GPU.
// - FakeDeviceSpace: "device" memory is a PROT_NONE mapping of a memfd whose second, writable
//   mapping only this space uses for its copies. MPI touching a device pointer directly faults (or
//   fails), so a passing test proves every device byte went through staging.
// - AllDeviceSpace: every pointer counts as device memory (copies are memcpy), so the whole
//   Communicator suite runs through the staged path (DMUON_TEST_BACKEND=mpi-staged).
// Both count copies and pinned memory (outstanding and peak) so tests can check the pool's bound.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "comm/memory_space.h"

namespace dmuon::test {

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

class FakeDeviceSpace final : public CountingSpace {
 public:
  explicit FakeDeviceSpace(size_t capacity = size_t{64} << 20) : capacity_(capacity) {
    const int fd = memfd_create("dmuon-fake-device", 0);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(capacity)) != 0) throw std::runtime_error("memfd");
    device_ = static_cast<std::byte*>(mmap(nullptr, capacity, PROT_NONE, MAP_SHARED, fd, 0));
    backing_ = static_cast<std::byte*>(mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    if (device_ == MAP_FAILED || backing_ == MAP_FAILED) throw std::runtime_error("mmap");
  }
  ~FakeDeviceSpace() override {
    munmap(device_, capacity_);
    munmap(backing_, capacity_);
  }
  std::string_view name() const override { return "fake device (test)"; }
  bool is_device(const void* p) const override {
    const auto* b = static_cast<const std::byte*>(p);
    return b >= device_ && b < device_ + capacity_;
  }
  // Device memory (bump allocation, 64-byte aligned; freed with the space).
  void* allocate(size_t bytes) {
    used_ = (used_ + 63) / 64 * 64;
    if (used_ + bytes > capacity_) throw std::runtime_error("fake device full");
    void* p = device_ + used_;
    used_ += std::max<size_t>(bytes, 1);
    return p;
  }
  void copy_to_host(void* host, const void* device, size_t bytes) override {
    to_host += 1;
    std::memcpy(host, backing(device, bytes), bytes);
  }
  void copy_to_device(void* device, const void* host, size_t bytes) override {
    to_device += 1;
    std::memcpy(backing(device, bytes), host, bytes);
  }

 private:
  std::byte* backing(const void* device, size_t bytes) const {
    const auto* d = static_cast<const std::byte*>(device);
    if (!is_device(d) || d + bytes > device_ + capacity_) throw std::runtime_error("not fake device memory");
    return backing_ + (d - device_);
  }
  size_t capacity_, used_ = 0;
  std::byte* device_ = nullptr;
  std::byte* backing_ = nullptr;
};

}  // namespace dmuon::test
