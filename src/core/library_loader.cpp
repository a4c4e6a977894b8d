// Internal: the search for a library loaded at run time (library_loader.h).
#include "core/library_loader.h"

#include <errno.h>  // program_invocation_name
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>

namespace meshmuon::detail {

std::string OpenedLibrary::tried() const {
  std::string s;
  for (const LibraryAttempt& f : failures) s += (s.empty() ? "" : ", ") + f.name + " (" + f.why + ")";
  return s;
}

OpenedLibrary open_first_library(std::span<const char* const> candidates, int flags, const AcceptLibrary& accept,
                                 const PrepareLibrary& prepare) {
  OpenedLibrary lib;
  for (const char* name : candidates) {
    if (name == nullptr || *name == '\0') continue;
    if (prepare) prepare(name);
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

namespace {

std::string resolved(const char* path) {
  if (path == nullptr || *path == '\0') return {};
  char buf[PATH_MAX];
  return realpath(path, buf) != nullptr ? std::string(buf) : std::string();
}

InstallLocation locate() {
  InstallLocation loc;
  Dl_info info{};
  // dladdr names the object holding this function; for code linked into the main executable glibc
  // gives argv[0]'s spelling, which /proc/self/exe resolves reliably.
  const bool found = dladdr(reinterpret_cast<void*>(&install_location), &info) != 0;
  const bool in_executable = found && (info.dli_fname == nullptr || *info.dli_fname == '\0' ||
                                       std::string(info.dli_fname) == program_invocation_name);
  if (found && !in_executable) loc.module = resolved(info.dli_fname);
  if (loc.module.empty()) {
    char buf[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n > 0) loc.module.assign(buf, static_cast<size_t>(n));
  }
  namespace fs = std::filesystem;
  fs::path dir = fs::path(loc.module).parent_path();
  if (dir.filename() == "bin" && dir.parent_path().filename() == "meshmuon") dir = dir.parent_path();  // the CLI
  if (dir.filename() != "meshmuon") return loc;
  const fs::path site = dir.parent_path();
  loc.site_packages = site.string();
  // prefix/lib/pythonX.Y/site-packages -> prefix/lib
  if (site.parent_path().filename().string().rfind("python", 0) == 0) loc.prefix_lib = site.parent_path().parent_path().string();
  return loc;
}

}  // namespace

const InstallLocation& install_location() {
  static const InstallLocation loc = locate();
  return loc;
}

}  // namespace meshmuon::detail
