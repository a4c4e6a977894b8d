// Placement names: printing and parsing (short forms and DTensor's own spellings).
#include "meshmuon/placement.h"

#include <cctype>
#include <charconv>
#include <vector>

#include "meshmuon/error.h"

namespace meshmuon {

std::string to_string(const Placement& p) {
  switch (p.kind) {
    case PlacementKind::Replicate: return "R";
    case PlacementKind::Shard: return "S(" + std::to_string(p.dim) + ")";
    case PlacementKind::StridedShard:
      return "SS(" + std::to_string(p.dim) + "," + std::to_string(p.split_factor) + ")";
    case PlacementKind::Owned: return "O(" + std::to_string(p.owner) + ")";
  }
  return "?";
}

namespace {

// Parses "name(args)" into name and comma-separated args with spaces removed.
bool split_call(std::string_view text, std::string& name, std::vector<std::string>& args) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  const size_t open = s.find('(');
  if (open == std::string::npos) {
    name = s;
    return true;
  }
  if (s.back() != ')') return false;
  name = s.substr(0, open);
  const std::string inner = s.substr(open + 1, s.size() - open - 2);
  size_t start = 0;
  while (start <= inner.size() && !inner.empty()) {
    const size_t comma = inner.find(',', start);
    std::string a = inner.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t eq = a.find('=');  // keyword form: dim=0, split_factor=4
    if (eq != std::string::npos) a = a.substr(eq + 1);
    args.push_back(a);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return true;
}

bool to_int(const std::string& s, int& out) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc{} && r.ptr == s.data() + s.size();
}

}  // namespace

Placement parse_placement(std::string_view text, std::string_view what) {
  std::string name;
  std::vector<std::string> args;
  const auto bad = [&]() {
    detail::throw_invalid_argument(detail::concat(
        "[layout] ", what, ": unknown placement '", text,
        "'; use R, S(dim), SS(dim,split_factor) or O(owner) (or Replicate(), Shard(d), _StridedShard(d, split_factor=f), Owned(k))"));
  };
  if (!split_call(text, name, args)) bad();
  int dim = 0, factor = 0;
  if ((name == "R" || name == "Replicate") && args.empty()) return Placement::replicate();
  if ((name == "S" || name == "Shard") && args.size() == 1 && to_int(args[0], dim)) {
    MESHMUON_CHECK(dim >= 0, "[layout] ", what, ": shard dim ", dim, " is negative");
    return Placement::shard(dim);
  }
  if ((name == "SS" || name == "StridedShard" || name == "_StridedShard") && args.size() == 2 &&
      to_int(args[0], dim) && to_int(args[1], factor)) {
    MESHMUON_CHECK(dim >= 0, "[layout] ", what, ": shard dim ", dim, " is negative");
    MESHMUON_CHECK(factor >= 1, "[layout] ", what, ": split_factor ", factor, " must be ≥ 1");
    return Placement::strided_shard(dim, factor);
  }
  if ((name == "O" || name == "Owned") && args.size() == 1 && to_int(args[0], dim)) {
    MESHMUON_CHECK(dim >= 0, "[layout] ", what, ": owner ", dim, " is negative");
    return Placement::owned(dim);
  }
  bad();
  return {};
}

}  // namespace meshmuon
