// Internal: the engine's backend selection and its test hook (engine_device.h).
#include "exec/engine_device.h"

#include <charconv>
#include <optional>
#include <string>

#include "dmuon/error.h"

namespace dmuon::detail {
namespace {

thread_local std::optional<EngineDevice> tl_injected;

// "cuda" -> 0, "cuda:N" -> N; nullopt when `device` is not a cuda name.
std::optional<int> cuda_index(std::string_view device) {
  if (device == "cuda") return 0;
  if (!device.starts_with("cuda:")) return std::nullopt;
  const std::string_view digits = device.substr(5);
  int index = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || index < 0) return std::nullopt;
  return index;
}

}  // namespace

EngineDevice resolve_engine_device(std::string_view device) {
  if (tl_injected) return *tl_injected;
  if (device == "cpu") return {make_cpu_backend(), host_memory_space()};
  const std::optional<int> index = cuda_index(device);
  DMUON_CHECK(index.has_value(), "[optim] option 'device' must be cpu, cuda or cuda:N (got '", device, "')");
  std::shared_ptr<Backend> backend = make_cuda_backend(*index);
  return {std::move(backend), default_memory_space()};
}

ScopedEngineDevice::ScopedEngineDevice(EngineDevice d) {
  DMUON_CHECK(d.backend && d.space, "[optim] internal: an injected engine device needs a backend and a memory space");
  if (tl_injected) previous_ = *tl_injected, had_previous_ = true;
  tl_injected = std::move(d);
}

ScopedEngineDevice::~ScopedEngineDevice() {
  if (had_previous_) tl_injected = std::move(previous_);
  else tl_injected.reset();
}

}  // namespace dmuon::detail
