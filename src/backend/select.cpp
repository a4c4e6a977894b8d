// Internal: backend selection by device name and its test hook (select.h).
#include "backend/select.h"

#include <optional>
#include <string>

#include "meshmuon/error.h"

namespace meshmuon::detail {
namespace {

thread_local std::optional<EngineDevice> tl_injected;

}  // namespace

EngineDevice select_device(std::string_view device) {
  const std::optional<Device> d = parse_device(device);
  MESHMUON_CHECK(d.has_value(), "[backend] option 'device' must be cpu, cuda or cuda:N (got '", device, "')");
  if (d->kind == DeviceKind::Cpu) return {make_cpu_backend(), host_memory_space()};
  std::shared_ptr<Backend> backend = make_cuda_backend(d->index);
  return {std::move(backend), default_memory_space()};
}

EngineDevice resolve_engine_device(std::string_view device) {
  if (tl_injected) return *tl_injected;
  return select_device(device);
}

ScopedEngineDevice::ScopedEngineDevice(EngineDevice d) {
  MESHMUON_CHECK(d.backend && d.space, "[optim] internal: an injected engine device needs a backend and a memory space");
  if (tl_injected) previous_ = *tl_injected, had_previous_ = true;
  tl_injected = std::move(d);
}

ScopedEngineDevice::~ScopedEngineDevice() {
  if (had_previous_) tl_injected = std::move(previous_);
  else tl_injected.reset();
}

}  // namespace meshmuon::detail
