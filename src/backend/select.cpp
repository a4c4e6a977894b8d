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
  const BackendRegistry& registry = backend_registry();
  const std::optional<BackendRegistry::DeviceName> d = registry.parse(device);
  MESHMUON_CHECK(d.has_value(), "[backend] option 'device' must be ", registry.device_names(), " (got '", device, "')");
  return registry.make(d->name, d->index);
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
