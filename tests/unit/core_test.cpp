// Core: bf16 conversion (exhaustive, against PyTorch's rule written independently here), shapes,
// tensor views, dtype names, the BLAS loader. Run: build/bin/core_test
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <fstream>
#include <string>

#include "core/cpu_features.h"
#include "meshmuon/bf16.h"
#include "meshmuon/blas.h"
#include "meshmuon/tensor.h"

namespace {

// Reference fp32 -> bf16 by arithmetic on the exact value (not bit tricks): pick the nearer of the
// two neighbouring bf16 values, ties to the even mantissa; NaN -> 0x7FC0 as PyTorch does.
uint16_t reference_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  if (std::isinf(f) || f == 0.0f) return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16);
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t down = static_cast<uint16_t>(u >> 16);  // truncation toward zero in magnitude
  const uint16_t up = static_cast<uint16_t>(down + 1);    // next magnitude (may become inf)
  const double x = std::fabs(static_cast<double>(f));
  const double lo = std::fabs(static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(down) << 16)));
  const double hi_f = std::fabs(static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(up) << 16)));
  // When `up` is infinity, its "value" for rounding is the next power of two, 2^128.
  const double hi = std::isinf(hi_f) ? std::ldexp(1.0, 128) : hi_f;
  if (x - lo < hi - x) return down;
  if (x - lo > hi - x) return up;
  return (down & 1) ? up : down;
}

TEST(Bf16, ExhaustiveRoundTripOfEveryBf16Value) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const meshmuon::BFloat16 x{static_cast<uint16_t>(b)};
    const float f = meshmuon::bf16_to_float(x);
    ASSERT_EQ(std::bit_cast<uint32_t>(f), b << 16);
    const uint16_t back = meshmuon::float_to_bf16(f).bits;
    if (std::isnan(f)) {
      ASSERT_EQ(back, 0x7FC0) << "bits " << b;
    } else {
      ASSERT_EQ(back, b) << "bits " << b;
    }
  }
}

TEST(Bf16, EveryBf16NeighbourhoodMatchesReference) {
  // For every bf16 value, the fp32 values just above, at the midpoint and just below the midpoint to
  // the next value, and the extremes of the fp32 interval it covers.
  const uint32_t offsets[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000};
  for (uint32_t b = 0; b < 65536; ++b) {
    for (uint32_t off : offsets) {
      const uint32_t u = (b << 16) | off;
      const float f = std::bit_cast<float>(u);
      ASSERT_EQ(meshmuon::float_to_bf16(f).bits, reference_to_bf16(f)) << std::hex << "fp32 bits 0x" << u;
    }
  }
}

TEST(Bf16, SpecialValues) {
  using L = std::numeric_limits<float>;
  EXPECT_EQ(meshmuon::float_to_bf16(0.0f).bits, 0x0000);
  EXPECT_EQ(meshmuon::float_to_bf16(-0.0f).bits, 0x8000);
  EXPECT_EQ(meshmuon::float_to_bf16(L::infinity()).bits, 0x7F80);
  EXPECT_EQ(meshmuon::float_to_bf16(-L::infinity()).bits, 0xFF80);
  EXPECT_EQ(meshmuon::float_to_bf16(L::quiet_NaN()).bits, 0x7FC0);
  EXPECT_EQ(meshmuon::float_to_bf16(-L::quiet_NaN()).bits, 0x7FC0);
  EXPECT_EQ(meshmuon::float_to_bf16(std::bit_cast<float>(0x7F800001u)).bits, 0x7FC0);  // signalling NaN
  EXPECT_EQ(meshmuon::float_to_bf16(L::max()).bits, 0x7F80);                            // rounds to inf
  EXPECT_EQ(meshmuon::float_to_bf16(L::denorm_min()).bits, 0x0000);
  EXPECT_EQ(meshmuon::float_to_bf16(L::min()).bits, 0x0080);
  EXPECT_EQ(meshmuon::float_to_bf16(1.0f).bits, 0x3F80);
  EXPECT_EQ(meshmuon::float_to_bf16(1.00390625f).bits, 0x3F80);   // tie, even stays
  EXPECT_EQ(meshmuon::float_to_bf16(1.01171875f).bits, 0x3F82);   // tie, odd rounds up
  EXPECT_EQ(meshmuon::float_to_bf16(-1.01171875f).bits, 0xBF82);
}

