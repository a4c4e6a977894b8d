// Out-of-line throw helpers so that MESHMUON_CHECK expands to little code at each call site; they
// record where the check fired (path from the source root, e.g. "src/exec/optimizer.cpp:123").
#include <algorithm>
#include <cstring>

#include "meshmuon/error.h"

namespace meshmuon {
namespace {

std::string where(const char* file, int line) {
  if (file == nullptr) return {};
  const char* f = file;
  for (const char* root : {"/src/", "/include/", "/tools/", "/python/", "/tests/"})  // last match wins
    if (const char* p = std::strstr(file, root)) f = std::max(f, p + 1);
  return std::string(f) + ":" + std::to_string(line);
}

}  // namespace

std::string error_location(const std::exception& e) {
  if (const auto* x = dynamic_cast<const Error*>(&e)) return x->where();
  if (const auto* x = dynamic_cast<const InvalidArgument*>(&e)) return x->where();
  return {};
}

namespace detail {

void throw_invalid_argument(const std::string& message, const char* file, int line) {
  throw InvalidArgument(message, where(file, line));
}
void throw_error(const std::string& message, const char* file, int line) { throw Error(message, where(file, line)); }

}  // namespace detail
}  // namespace meshmuon
