// meshmuon's version (semantic versioning; the installed CMake package carries the same number).
#pragma once

#include <string_view>

namespace meshmuon {
inline constexpr std::string_view kVersion = "0.1.0";
}  // namespace meshmuon
