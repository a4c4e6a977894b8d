// Internal: index.json writer and validating parser (checkpoint_index.h).
#include "checkpoint/index.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <climits>
#include <set>

#include "meshmuon/error.h"

namespace meshmuon::detail {
namespace {

using json = nlohmann::ordered_json;

[[noreturn]] void bad(std::string_view path, std::string_view field, const std::string& what) {
  throw_error(concat("[checkpoint] ", path, ": ", field, ": ", what));
}

json box_to_json(const Box& b) {
  json dims = json::array();
  for (const IndexSet& s : b.dims) {
    json ranges = json::array();
    for (const Range& r : s.ranges()) ranges.push_back({r.begin, r.end});
    dims.push_back(ranges);
  }
  return dims;
}

const json& field(const json& obj, std::string_view name, std::string_view path, const std::string& where) {
  const auto it = obj.find(name);
  if (it == obj.end()) bad(path, where.empty() ? std::string(name) : where + "." + std::string(name), "missing");
  return *it;
}

std::string get_string(const json& obj, std::string_view name, std::string_view path, const std::string& where) {
  const json& v = field(obj, name, path, where);
  if (!v.is_string()) bad(path, where.empty() ? std::string(name) : where + "." + std::string(name), "not a string");
  return v.get<std::string>();
}

int64_t get_int(const json& obj, std::string_view name, std::string_view path, const std::string& where,
                int64_t min = 0) {
  const json& v = field(obj, name, path, where);
  const std::string f = where.empty() ? std::string(name) : where + "." + std::string(name);
  if (!v.is_number_integer()) bad(path, f, "not an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) bad(path, f, "too large");
  const int64_t x = v.get<int64_t>();
  if (x < min) bad(path, f, concat(x, " is below ", min));
  return x;
}

std::map<std::string, std::string> string_map(const json& v, std::string_view path, const std::string& f) {
  if (!v.is_object()) bad(path, f, "not an object");
  std::map<std::string, std::string> out;
  for (const auto& [k, s] : v.items()) {
    if (!s.is_string()) bad(path, f + "." + k, "not a string");
    out[k] = s.get<std::string>();
  }
  return out;
}

// A relative path "<generation>/rank-<r>.safetensors" (nothing that leaves the directory).
bool safe_file_path(std::string_view p, std::string_view generation) {
  if (p.size() <= generation.size() + 1 || p.substr(0, generation.size()) != generation ||
      p[generation.size()] != '/')
    return false;
  const std::string_view rest = p.substr(generation.size() + 1);
  return rest.find('/') == std::string_view::npos && rest != "." && rest != "..";
}

}  // namespace

bool is_generation_name(std::string_view name) {
  if (name.size() < 4 || name[0] != 'g') return false;
  const size_t dash = name.find('-');
  if (dash == std::string_view::npos || dash < 2 || dash + 1 >= name.size()) return false;
  for (size_t i = 1; i < dash; ++i)
    if (name[i] < '0' || name[i] > '9') return false;
  for (size_t i = dash + 1; i < name.size(); ++i)
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  return true;
}

std::string index_to_json(const CheckpointIndex& index) {
  json j;
  j["format"] = kCheckpointFormat;
  j["version"] = kCheckpointVersion;
  j["step"] = index.step;
  j["world_size"] = index.world_size;
  j["mesh"] = index.mesh;
  j["generation"] = index.generation;
  j["metadata"] = json::object();
  for (const auto& [k, v] : index.metadata) j["metadata"][k] = v;
  j["step_counts"] = json::object();
  for (const auto& [k, v] : index.step_counts) j["step_counts"][k] = v;
  j["files"] = json::array();
  for (const IndexFile& f : index.files)
    j["files"].push_back({{"path", f.path}, {"rank", f.rank}, {"size", f.size}, {"crc32", f.crc32}});
  j["tensors"] = json::array();
  for (const IndexTensor& t : index.tensors) {
    json placements = json::array();
    for (const Placement& p : t.placements) placements.push_back(to_string(p));
    json pieces = json::array();
    for (const IndexPiece& p : t.pieces)
      pieces.push_back({{"file", p.file}, {"name", p.name}, {"box", box_to_json(p.box)}});
    j["tensors"].push_back({{"key", t.key},
                            {"dtype", to_string(t.dtype)},
                            {"shape", std::vector<int64_t>(t.shape.begin(), t.shape.end())},
                            {"mesh", t.mesh},
                            {"placements", placements},
                            {"pieces", pieces}});
  }
  return j.dump(1) + "\n";
}

CheckpointIndex parse_index(std::string_view text, std::string_view path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw_error(concat("[checkpoint] ", path, ": not valid JSON (", e.what(), ")"));
  }
  if (!j.is_object()) bad(path, "(top level)", "not a JSON object");
  const std::string format = get_string(j, "format", path, "");
  if (format != kCheckpointFormat) bad(path, "format", concat("'", format, "', expected '", kCheckpointFormat, "'"));
  const int64_t version = get_int(j, "version", path, "");
  if (version != kCheckpointVersion)
    bad(path, "version", concat(version, " (this meshmuon reads version ", kCheckpointVersion, ")"));

