// Internal: POSIX file operations and CRC-32 for checkpoints (file_io.h).
#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "meshmuon/error.h"

namespace meshmuon::detail {
namespace {

[[noreturn]] void fail(const std::string& path, std::string_view what, int err) {
  throw_error(concat("[checkpoint] ", path, ": ", what, ": ", std::strerror(err)));
}

}  // namespace

File File::open_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open", errno);
  return File(fd, path);
}

File File::create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "cannot create", errno);
  return File(fd, path);
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t File::size() const {
  struct stat st{};
  if (::fstat(fd_, &st) != 0) fail(path_, "cannot stat", errno);
  return static_cast<uint64_t>(st.st_size);
}

void File::write_all(const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(path_, "write failed", errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void File::read_at(void* data, size_t n, uint64_t offset) const {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(path_, "read failed", errno);
    }
    if (r == 0) throw_error(concat("[checkpoint] ", path_, ": truncated (end of file at byte ", offset, ")"));
    p += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
}

void File::sync() {
  if (::fsync(fd_) != 0) fail(path_, "fsync failed", errno);
}

void File::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(path_, "close failed", errno);
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  uLong c = crc;
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const auto k = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    c = ::crc32(c, p, k);
    p += k;
    n -= k;
  }
  return static_cast<uint32_t>(c);
}

uint32_t file_crc32(const File& file, uint64_t size) {
  std::vector<char> block(size_t{4} << 20);
  uint32_t crc = 0;
  for (uint64_t off = 0; off < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), size - off));
    file.read_at(block.data(), n, off);
    crc = crc32_update(crc, block.data(), n);
    off += n;
  }
  return crc;
}

void make_dirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec && !std::filesystem::is_directory(path)) fail(path, "cannot create the directory", ec.value());
}

void rename_file(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail(to, concat("cannot rename ", from, " to it"), errno);
}

void sync_dir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open the directory", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) fail(path, "fsync of the directory failed", err);
}

bool path_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

std::string read_text_file(const std::string& path) {
  File f = File::open_read(path);
  const uint64_t n = f.size();
  std::string text(static_cast<size_t>(n), '\0');
  f.read_at(text.data(), text.size(), 0);
  return text;
}

}  // namespace meshmuon::detail
