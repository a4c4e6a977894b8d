// Internal: overflow-checked integer arithmetic for sizes computed from user input (shapes, mesh
// sizes, element and byte counts). Each returns false instead of wrapping; callers turn that into an
// error naming the input and the limit.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace meshmuon::detail {

inline bool checked_mul(int64_t a, int64_t b, int64_t& out) { return !__builtin_mul_overflow(a, b, &out); }
inline bool checked_add(int64_t a, int64_t b, int64_t& out) { return !__builtin_add_overflow(a, b, &out); }

// The product of non-negative extents, exactly, when it is at most `limit`; false otherwise.
inline bool checked_product(std::span<const int64_t> extents, int64_t limit, int64_t& out) {
  bool zero = false;
  for (int64_t e : extents) zero |= e == 0;
  if (zero) return out = 0, true;  // a zero extent wins over any overflow of the others
  int64_t n = 1;
  for (int64_t e : extents)
    if (e < 0 || !checked_mul(n, e, n) || n > limit) return false;
  return out = n, true;
}

// The exact product of non-negative extents as decimal text ("more than 2^127" past __int128),
// for error messages about products that overflow.
inline std::string product_text(std::span<const int64_t> extents) {
  unsigned __int128 n = 1;
  for (int64_t e : extents) {
    if (e == 0) return "0";
    if (e < 0 || __builtin_mul_overflow(n, static_cast<unsigned __int128>(e), &n)) return "more than 2^127";
  }
  char digits[40];  // 2^128 has 39 digits
  int at = 40;
  do digits[--at] = static_cast<char>('0' + static_cast<int>(n % 10)); while ((n /= 10) > 0);
  return std::string(digits + at, digits + 40);
}

}  // namespace meshmuon::detail