  CheckpointIndex idx;
  idx.step = get_int(j, "step", path, "", INT64_MIN);
  idx.world_size = static_cast<int>(get_int(j, "world_size", path, "", 1));
  idx.mesh = get_string(j, "mesh", path, "");
  idx.generation = get_string(j, "generation", path, "");
  if (!is_generation_name(idx.generation)) bad(path, "generation", concat("'", idx.generation, "' is not g<step>-<hex>"));
  if (j.contains("metadata")) idx.metadata = string_map(j["metadata"], path, "metadata");
  if (j.contains("step_counts")) {
    const json& sc = j["step_counts"];
    if (!sc.is_object()) bad(path, "step_counts", "not an object");
    for (const auto& [k, v] : sc.items()) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) bad(path, "step_counts." + k, "not a count");
      idx.step_counts[k] = v.get<int64_t>();
    }
  }

  const json& files = field(j, "files", path, "");
  if (!files.is_array()) bad(path, "files", "not an array");
  std::set<std::string> file_paths;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string where = concat("files[", i, "]");
    const json& f = files[i];
    if (!f.is_object()) bad(path, where, "not an object");
    IndexFile e;
    e.path = get_string(f, "path", path, where);
    if (!safe_file_path(e.path, idx.generation))
      bad(path, where + ".path", concat("'", e.path, "' is not a file of generation ", idx.generation));
    if (!file_paths.insert(e.path).second) bad(path, where + ".path", concat("'", e.path, "' listed twice"));
    e.rank = static_cast<int>(get_int(f, "rank", path, where));
    e.size = static_cast<uint64_t>(get_int(f, "size", path, where));
    const int64_t crc = get_int(f, "crc32", path, where);
    if (crc > int64_t{0xffffffff}) bad(path, where + ".crc32", "above 2^32");
    e.crc32 = static_cast<uint32_t>(crc);
    idx.files.push_back(e);
  }

  const json& tensors = field(j, "tensors", path, "");
  if (!tensors.is_array()) bad(path, "tensors", "not an array");
  std::set<std::string> keys;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const json& t = tensors[i];
    std::string where = concat("tensors[", i, "]");
    if (!t.is_object()) bad(path, where, "not an object");
    IndexTensor e;
    e.key = get_string(t, "key", path, where);
    if (e.key.empty()) bad(path, where + ".key", "empty");
    if (!keys.insert(e.key).second) bad(path, where + ".key", concat("'", e.key, "' listed twice"));
    where = concat("tensor '", e.key, "'");
    const std::string dtype = get_string(t, "dtype", path, where);
    try {
      e.dtype = parse_dtype(dtype);
    } catch (const std::invalid_argument&) {
      bad(path, where + ".dtype", concat("'", dtype, "' (expected fp32 or bf16)"));
    }
    const json& shape = field(t, "shape", path, where);
    if (!shape.is_array() || shape.size() > static_cast<size_t>(kMaxDims))
      bad(path, where + ".shape", concat("not an array of at most ", kMaxDims, " extents"));
    std::vector<int64_t> dims;
    for (const json& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) bad(path, where + ".shape", "bad extent");
      dims.push_back(d.get<int64_t>());
    }
    e.shape = Shape(std::span<const int64_t>(dims));
    if (t.contains("mesh") && t["mesh"].is_string()) e.mesh = t["mesh"].get<std::string>();
    if (t.contains("placements")) {
      const json& pl = t["placements"];
      if (!pl.is_array()) bad(path, where + ".placements", "not an array");
      for (const json& p : pl) {
        if (!p.is_string()) bad(path, where + ".placements", "not a string");
        try {
          e.placements.push_back(parse_placement(p.get<std::string>()));
        } catch (const std::invalid_argument& ex) {
          bad(path, where + ".placements", ex.what());
        }
      }
    }
    const json& pieces = field(t, "pieces", path, where);
    if (!pieces.is_array()) bad(path, where + ".pieces", "not an array");
    for (size_t k = 0; k < pieces.size(); ++k) {
      const std::string pw = concat(where, ".pieces[", k, "]");
      const json& p = pieces[k];
      if (!p.is_object()) bad(path, pw, "not an object");
      IndexPiece piece;
      piece.file = get_string(p, "file", path, pw);
      if (!file_paths.count(piece.file)) bad(path, pw + ".file", concat("'", piece.file, "' is not in 'files'"));
      piece.name = get_string(p, "name", path, pw);
      const json& box = field(p, "box", path, pw);
      if (!box.is_array() || box.size() != dims.size())
        bad(path, pw + ".box", concat("not a list of ", dims.size(), " dims of ranges"));
      for (size_t d = 0; d < dims.size(); ++d) {
        IndexSet set;
        std::vector<Range> ranges;
        if (!box[d].is_array()) bad(path, pw + ".box", concat("dim ", d, " is not a list of ranges"));
        for (const json& r : box[d]) {
          if (!r.is_array() || r.size() != 2 || !r[0].is_number_integer() || !r[1].is_number_integer())
            bad(path, pw + ".box", concat("dim ", d, ": a range is not [begin, end]"));
          const int64_t b = r[0].get<int64_t>(), en = r[1].get<int64_t>();
          if (b < 0 || b >= en || en > dims[d])
            bad(path, pw + ".box", concat("dim ", d, ": range [", b, ", ", en, ") outside [0, ", dims[d], ")"));
          for (const Range& o : ranges)
            if (b < o.end && o.begin < en) bad(path, pw + ".box", concat("dim ", d, ": ranges overlap"));
          ranges.push_back({b, en});
        }
        // local_box produces increasing ranges (IndexSet::append requires them).
        for (const Range& r : ranges) {
          if (!set.empty() && set.ranges().back().end > r.begin)
            bad(path, pw + ".box", concat("dim ", d, ": ranges are not in increasing order"));
          set.append(r);
        }
        piece.box.dims.push_back(set);
      }
      e.pieces.push_back(std::move(piece));
    }
    idx.tensors.push_back(std::move(e));
  }
  return idx;
}

}  // namespace meshmuon::detail
