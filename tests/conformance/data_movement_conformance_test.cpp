// The data movement of every backend, bitwise the cpu backend's: convert (every fp32 / bf16 pair,
// NaN and infinities), ordered_sum (fp32 and bf16 blocks, 1..4 of them), divide, fill_zero and
// zero, pack on random tables (against pack_reference too), and copy between host and the
// backend's memory and within it. Negative controls: each reference differs from its input.
#include <limits>
#include <random>

#include "backend/pack.h"
#include "conformance.h"

namespace meshmuon::conformance {
namespace {

class DataMovement : public Conformance {};

std::vector<float> specials(size_t n, uint32_t seed) {
  std::vector<float> x = randn(n, seed, 10.0f);
  x[0] = std::numeric_limits<float>::quiet_NaN(), x[1] = -std::numeric_limits<float>::infinity();
  x[2] = -0.0f, x[3] = 3.3e38f, x[4] = 1e-40f, x[5] = 1.00390625f;  // a tie: rounds to even
  return x;
}

TEST_P(DataMovement, Convert) {
  const int64_t n = 10007;
  const std::vector<float> f = specials(static_cast<size_t>(n), 30);
  const std::vector<BFloat16> b = to_bf16(randn(static_cast<size_t>(n), 31));
  for (DType src : {DType::F32, DType::BF16})
    for (DType dst : {DType::F32, DType::BF16}) {
      const size_t src_bytes = static_cast<size_t>(n) * dtype_size(src), dst_bytes = static_cast<size_t>(n) * dtype_size(dst);
      const void* hsrc = src == DType::F32 ? static_cast<const void*>(f.data()) : static_cast<const void*>(b.data());
      std::vector<std::byte> want(dst_bytes, std::byte{0x5a});
      void* dsrc = alloc(src_bytes);
      be().copy(dsrc, hsrc, src_bytes);
      void* ddst = put(want);
      cpu().convert(want.data(), dst, hsrc, src, n);
      be().convert(ddst, dst, dsrc, src, n);
      const std::string what = std::string(to_string(src)) + " -> " + std::string(to_string(dst));
      EXPECT_BITWISE(get(static_cast<std::byte*>(ddst), dst_bytes), want, what);
      EXPECT_NE(first_difference(want, std::vector<std::byte>(dst_bytes, std::byte{0x5a})), -1) << what << ": negative control";
    }
}

TEST_P(DataMovement, OrderedSum) {
  const int64_t n = 4099;
  for (DType dt : {DType::F32, DType::BF16})
    for (int blocks : {1, 2, 4}) {
      const std::vector<float> f = randn(static_cast<size_t>(n * blocks), 40 + uint32_t(blocks), 1e3f);
      const std::vector<BFloat16> b = to_bf16(f);
      const void* h = dt == DType::F32 ? static_cast<const void*>(f.data()) : static_cast<const void*>(b.data());
      const size_t bytes = static_cast<size_t>(n * blocks) * dtype_size(dt);
      void* d = alloc(bytes);
      be().copy(d, h, bytes);
      std::vector<float> want(static_cast<size_t>(n), 7.0f);
      float* dout = put(want);
      cpu().ordered_sum(h, dt, n, blocks, want.data());
      be().ordered_sum(d, dt, n, blocks, dout);
      const std::string what = std::string(to_string(dt)) + " x" + std::to_string(blocks);
      EXPECT_BITWISE(get(dout, static_cast<size_t>(n)), want, what);
      EXPECT_NE(first_difference(want, std::vector<float>(static_cast<size_t>(n), 7.0f)), -1) << what << ": negative control";
    }
}

TEST_P(DataMovement, DivideFillZeroAndZero) {
  std::vector<float> x = specials(20011, 50);
  x[0] = 5.0f;  // no NaN: its payload after a division is the hardware's (a GPU gives its canonical NaN)
  const std::vector<float> x0 = x;
  float* dx = put(x);
  cpu().divide(x.data(), int64_t(x.size()), 3.0f);
  be().divide(dx, int64_t(x.size()), 3.0f);
  EXPECT_BITWISE(get(dx, x.size()), x, "divide");
  EXPECT_NE(first_difference(x, x0), -1) << "negative control";
  // fill_zero and zero over a middle range (bytes not a multiple of 4 words), the rest untouched
  for (bool queued : {false, true}) {
    std::vector<float> h = x0;
    float* d = put(h);
    const size_t from = 13, bytes = 4 * 5001 + 2;
    std::memset(reinterpret_cast<std::byte*>(h.data() + from), 0, bytes);
    if (queued) be().zero(d + from, bytes);
    else be().fill_zero(d + from, bytes);
    EXPECT_BITWISE(get(d, h.size()), h, queued ? "zero" : "fill_zero");
  }
}

TEST_P(DataMovement, PackOnRandomTables) {
  std::mt19937 rng(7);
  const detail::PackConv convs[] = {detail::PackConv::Copy32, detail::PackConv::F32ToBF16, detail::PackConv::BF16ToF32,
                                    detail::PackConv::FillNegZero32, detail::PackConv::FillNegZeroBF16};
  for (int trial = 0; trial < 50; ++trial) {
    constexpr size_t kBytes = 1 << 16;
    std::vector<std::byte> src(kBytes), a(kBytes);
    for (size_t i = 0; i + 4 <= kBytes; i += 4) {
      const float f = std::uniform_real_distribution<float>(-8, 8)(rng);
      std::memcpy(&src[i], &f, 4);
    }
    std::vector<detail::PackRun> runs;
    const int nruns = 1 + int(rng() % 12);
    int64_t dst_at = 0;
    for (int r = 0; r < nruns; ++r) {
      detail::PackRun run;
      run.src = 0, run.dst = 1, run.conv = convs[rng() % 5];
      run.len = int64_t(rng() % 40), run.rows = 1 + int64_t(rng() % 6);
      run.src_stride = run.len * 4 + int64_t(rng() % 3) * 4;
      run.dst_stride = run.len * 4 + int64_t(rng() % 3) * 4;
      run.src_off = int64_t(rng() % 1000) * 4;
      run.dst_off = dst_at;
      dst_at += run.rows * run.dst_stride + 16;
      if (dst_at + 1024 > int64_t(kBytes)) break;
      runs.push_back(run);
    }
    std::vector<std::byte> ref = a, want = a;
    std::byte* dsrc = put(src);
    std::byte* ddst = put(a);
    std::byte* rbases[] = {src.data(), ref.data()};
    std::byte* hbases[] = {src.data(), want.data()};
    std::byte* dbases[] = {dsrc, ddst};
    detail::pack_reference(runs, rbases);
    cpu().pack(runs, hbases);
    be().pack(runs, dbases);
    EXPECT_BITWISE(want, ref, "cpu vs pack_reference, trial " + std::to_string(trial));
    EXPECT_BITWISE(get(ddst, kBytes), want, "trial " + std::to_string(trial));
  }
}

TEST_P(DataMovement, Copy) {
  const std::vector<float> src = randn(3001, 21);
  float* a = put(src);  // host -> backend memory
  float* b = static_cast<float*>(alloc(src.size() * 4));
  be().copy(b, a, src.size() * 4);  // within the backend's memory
  EXPECT_BITWISE(get(b, src.size()), src, "copy");
  std::vector<float> other = randn(3001, 22);
  be().copy(b, other.data(), 4 * 1000);  // a prefix only
  std::vector<float> want = src;
  std::copy(other.begin(), other.begin() + 1000, want.begin());
  EXPECT_BITWISE(get(b, src.size()), want, "copy of a prefix");
  EXPECT_NE(first_difference(want, src), -1) << "negative control";
}

// The comparison every case relies on sees one ulp, a signed zero and another NaN payload.
TEST(ConformanceHarness, BitwiseComparisonSeesOneUlpSignedZeroAndNaNPayload) {
  const std::vector<float> a = randn(1000, 60);
  EXPECT_EQ(first_difference(a, a), -1);
  std::vector<float> b = a;
  b[700] = std::nextafter(b[700], 1e30f);
  EXPECT_EQ(first_difference(a, b), 700);
  std::vector<float> z(3, 0.0f), nz = z;
  nz[1] = -0.0f;
  EXPECT_EQ(first_difference(z, nz), 1);
  std::vector<float> n1(2, std::numeric_limits<float>::quiet_NaN()), n2 = n1;
  uint32_t bits;
  std::memcpy(&bits, &n2[0], 4), bits |= 1, std::memcpy(&n2[0], &bits, 4);
  EXPECT_EQ(first_difference(n1, n2), 0);
  EXPECT_EQ(first_difference(a, std::vector<float>(999)), 0) << "sizes differ";
}

INSTANTIATE_TEST_SUITE_P(Conformance, DataMovement, ::testing::ValuesIn(conformance_backend_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace meshmuon::conformance
