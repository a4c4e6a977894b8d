// Internal: the one hasher of meshmuon (FNV-1a 64). Plan fingerprints, per-parameter agreement hashes
// and per-step digests use it, so every rank hashes the same bytes the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace meshmuon::detail {

struct Fnv1a {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  template <class T>
  void pod(const T& v) { bytes(&v, sizeof(v)); }
  void str(std::string_view s) {
    pod(s.size());
    bytes(s.data(), s.size());
  }
};

}  // namespace meshmuon::detail
