// Out-of-line throw helpers so that DMUON_CHECK expands to little code at each call site.
#include "dmuon/error.h"

namespace dmuon::detail {

void throw_invalid_argument(const std::string& message) { throw std::invalid_argument(message); }
void throw_error(const std::string& message) { throw Error(message); }

}  // namespace dmuon::detail
