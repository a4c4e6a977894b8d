// Internal: backend selection by device name and its test hook (select.h).
#include "backend/select.h"

#include <charconv>
#include <optional>
#include <string>

#include "meshmuon/error.h"

namespace meshmuon::detail {
namespace {

thread_local std::optional<EngineDevice> tl_injected;

}  // namespace

EngineDevice select_device(std::string_view device) {
  const BackendRegistry& registry = backend_registry();
  const size_t colon = device.find(':');
  const std::string_view name = device.substr(0, colon);
  int index = 0;
  bool ok = !name.empty() && registry.registered(name);
  if (ok && colon != std::string_view::npos) {
    const std::string_view digits = device.substr(colon + 1);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    ok = registry.indexed(name) && !digits.empty() && ec == std::errc() && end == digits.data() + digits.size() &&
         index >= 0;
  }
  MESHMUON_CHECK(ok, "[backend] option 'device' must be ", registry.device_names(), " (got '", device, "')");
  return registry.make(name, index);
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
