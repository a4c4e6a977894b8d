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

#include "dmuon/export.h"

namespace dmuon {

// A run-time failure (as opposed to a caller mistake, which is std::invalid_argument).
class DMUON_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

[[noreturn]] DMUON_API void throw_invalid_argument(const std::string& message);
[[noreturn]] DMUON_API void throw_error(const std::string& message);

}  // namespace detail
}  // namespace dmuon

// DMUON_CHECK(cond, "[area] parameter '", name, "' ...") throws std::invalid_argument when cond is false.
#define DMUON_CHECK(cond, ...)                                                   \
  do {                                                                           \
    if (!(cond)) ::dmuon::detail::throw_invalid_argument(::dmuon::detail::concat(__VA_ARGS__)); \
  } while (0)

// DMUON_CHECK_RUNTIME(cond, ...) throws dmuon::Error when cond is false.
#define DMUON_CHECK_RUNTIME(cond, ...)                                           \
  do {                                                                           \
    if (!(cond)) ::dmuon::detail::throw_error(::dmuon::detail::concat(__VA_ARGS__)); \
  } while (0)
