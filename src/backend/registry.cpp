// Internal: the backend registry (registry.h) and its built-in registrations.
#include "backend/registry.h"

#include <charconv>
#include <stdexcept>

#include "meshmuon/error.h"

namespace meshmuon::detail {

void BackendRegistry::add(std::string name, BackendFactory make, bool indexed, SpaceProbe space, std::string label) {
  MESHMUON_CHECK(!name.empty() && make, "[backend] a registered backend needs a name and a factory");
  std::lock_guard<std::mutex> lock(mu_);
  Entry e{std::move(name), std::move(make), indexed, std::move(space), {}, std::move(label)};
  for (Entry& old : entries_)
    if (old.name == e.name) return void(old = std::move(e));
  entries_.push_back(std::move(e));
}

void BackendRegistry::add_missing(std::string name, std::string why, bool indexed, std::string label) {
  MESHMUON_CHECK(!name.empty() && !why.empty(), "[backend] a missing backend needs a name and a reason");
  std::lock_guard<std::mutex> lock(mu_);
  Entry e{std::move(name), {}, indexed, {}, std::move(why), std::move(label)};
  for (Entry& old : entries_)
    if (old.name == e.name) return void(old = std::move(e));
  entries_.push_back(std::move(e));
}

void BackendRegistry::remove(std::string_view name) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(entries_, [&](const Entry& e) { return e.name == name; });
}

const BackendRegistry::Entry* BackendRegistry::find(std::string_view name) const {
  for (const Entry& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

std::vector<std::string> BackendRegistry::names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(e.name);
  return out;
}

std::string BackendRegistry::why_missing(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (const Entry* e = find(name)) return e->why;
  std::string all;
  for (const Entry& e : entries_) all += (all.empty() ? "" : ", ") + e.name;
  return concat("not registered (registered: ", all, ")");
}

bool BackendRegistry::registered(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return find(name) != nullptr;
}

std::string BackendRegistry::label(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Entry* e = find(name);
  return e != nullptr && !e->label.empty() ? e->label : std::string(name);
}

bool BackendRegistry::indexed(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Entry* e = find(name);
  return e != nullptr && e->indexed;
}

EngineDevice BackendRegistry::make(std::string_view name, int device_index) const {
  BackendFactory make;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Entry* e = find(name);
    if (e == nullptr) {
      std::string all;
      for (const Entry& x : entries_) all += (all.empty() ? "" : ", ") + x.name;
      throw_invalid_argument(concat("[backend] no backend '", name, "' is registered (registered: ", all, ")"));
    }
    if (!e->make) throw_error(concat("[", name, "] ", e->why));
    make = e->make;
  }
  return make(device_index);
}

bool BackendRegistry::device_found(std::string_view name) const {
  SpaceProbe probe;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Entry* e = find(name);
    if (e == nullptr || !e->make) return false;
    probe = e->space;
  }
  return !probe || probe() != nullptr;  // probed outside the lock, as device_space()
}

std::shared_ptr<MemorySpace> BackendRegistry::device_space() const {
  std::vector<SpaceProbe> probes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : entries_)
      if (e.space) probes.push_back(e.space);
  }
  for (const SpaceProbe& p : probes)
    if (auto s = p()) return s;
  return nullptr;
}

std::optional<BackendRegistry::DeviceName> BackendRegistry::parse(std::string_view device) const {
  const size_t colon = device.find(':');
  const std::string_view name = device.substr(0, colon);
  if (name.empty() || !registered(name)) return std::nullopt;
  int index = 0;
  if (colon != std::string_view::npos) {
    const std::string_view digits = device.substr(colon + 1);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (!indexed(name) || digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || index < 0)
      return std::nullopt;
  }
  return DeviceName{std::string(name), index};
}

std::string BackendRegistry::device_names() const {
  std::vector<std::string> items;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : entries_) {
      items.push_back(e.name);
      if (e.indexed) items.push_back(e.name + ":N");
    }
  }
  std::string out;
  for (size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + items[i];
  return out;
}

BackendRegistry& backend_registry() {
  static BackendRegistry* registry = [] {
    auto* r = new BackendRegistry;  // never destroyed: backends may be made during static destruction
    register_cpu_backend(*r);
    register_cuda_backend(*r);
    return r;
  }();
  return *registry;
}

}  // namespace meshmuon::detail
