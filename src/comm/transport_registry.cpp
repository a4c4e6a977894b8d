// Internal: the transport registry (transport_registry.h) and its built-in registrations.
#include "comm/transport_registry.h"

#include "meshmuon/error.h"

namespace meshmuon::detail {

void TransportRegistry::add(std::string name, WorldFactory world) {
  MESHMUON_CHECK(!name.empty() && world, "[comm] a registered transport needs a name and a factory");
  std::lock_guard<std::mutex> lock(mu_);
  Entry e{std::move(name), std::move(world), {}};
  for (Entry& old : entries_)
    if (old.name == e.name) return void(old = std::move(e));
  entries_.push_back(std::move(e));
}

void TransportRegistry::add_missing(std::string name, std::string why) {
  MESHMUON_CHECK(!name.empty() && !why.empty(), "[comm] a missing transport needs a name and a reason");
  std::lock_guard<std::mutex> lock(mu_);
  Entry e{std::move(name), {}, std::move(why)};
  for (Entry& old : entries_)
    if (old.name == e.name) return void(old = std::move(e));
  entries_.push_back(std::move(e));
}

std::vector<std::string> TransportRegistry::names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(e.name);
  return out;
}

std::string TransportRegistry::why_missing(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string all;
  for (const Entry& e : entries_) {
    if (e.name == name) return e.why;
    all += (all.empty() ? "" : ", ") + e.name;
  }
  return concat("not registered (registered: ", all, ")");
}

std::unique_ptr<Communicator> TransportRegistry::make_world(std::string_view name) const {
  WorldFactory world;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::string all;
    for (const Entry& e : entries_) {
      if (e.name == name) {
        if (!e.world) throw_error(concat("[", name, "] ", e.why));
        world = e.world;
        break;
      }
      all += (all.empty() ? "" : ", ") + e.name;
    }
    if (!world) throw_invalid_argument(concat("[comm] no transport '", name, "' is registered (registered: ", all, ")"));
  }
  return world();
}

TransportRegistry& transport_registry() {
  static TransportRegistry* registry = [] {
    auto* r = new TransportRegistry;  // never destroyed, as backend_registry()
    register_single_transport(*r);
    register_mpi_transport(*r);
    register_nccl_transport(*r);
    return r;
  }();
  return *registry;
}

}  // namespace meshmuon::detail
