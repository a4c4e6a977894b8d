// Test support: corrupting a file in place (checkpoint CRC tests).
#pragma once

#include <fstream>
#include <stdexcept>
#include <string>

namespace meshmuon::test {

// XORs `mask` into the byte `from_end` bytes before the end of `path` (1: the last byte); throws
// std::runtime_error when the file cannot be read or rewritten (no GoogleTest: some callers are
// plain MPI programs).
inline void flip_bits_near_end(const std::string& path, int from_end, char mask) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) throw std::runtime_error("flip_bits_near_end: cannot open " + path);
  f.seekg(-from_end, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  c ^= mask;
  f.seekp(-from_end, std::ios::end);
  f.write(&c, 1);
  if (!f) throw std::runtime_error("flip_bits_near_end: cannot rewrite " + path);
}

}  // namespace meshmuon::test
