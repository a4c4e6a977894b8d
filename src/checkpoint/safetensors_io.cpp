// Internal: safetensors writer and header reader (safetensors_io.h).
#include "checkpoint/safetensors_io.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <exception>
#include <vector>

#include "meshmuon/error.h"
#include "checkpoint/file_io.h"

namespace meshmuon::detail {
namespace {

// The longest header accepted (safetensors' own limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

[[noreturn]] void bad(std::string_view path, const std::string& what) {
  throw_error(concat("[checkpoint] ", path, ": not a valid safetensors file: ", what));
}

uint64_t tensor_bytes(const SafetensorsTensor& t) {
  return static_cast<uint64_t>(t.shape.numel()) * dtype_size(t.dtype);
}

}  // namespace

std::string_view safetensors_dtype(DType t) { return t == DType::F32 ? "F32" : "BF16"; }

std::string safetensors_header_bytes(std::span<const SafetensorsTensor> tensors,
                                     const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    const uint64_t n = tensor_bytes(t);
    h[t.name] = {{"dtype", safetensors_dtype(t.dtype)},
                 {"shape", std::vector<int64_t>(t.shape.begin(), t.shape.end())},
                 {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  const uint64_t len = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + json;
}

WrittenFile write_safetensors(const std::string& path, std::span<const SafetensorsTensor> tensors,
                              const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header_bytes(tensors, metadata);
  File f = File::create(path);
  WrittenFile w;
  f.write_all(header.data(), header.size());
  w.crc32 = crc32_update(0, header.data(), header.size());
  w.size = header.size();
  std::vector<std::byte> staging;  // device tensors only, kSafetensorsStagingBytes at most
  for (const SafetensorsTensor& t : tensors) {
    const uint64_t n = tensor_bytes(t);
    if (n == 0) continue;
    if (t.device_copy == nullptr) {
      f.write_all(t.data, static_cast<size_t>(n));
      w.crc32 = crc32_update(w.crc32, t.data, static_cast<size_t>(n));
    } else {
      if (staging.empty()) staging.resize(kSafetensorsStagingBytes);
      const auto* src = static_cast<const std::byte*>(t.data);  // device memory: offsets only, never read here
      for (uint64_t done = 0; done < n;) {
        const size_t part = static_cast<size_t>(std::min<uint64_t>(n - done, staging.size()));
        try {
          (*t.device_copy)(staging.data(), src + done, part);
        } catch (const std::exception& e) {
          throw_error(concat("[checkpoint] ", path, ": tensor '", t.name, "': copying ", part,
                             " bytes from device memory failed: ", e.what()));
        }
        f.write_all(staging.data(), part);
        w.crc32 = crc32_update(w.crc32, staging.data(), part);
        done += part;
      }
    }
    w.size += n;
  }
  f.sync();
  f.close();
  return w;
}

SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t file_size, std::string_view path) {
  SafetensorsHeader out;
  out.data_begin = 8 + json.size();
  if (out.data_begin > file_size) bad(path, "the header runs past the end of the file");
  const uint64_t data_size = file_size - out.data_begin;
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    bad(path, concat("header is not JSON (", e.what(), ")"));
  }
  if (!h.is_object()) bad(path, "the header is not a JSON object");
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) bad(path, "__metadata__ is not an object");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) bad(path, concat("__metadata__ '", k, "' is not a string"));
        out.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    const std::string what = concat("tensor '", name, "'");
    if (!v.is_object()) bad(path, what + " is not an object");
    SafetensorsEntry e;
    const auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) bad(path, what + ": no string 'dtype'");
    if (*dt == "F32") e.dtype = DType::F32;
    else if (*dt == "BF16") e.dtype = DType::BF16;
    else bad(path, concat(what, ": dtype ", dt->get<std::string>(), " (meshmuon reads F32 and BF16)"));
    const auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array() || sh->size() > static_cast<size_t>(kMaxDims))
      bad(path, concat(what, ": 'shape' is not an array of at most ", kMaxDims, " extents"));
    std::vector<int64_t> dims;
    for (const auto& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) bad(path, what + ": 'shape' has a bad extent");
      dims.push_back(d.get<int64_t>());
    }
    e.shape = Shape(std::span<const int64_t>(dims));
    const auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      bad(path, what + ": 'data_offsets' is not [begin, end]");
    const uint64_t b = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (b > end || end > data_size)
      bad(path, concat(what, ": data_offsets [", b, ", ", end, ") outside the ", data_size, " data bytes"));
    e.offset = out.data_begin + b;
    e.nbytes = end - b;
    if (e.nbytes != static_cast<uint64_t>(e.shape.numel()) * dtype_size(e.dtype))
      bad(path, concat(what, ": data_offsets hold ", e.nbytes, " bytes, shape ", e.shape.to_string(), " needs ",
                       e.shape.numel() * static_cast<int64_t>(dtype_size(e.dtype))));
    out.tensors.emplace(name, e);
  }
  return out;
}

SafetensorsHeader read_safetensors_header(const File& file, uint64_t file_size) {
  if (file_size < 8) bad(file.path(), concat("truncated: ", file_size, " bytes"));
  unsigned char prefix[8];
  file.read_at(prefix, 8, 0);
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | prefix[i];
  if (len > kMaxHeaderBytes || len > file_size - 8)
    bad(file.path(), concat("header length ", len, " does not fit the file's ", file_size, " bytes"));
  std::string json(static_cast<size_t>(len), '\0');
  file.read_at(json.data(), json.size(), 8);
  return parse_safetensors_header(json, file_size, file.path());
}

}  // namespace meshmuon::detail
