// Errors raised by meshmuon, and the checks that raise them.
//
// Contract: caller mistakes (bad shapes, options, inputs) throw std::invalid_argument; run-time
// failures (BLAS missing, communication timeouts, non-finite values under the `raise` policy) throw
// meshmuon::Error. Messages start with the area in brackets: "[orth] ...", "[plan] ...". The library never
// calls exit() or abort(); only the CLI turns exceptions into exit codes.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "meshmuon/export.h"

namespace meshmuon {

// A run-time failure (as opposed to a caller mistake, which is std::invalid_argument).
// where(): the source location of the check that fired ("src/exec/optimizer.cpp:123"), or "".
class MESHMUON_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, std::string where = {})
      : std::runtime_error(message), where_(std::move(where)) {}
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

// A caller mistake raised by a meshmuon check: a std::invalid_argument that also says where it fired.
class MESHMUON_API InvalidArgument : public std::invalid_argument {
 public:
  explicit InvalidArgument(const std::string& message, std::string where = {})
      : std::invalid_argument(message), where_(std::move(where)) {}
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

// The location of a throwing check, as where() reports it ("src/...:line", path from the source root).
MESHMUON_API std::string error_location(const std::exception& e);

namespace detail {

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

[[noreturn]] MESHMUON_API void throw_invalid_argument(const std::string& message, const char* file = nullptr, int line = 0);
[[noreturn]] MESHMUON_API void throw_error(const std::string& message, const char* file = nullptr, int line = 0);

}  // namespace detail
}  // namespace meshmuon

// MESHMUON_CHECK(cond, "[area] parameter '", name, "' ...") throws meshmuon::InvalidArgument (a std::invalid_argument)
// when cond is false; its where() names the file and line of the check.
#define MESHMUON_CHECK(cond, ...)                                                   \
  do {                                                                           \
    if (!(cond)) ::meshmuon::detail::throw_invalid_argument(::meshmuon::detail::concat(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)

// MESHMUON_CHECK_RUNTIME(cond, ...) throws meshmuon::Error when cond is false.
#define MESHMUON_CHECK_RUNTIME(cond, ...)                                           \
  do {                                                                           \
    if (!(cond)) ::meshmuon::detail::throw_error(::meshmuon::detail::concat(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)
