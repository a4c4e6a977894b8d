// Internal: the safetensors format (huggingface/safetensors), as checkpoints write and read it:
//   8 bytes   N, the header length (u64 little-endian)
//   N bytes   JSON: {"<name>": {"dtype": "F32"|"BF16", "shape": [...], "data_offsets": [b, e]}, ...,
//             "__metadata__": {"<k>": "<v>"}}, padded with spaces to a multiple of 8
//   the data  each tensor's bytes (row-major, little-endian) at [8 + N + b, 8 + N + e)
// Writing computes the file's size and CRC-32 as it goes; reading validates the header against the
// file's size. Errors: meshmuon::Error "[checkpoint] <path>: ...".
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "meshmuon/dtype.h"
#include "meshmuon/tensor.h"

namespace meshmuon::detail {

class File;

std::string_view safetensors_dtype(DType t);  // "F32", "BF16"

// One tensor to write: contiguous data of shape.numel() elements (may be null when empty). With
// `device_copy` set, `data` is device memory: the host never reads it, its bytes are copied
// (device_copy(host_dst, device_src, bytes)) into a bounded host staging buffer, at most
// kSafetensorsStagingBytes at a time, and written from there.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;
  const std::function<void(void*, const void*, size_t)>* device_copy = nullptr;
};

inline constexpr size_t kSafetensorsStagingBytes = size_t{8} << 20;

struct WrittenFile {
  uint64_t size = 0;
  uint32_t crc32 = 0;
};

// The header bytes (length prefix + padded JSON) of a file holding `tensors` in this order.
std::string safetensors_header_bytes(std::span<const SafetensorsTensor> tensors,
                                     const std::map<std::string, std::string>& metadata);
// Creates (truncates) `path`, writes header and data, fsyncs and closes it.
WrittenFile write_safetensors(const std::string& path, std::span<const SafetensorsTensor> tensors,
                              const std::map<std::string, std::string>& metadata);

struct SafetensorsEntry {
  DType dtype = DType::F32;
  Shape shape;
  uint64_t offset = 0;  // absolute, in the file
  uint64_t nbytes = 0;
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry, std::less<>> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_begin = 0;  // 8 + N
};

// Parses and validates the header of a file of `file_size` bytes (JSON text `json`): dtypes known,
// shapes of at most kMaxDims non-negative extents, offsets inside the data and matching the shape.
SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t file_size, std::string_view path);
// Reads the length prefix and header of an open file (of `file_size` bytes) and parses it.
SafetensorsHeader read_safetensors_header(const File& file, uint64_t file_size);

}  // namespace meshmuon::detail
