// Internal: opening a library loaded at run time (OpenBLAS, oneDNN, cuBLAS, cuBLASLt, NCCL): try the
// candidate names with dlopen until one loads and its caller accepts it, recording why each other
// one failed. The one place that search is written; each caller keeps its candidates, its
// environment override and its error message. Entry points are then taken with dl_symbol.h.
#pragma once

#include <dlfcn.h>

#include <functional>
#include <span>
#include <string>
#include <vector>

namespace meshmuon::detail {

// A candidate that was tried and not kept.
struct LibraryAttempt {
  std::string name;
  std::string why;      // dlerror()'s text, or the reason `accept` refused the library with
  bool opened = false;  // dlopen succeeded and `accept` refused it (the handle was closed again)
};

struct OpenedLibrary {
  void* handle = nullptr;                // null: no candidate was kept
  std::string name;                      // the candidate kept
  std::vector<LibraryAttempt> failures;  // the candidates tried and not kept, in order
  // "name (why), name (why)": the failures as the callers' error messages list them; "" if none.
  std::string tried() const;
};

// Called with each library that opened: "" keeps it; else the reason to refuse it (it is closed and
// the next candidate tried). It may take the library's entry points from the handle.
using AcceptLibrary = std::function<std::string(void* handle, const char* name)>;

// Called with each candidate just before it is opened (e.g. to load, by path, the neighbours a
// library without RUNPATH needs: PyPI's oneDNN).
using PrepareLibrary = std::function<void(const char* name)>;

// Tries `candidates` in order (null and empty names skipped) with dlopen(name, flags) and returns the
// first that opens and that `accept` (when given) keeps; its handle stays open for the process.
// `prepare` (when given) runs before each try. Never throws: the caller words the error from the result.
OpenedLibrary open_first_library(std::span<const char* const> candidates, int flags = RTLD_NOW | RTLD_LOCAL,
                                 const AcceptLibrary& accept = {}, const PrepareLibrary& prepare = {});

// Where meshmuon's code was loaded from, to find the libraries a pip install puts beside it (a wheel's
// dependencies come from PyPI: scipy-openblas32 under site-packages, oneDNN and Open MPI under the
// environment's prefix/lib). All three are "" when meshmuon is not inside an installed `meshmuon`
// package (a build tree, libmeshmuon.so in /usr/local): the plain sonames are tried then.
struct InstallLocation {
  std::string module;         // the shared object or executable holding this code (resolved path)
  std::string site_packages;  // .../site-packages when module is .../site-packages/meshmuon[/bin]/x
  std::string prefix_lib;     // the environment's lib folder: site_packages/../../../lib (a venv's, conda's)
};
const InstallLocation& install_location();

}  // namespace meshmuon::detail
