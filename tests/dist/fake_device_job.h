// One rank's device setup for the distributed device tests: the cpu backend on the test's world
// communicator, or (fake) the fake device backend (tests/support/fake_device.h) with the world mpi
// communicator staging through its memory space in small chunks (several rounds per collective),
// injected so that engines and ShardedParams built on this thread while it lives run on it.
// COLLECTIVE when fake: every rank makes the staged communicator.
#pragma once

#include <memory>
#include <optional>

#include "../support/fake_device.h"
#include "comm/staging.h"
#include "backend/select.h"
#include "optimizer_fixture.h"

namespace meshmuon::test {

struct DeviceJob {
  explicit DeviceJob(bool fake) {
    if (!fake) return;
    auto fb = std::make_shared<FakeDeviceBackend>();
    space = fb->space();
    detail::StagingOptions so;
    so.chunk_bytes = 1024;
    world = make_mpi_communicator(space, so);
    backend = fb;
    inject.emplace(detail::EngineDevice{fb, space});
  }

  std::shared_ptr<detail::Backend> backend = detail::make_cpu_backend();
  std::shared_ptr<Communicator> world = shared_comm();
  std::shared_ptr<FakeDeviceSpace> space;  // null on the cpu
  std::optional<detail::ScopedEngineDevice> inject;
};

}  // namespace meshmuon::test
