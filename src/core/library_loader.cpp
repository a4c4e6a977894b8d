// Internal: the search for a library loaded at run time (library_loader.h).
#include "core/library_loader.h"

namespace meshmuon::detail {

std::string OpenedLibrary::tried() const {
  std::string s;
  for (const LibraryAttempt& f : failures) s += (s.empty() ? "" : ", ") + f.name + " (" + f.why + ")";
  return s;
}

OpenedLibrary open_first_library(std::span<const char* const> candidates, int flags, const AcceptLibrary& accept) {
  OpenedLibrary lib;
  for (const char* name : candidates) {
    if (name == nullptr || *name == '\0') continue;
    void* h = dlopen(name, flags);
    if (h == nullptr) {
      const char* why = dlerror();
      lib.failures.push_back({name, why != nullptr ? why : "not found", false});
      continue;
    }
    std::string refused = accept ? accept(h, name) : std::string();
    if (!refused.empty()) {
      lib.failures.push_back({name, std::move(refused), true});
      dlclose(h);
      continue;
    }
    lib.handle = h;
    lib.name = name;
    return lib;
  }
  return lib;
}

}  // namespace meshmuon::detail
