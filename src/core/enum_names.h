// Internal: a closed enum's names (its CLI / JSON / Python spellings), written once per enum as a
// table of {value, name} pairs; name_of is its to_string, parse_name its parser.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "meshmuon/error.h"

namespace meshmuon::detail {

template <class E, size_t N>
using NameTable = std::pair<E, std::string_view>[N];

// "?" for a value the table lacks (a cast out of range).
template <class E, size_t N>
std::string_view name_of(const NameTable<E, N>& table, E value) {
  for (const auto& [v, name] : table)
    if (v == value) return name;
  return "?";
}

// Throws std::invalid_argument "<area> unknown <what> '<name>'; use <every name>".
template <class E, size_t N>
E parse_name(const NameTable<E, N>& table, std::string_view name, std::string_view area, std::string_view what) {
  std::string choices;
  for (const auto& [v, n] : table) {
    if (n == name) return v;
    choices += choices.empty() ? "" : ", ";
    choices += n;
  }
  throw_invalid_argument(concat(area, " unknown ", what, " '", name, "'; use ", choices));
}

}  // namespace meshmuon::detail
