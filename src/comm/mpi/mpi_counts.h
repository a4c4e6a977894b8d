// MPI's count limit, kept in the mpi backend: counts and displacements are C ints. The arithmetic
// that lets larger operations through (pieces, or a contiguous unit type); no mpi.h, unit-tested.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <span>
#include <vector>

namespace meshmuon::detail {

inline constexpr int64_t kMpiMaxCount = INT_MAX;  // 2^31-1 elements per count or displacement

struct MpiPiece {
  int64_t offset = 0;  // elements from the start of the buffer
  int count = 0;
};

// Consecutive pieces of at most `limit` elements covering [0, count); one empty piece for count 0
// (the op is still posted, so both ends of a send/recv agree on the number of messages).
inline std::vector<MpiPiece> mpi_pieces(int64_t count, int64_t limit = kMpiMaxCount) {
  std::vector<MpiPiece> out;
  int64_t at = 0;
  do {
    const int64_t n = std::min(limit, count - at);
    out.push_back({at, static_cast<int>(n)});
    at += n;
  } while (at < count);
  return out;
}

// The number of elements per MPI datatype unit that makes every value (counts, displacements) fit
// in `limit` units: 1 when they already fit, else their gcd when that is enough (and itself fits);
// 0 when no common unit works (the caller reports the limit).
inline int64_t mpi_unit(std::initializer_list<std::span<const int64_t>> values, int64_t limit = kMpiMaxCount) {
  int64_t max = 0, g = 0;
  for (std::span<const int64_t> v : values)
    for (int64_t x : v) max = std::max(max, x), g = std::gcd(g, x);
  if (max <= limit) return 1;
  return g <= limit && max / g <= limit ? g : 0;
}

}  // namespace meshmuon::detail
