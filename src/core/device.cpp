// Device names as used in options, CLI, Python and logs: "cpu", "cuda", "cuda:N" (device.h).
#include "meshmuon/device.h"

#include <charconv>

namespace meshmuon {

std::string to_string(const Device& d) {
  return d.kind == DeviceKind::Cpu ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

std::optional<Device> parse_device(std::string_view name) {
  if (name == "cpu") return Device{};
  if (name == "cuda") return Device{DeviceKind::Cuda, 0};
  if (!name.starts_with("cuda:")) return std::nullopt;
  const std::string_view digits = name.substr(5);
  int index = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || index < 0) return std::nullopt;
  return Device{DeviceKind::Cuda, index};
}

}  // namespace meshmuon
