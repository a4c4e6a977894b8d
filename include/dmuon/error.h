// Errors raised by dmuon, and the checks that raise them.
//
// Contract: caller mistakes (bad shapes, options, inputs) throw std::invalid_argument; run-time
// failures (BLAS missing, communication timeouts, non-finite values under the `raise` policy) throw
// dmuon::Error. Messages start with the area in brackets: "[orth] ...", "[plan] ...". The library never
// calls exit() or abort(); only the CLI turns exceptions into exit codes.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "dmuon/export.h"

namespace dmuon {

// A run-time failure (as opposed to a caller mistake, which is std::invalid_argument).
// where(): the source location of the check that fired ("src/exec/optimizer.cpp:123"), or "".
class DMUON_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, std::string where = {})
      : std::runtime_error(message), where_(std::move(where)) {}
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

// A caller mistake raised by a dmuon check: a std::invalid_argument that also says where it fired.
class DMUON_API InvalidArgument : public std::invalid_argument {
 public:
  explicit InvalidArgument(const std::string& message, std::string where = {})
      : std::invalid_argument(message), where_(std::move(where)) {}
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

// The location of a throwing check, as where() reports it ("src/...:line", path from the source root).
DMUON_API std::string error_location(const std::exception& e);

namespace detail {

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

[[noreturn]] DMUON_API void throw_invalid_argument(const std::string& message, const char* file = nullptr, int line = 0);
[[noreturn]] DMUON_API void throw_error(const std::string& message, const char* file = nullptr, int line = 0);

}  // namespace detail
}  // namespace dmuon

// DMUON_CHECK(cond, "[area] parameter '", name, "' ...") throws dmuon::InvalidArgument (a std::invalid_argument)
// when cond is false; its where() names the file and line of the check.
#define DMUON_CHECK(cond, ...)                                                   \
  do {                                                                           \
    if (!(cond)) ::dmuon::detail::throw_invalid_argument(::dmuon::detail::concat(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)

// DMUON_CHECK_RUNTIME(cond, ...) throws dmuon::Error when cond is false.
#define DMUON_CHECK_RUNTIME(cond, ...)                                           \
  do {                                                                           \
    if (!(cond)) ::dmuon::detail::throw_error(::dmuon::detail::concat(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)
