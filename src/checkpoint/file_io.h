// Internal: the few POSIX file operations checkpoints need (checkpoint.h), each throwing
// meshmuon::Error "[checkpoint] <path>: <what>: <strerror>" on failure, and zlib's CRC-32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace meshmuon::detail {

// An open file descriptor (closed by the destructor; close() reports errors).
class File {
 public:
  static File open_read(const std::string& path);
  static File create(const std::string& path);  // write-only, created or truncated, mode 0644
  File(File&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  File& operator=(File&&) = delete;
  ~File();

  const std::string& path() const { return path_; }
  uint64_t size() const;                                   // fstat
  void write_all(const void* data, size_t n);              // at the current position
  void read_at(void* data, size_t n, uint64_t offset) const;  // exactly n bytes (short: "truncated")
  void sync();                                             // fsync
  void close();

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// CRC-32 (zlib, the polynomial of gzip and PNG) over any length; start with crc = 0.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);
// CRC-32 of the first `size` bytes of the file, read in blocks.
uint32_t file_crc32(const File& file, uint64_t size);

void make_dirs(const std::string& path);                        // mkdir -p
void rename_file(const std::string& from, const std::string& to);  // rename(2): atomic on POSIX
void sync_dir(const std::string& path);                         // fsync of the directory itself
bool path_exists(const std::string& path);
std::string read_text_file(const std::string& path);            // whole file

}  // namespace meshmuon::detail