TEST(Bf16, ArrayFormsMatchScalar) {
  std::vector<float> src(1000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::ldexp(static_cast<float>(i) * 1.37f - 600.f, (int)(i % 40) - 20);
  std::vector<meshmuon::BFloat16> mid(src.size());
  std::vector<float> back(src.size());
  meshmuon::float_to_bf16(src.data(), mid.data(), src.size());
  meshmuon::bf16_to_float(mid.data(), back.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(mid[i].bits, meshmuon::float_to_bf16(src[i]).bits);
    ASSERT_EQ(back[i], meshmuon::bf16_to_float(mid[i]));
  }
}

TEST(Shape, BasicsAndErrors) {
  meshmuon::Shape s{2, 0, 5};
  EXPECT_EQ(s.ndim(), 3);
  EXPECT_EQ(s.numel(), 0);
  EXPECT_EQ(s.to_string(), "[2, 0, 5]");
  EXPECT_EQ(meshmuon::contiguous_strides(meshmuon::Shape{2, 3, 4}), (meshmuon::Shape{12, 4, 1}));
  EXPECT_THROW((meshmuon::Shape{1, 2, 3, 4, 5}), std::invalid_argument);
  EXPECT_THROW((meshmuon::Shape{3, -1}), std::invalid_argument);
}

TEST(TensorView, ContiguityAndDtype) {
  float buf[12];
  meshmuon::TensorView v(buf, meshmuon::Shape{3, 4});
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.nbytes(), 48u);
  EXPECT_EQ(v.f32(), buf);
  EXPECT_THROW(v.bf16(), std::invalid_argument);
  meshmuon::TensorView t(buf, meshmuon::DType::F32, meshmuon::Shape{4, 3}, meshmuon::Shape{1, 4});  // transposed
  EXPECT_FALSE(t.is_contiguous());
  meshmuon::TensorView one(buf, meshmuon::DType::F32, meshmuon::Shape{1, 12}, meshmuon::Shape{99, 1});
  EXPECT_TRUE(one.is_contiguous());
}

TEST(DType, Names) {
  EXPECT_EQ(meshmuon::parse_dtype("bf16"), meshmuon::DType::BF16);
  EXPECT_EQ(meshmuon::parse_dtype("float32"), meshmuon::DType::F32);
  EXPECT_EQ(meshmuon::to_string(meshmuon::DType::BF16), "bf16");
  try {
    meshmuon::parse_dtype("fp16", "comm_dtype");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("comm_dtype 'fp16'"), std::string::npos);
  }
}

TEST(Errors, ChecksSayWhereTheyFired) {
  try {
    MESHMUON_CHECK(1 + 1 == 3, "[test] arithmetic ", 42);
    FAIL();
  } catch (const std::invalid_argument& e) {  // still a std::invalid_argument for callers
    EXPECT_STREQ(e.what(), "[test] arithmetic 42");  // the message itself is unchanged
    EXPECT_EQ(meshmuon::error_location(e).rfind("tests/unit/core_test.cpp:", 0), 0u) << meshmuon::error_location(e);
  }
  try {
    MESHMUON_CHECK_RUNTIME(false, "[test] runtime");
    FAIL();
  } catch (const meshmuon::Error& e) {
    EXPECT_NE(e.where().find("core_test.cpp:"), std::string::npos) << e.where();
  }
  EXPECT_EQ(meshmuon::error_location(std::runtime_error("plain")), "");  // negative control
}

// cpu_bf16_support agrees with the kernel's view of the CPU (/proc/cpuinfo flags).
TEST(CpuFeatures, Bf16SupportMatchesProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = line + " ";
      break;
    }
  const meshmuon::detail::CpuBf16 real = meshmuon::detail::cpu_bf16_support();
  if (!flags.empty()) {
    EXPECT_EQ(real.avx512_bf16, flags.find(" avx512_bf16 ") != std::string::npos);
    EXPECT_EQ(real.amx_bf16, flags.find(" amx_bf16 ") != std::string::npos);
  }
  EXPECT_EQ(real.native, real.avx512_bf16 || real.amx_bf16);
  EXPECT_FALSE(meshmuon::detail::cpu_model_name().empty());
}

// `meshmuon info`'s text of the bf16 features: only those present, "none" without (a CPU with
// avx512_bf16 and no AMX, as Zen 4 or Cooper Lake, reads "avx512_bf16").
TEST(CpuFeatures, Bf16FeaturesNameOnlyWhatIsThere) {
  using meshmuon::detail::CpuBf16;
  using meshmuon::detail::cpu_bf16_features;
  EXPECT_EQ(cpu_bf16_features(CpuBf16{false, false, false}), "none");
  EXPECT_EQ(cpu_bf16_features(CpuBf16{true, false, true}), "avx512_bf16");
  EXPECT_EQ(cpu_bf16_features(CpuBf16{false, true, true}), "amx_bf16");
  EXPECT_EQ(cpu_bf16_features(CpuBf16{true, true, true}), "avx512_bf16, amx_bf16");
}

TEST(Blas, LoadsFastCore) {
  const meshmuon::BlasInfo info = meshmuon::blas_info();
  EXPECT_FALSE(info.library.empty());
  auto lower = [](std::string s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  if (std::getenv("MESHMUON_BLAS_REEXEC") == nullptr && !info.coretype_env.empty()) {
    // The user chose a core (some machines set OPENBLAS_CORETYPE): meshmuon must leave it alone.
    // ctest's core_test_auto_core runs this test without it, where meshmuon chooses.
    EXPECT_EQ(lower(info.corename), lower(info.coretype_env)) << "the user's OPENBLAS_CORETYPE was not respected";
    return;
  }
  // The test main re-executes with OPENBLAS_CORETYPE set, so OpenBLAS must run the recommended core.
  EXPECT_TRUE(info.coretype_ok) << "core " << info.corename << ", recommended " << info.recommended;
}

}  // namespace
