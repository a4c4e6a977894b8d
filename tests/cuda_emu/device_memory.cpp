// The emulated GPU's memory (device_memory.h): a PROT_NONE reservation, a first-fit allocator over it,
// and the device scope that opens it while an emulated device operation runs.
#include "device_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

namespace meshmuon::cuda_emu {
namespace {

constexpr size_t kAlign = 256;
constexpr size_t kRegionBytes = size_t{16} << 30;  // address space only (MAP_NORESERVE)

struct State {
  std::mutex mu;
  std::byte* base = nullptr;
  size_t high = 0;                      // bytes of the range ever handed out (protection covers these)
  std::map<size_t, size_t> free_ranges;  // offset -> bytes (coalesced)
  std::map<size_t, size_t> live;         // offset -> bytes asked for (the range checks' limit)
  std::map<const std::byte*, size_t> pinned;
  int scopes = 0;
  bool protect = true;

  State() {
    const char* env = std::getenv("MESHMUON_CUDA_EMU_PROTECT");
    protect = env == nullptr || std::strcmp(env, "0") != 0;
    void* p = mmap(nullptr, kRegionBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "[cuda_emu] cannot reserve %zu bytes of address space\n", kRegionBytes);
      std::abort();
    }
    base = static_cast<std::byte*>(p);
    free_ranges[0] = kRegionBytes;
  }
  void set_access(bool open) {
    if (high == 0) return;
    if (mprotect(base, high, open || !protect ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) {
      std::perror("[cuda_emu] mprotect");
      std::abort();
    }
  }
};

State& state() {
  static State* s = new State;  // never destroyed: static destructors may still free device memory
  return *s;
}

size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

namespace {
std::atomic<unsigned long long> g_made[static_cast<size_t>(Made::kCount)];
}  // namespace

unsigned long long made(Made what) { return g_made[static_cast<size_t>(what)].load(); }
void count_made(Made what) { g_made[static_cast<size_t>(what)].fetch_add(1); }

void* device_alloc(size_t bytes) {
  count_made(Made::DeviceAlloc);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const size_t need = round_up(bytes == 0 ? 1 : bytes);
  for (auto it = s.free_ranges.begin(); it != s.free_ranges.end(); ++it) {
    if (it->second < need) continue;
    const size_t off = it->first, left = it->second - need;
    s.free_ranges.erase(it);
    if (left > 0) s.free_ranges[off + need] = left;
    s.live[off] = bytes;
    s.high = std::max(s.high, off + need);
    s.set_access(true);  // uninitialized like cudaMalloc's memory: NaN floats, so a read before a write shows
    std::memset(s.base + off, 0xFF, need);
    s.set_access(s.scopes > 0);
    return s.base + off;
  }
  return nullptr;
}

bool device_free(void* p) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto* b = static_cast<std::byte*>(p);
  if (b < s.base || b >= s.base + kRegionBytes) return false;
  const auto it = s.live.find(static_cast<size_t>(b - s.base));
  if (it == s.live.end()) return false;
  size_t off = it->first, len = round_up(it->second == 0 ? 1 : it->second);
  s.live.erase(it);
  // The whole pages of the freed range go back to the kernel: every access toggle (mprotect) walks
  // the populated pages of the range, so freed memory that stayed populated would slow every
  // emulated operation after it. A later allocation there fills its bytes anyway.
  const size_t page = 4096, first = (off + page - 1) / page * page, last = (off + len) / page * page;
  if (last > first) (void)madvise(s.base + first, last - first, MADV_DONTNEED);
  auto next = s.free_ranges.lower_bound(off);
  if (next != s.free_ranges.end() && next->first == off + len) len += next->second, next = s.free_ranges.erase(next);
  if (next != s.free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) off = prev->first, len += prev->second, s.free_ranges.erase(prev);
  }
  s.free_ranges[off] = len;
  return true;
}

void* pinned_alloc(size_t bytes) {
  count_made(Made::PinnedAlloc);
  void* p = std::aligned_alloc(kAlign, round_up(bytes == 0 ? 1 : bytes));
  if (p == nullptr) return nullptr;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.pinned[static_cast<std::byte*>(p)] = bytes;
  return p;
}

bool pinned_free(void* p) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.pinned.erase(static_cast<std::byte*>(p)) == 0) return false;
  }
  std::free(p);
  return true;
}

size_t device_bytes_in_use() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  size_t used = 0;
  for (const auto& [off, bytes] : s.live) used += round_up(bytes == 0 ? 1 : bytes);
  return used;
}
size_t device_bytes_total() { return kRegionBytes; }

bool is_device(const void* p) {
  const State& s = state();
  const auto* b = static_cast<const std::byte*>(p);
  return b >= s.base && b < s.base + kRegionBytes;
}

// [p, p + bytes) inside one live pinned allocation (bytes 0: p inside it).
bool pinned_range_ok(const void* p, size_t bytes) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto* b = static_cast<const std::byte*>(p);
  auto it = s.pinned.upper_bound(b);
  if (it == s.pinned.begin()) return false;
  --it;
  return b + std::max<size_t>(bytes, 1) <= it->first + std::max<size_t>(it->second, 1);
}

bool is_pinned(const void* p) { return pinned_range_ok(p, 0); }

bool device_range_ok(const void* p, size_t bytes) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto* b = static_cast<const std::byte*>(p);
  if (b < s.base || b >= s.base + kRegionBytes) return false;
  const size_t off = static_cast<size_t>(b - s.base);
  auto it = s.live.upper_bound(off);
  if (it == s.live.begin()) return false;
  --it;
  return off >= it->first && off + bytes <= it->first + it->second;
}

bool fail_access(const std::string& what) {
  std::fprintf(stderr, "[cuda_emu] illegal device access: %s\n", what.c_str());
  return false;
}


bool expect_device(const void* p, size_t bytes, const char* what) {
  if (bytes == 0 || device_range_ok(p, bytes) || pinned_range_ok(p, bytes)) return true;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: %zu bytes at %p are not inside one live device allocation%s", what, bytes, p,
                is_device(p) ? "" : " (host memory a GPU cannot address)");
  return fail_access(buf);
}

DeviceScope::DeviceScope() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.scopes++ == 0) s.set_access(true);
}

DeviceScope::~DeviceScope() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (--s.scopes == 0) s.set_access(false);
}

}  // namespace meshmuon::cuda_emu
