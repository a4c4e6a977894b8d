// Internal: an entry point of a dlopen'd library (OpenBLAS, oneDNN, cuBLAS, cuBLASLt, NCCL) into a
// typed function pointer. The one place the cast from dlsym's void* is written.
#pragma once

#include <dlfcn.h>

namespace meshmuon::detail {

// fn = `name` from `handle` (null when the library lacks it); true when found.
template <class F>
bool bind_symbol(void* handle, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(handle, name));
  return fn != nullptr;
}

}  // namespace meshmuon::detail
