// The pinned pool and staging options of the mpi backend's staged path (src/comm/memory_space.h):
// buffers are reused, at most pool_bytes stay cached, a request larger than the bound is served and
// given back on release; options from the environment are checked; the host space has no devices.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "comm/staging.h"

namespace meshmuon {
namespace {

class CountingHost final : public detail::MemorySpace {
 public:
  std::string_view name() const override { return "counting"; }
  bool has_devices() const override { return false; }
  bool is_device(const void*) const override { return false; }
  void* alloc_pinned(size_t bytes) override {
    void* p = std::malloc(bytes);
    live[p] = bytes;
    allocs += 1;
    return p;
  }
  void free_pinned(void* p) noexcept override {
    live.erase(p);
    std::free(p);
  }
  void copy_to_host(void*, const void*, size_t) override {}
  void copy_to_device(void*, const void*, size_t) override {}
  size_t held() const {
    size_t n = 0;
    for (const auto& [p, b] : live) n += b;
    return n;
  }
  std::map<void*, size_t> live;
  int allocs = 0;
};

TEST(PinnedPool, ReusesAndKeepsAtMostTheBound) {
  auto space = std::make_shared<CountingHost>();
  {
    detail::PinnedPool pool(space, 4096);
    void* a = pool.acquire(1000);
    pool.release(a);
    void* b = pool.acquire(900);  // the cached block fits: no new allocation
    EXPECT_EQ(b, a);
    EXPECT_EQ(space->allocs, 1);
    void* c = pool.acquire(3000);
    EXPECT_EQ(space->held(), detail::pinned_block_bytes(1000) + detail::pinned_block_bytes(3000));
    pool.release(b);
    pool.release(c);
    EXPECT_LE(space->held(), 4096u);
    void* big = pool.acquire(10000);  // above the bound: served, then given back
    EXPECT_NE(big, nullptr);
    pool.release(big);
    EXPECT_LE(space->held(), 4096u);
    EXPECT_EQ(pool.stats().in_use_bytes, 0u);
    EXPECT_EQ(pool.acquire(0), nullptr);
  }
  EXPECT_TRUE(space->live.empty());  // the pool frees everything it holds
}

TEST(StagingOptions, FromEnvironmentAndChecked) {
  setenv("MESHMUON_STAGING_CHUNK_BYTES", "4096", 1);
  unsetenv("MESHMUON_STAGING_POOL_BYTES");
  detail::StagingOptions o = detail::staging_options_from_env();
  EXPECT_EQ(o.chunk_bytes, 4096u);
  EXPECT_EQ(o.pool_bytes, size_t{64} << 20);
  setenv("MESHMUON_STAGING_POOL_BYTES", "4096", 1);  // below two chunks
  EXPECT_THROW(detail::staging_options_from_env(), std::invalid_argument);
  setenv("MESHMUON_STAGING_CHUNK_BYTES", "-5", 1);
  EXPECT_THROW(detail::staging_options_from_env(), std::invalid_argument);
  unsetenv("MESHMUON_STAGING_CHUNK_BYTES");
  unsetenv("MESHMUON_STAGING_POOL_BYTES");
  EXPECT_EQ(detail::staging_options_from_env().chunk_bytes, size_t{16} << 20);
}

TEST(MemorySpace, HostSpaceHasNoDevices) {
  auto host = detail::host_memory_space();
  int x = 0;
  EXPECT_FALSE(host->has_devices());
  EXPECT_FALSE(host->is_device(&x));
  // Without a usable GPU (this machine, any CPU-only run) the default space is the host one.
  auto def = detail::default_memory_space();
  if (def->name() == "cuda") GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(def->name(), "host");
}

}  // namespace
}  // namespace meshmuon
