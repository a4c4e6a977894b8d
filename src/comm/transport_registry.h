// Internal: the transport registry, the communicator kinds this build has by name ("single", "mpi",
// "nccl"), each with a factory of its world communicator, or the reason it is missing. Each
// transport's unit pair registers it: X.cpp adds the factory, no_X.cpp (the build lacks MPI, NCCL or
// CUDA) adds the reason and what to do, so nothing needs an #ifdef and `meshmuon info` lists them.
// The built-in registrations are explicit calls (transport_registry.cpp), not static initializers.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/comm.h"

namespace meshmuon::detail {

// The transport's world communicator (make_single_communicator(), make_mpi_communicator(), ...).
using WorldFactory = std::function<std::unique_ptr<Communicator>()>;

class TransportRegistry {
 public:
  void add(std::string name, WorldFactory world);         // replaces an entry of that name
  void add_missing(std::string name, std::string why);    // the reason and what to do
  std::vector<std::string> names() const;                 // registration order, available or missing
  // "" when registered and available; its reason when missing; "not registered (...)" otherwise.
  std::string why_missing(std::string_view name) const;
  // The world communicator of `name`: std::invalid_argument for an unregistered name,
  // meshmuon::Error "[<name>] <why>" for a missing one, else the factory's (collective) result.
  std::unique_ptr<Communicator> make_world(std::string_view name) const;

 private:
  struct Entry {
    std::string name;
    WorldFactory world;  // empty when missing
    std::string why;
  };
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

TransportRegistry& transport_registry();

// Each defined by its transport's unit pair.
void register_single_transport(TransportRegistry& r);  // single/single_transport.cpp (always built)
void register_mpi_transport(TransportRegistry& r);     // mpi/mpi_runtime.cpp, or no_mpi.cpp
void register_nccl_transport(TransportRegistry& r);    // nccl/nccl_bootstrap.cpp, or nccl/no_nccl.cpp

}  // namespace meshmuon::detail
