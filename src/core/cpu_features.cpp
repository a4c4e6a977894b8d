// OPENBLAS_CORETYPE selection: set at library load so the user never has to (REFERENCE.md section 3).
#include "core/cpu_features.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace meshmuon::detail {

namespace {

#if defined(__x86_64__)
// AVX-512 F, DQ, BW and VL present and their register state enabled by the OS (XCR0: SSE, AVX,
// opmask, ZMM_Hi256, Hi16_ZMM), read from cpuid and xgetbv themselves. Not __builtin_cpu_supports:
// its answer comes from the compiler's runtime, and the wheel's (zig's compiler-rt) reported no
// AVX-512 on an AMD Zen 5 where libgcc's reports it.
bool avx512_usable() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || (c & (1u << 27)) == 0) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0xE6u) != 0xE6u) return false;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  const unsigned need = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);  // F, DQ, BW, VL
  return (b & need) == need;
}
#endif

}  // namespace

std::string recommended_openblas_coretype() {
#if defined(__x86_64__)
  if (avx512_usable()) return "SkylakeX";
#endif
  return "";
}

CpuBf16 cpu_bf16_support() {
  CpuBf16 r;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (avx512_usable() && __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0) r.avx512_bf16 = (a >> 5) & 1u;
  a = b = c = d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) != 0) r.amx_bf16 = (d >> 22) & 1u;
#endif
  r.native = r.avx512_bf16 || r.amx_bf16;
  return r;
}

std::string cpu_bf16_features(const CpuBf16& b) {
  std::string out = b.avx512_bf16 ? "avx512_bf16" : "";
  if (b.amx_bf16) out += out.empty() ? "amx_bf16" : ", amx_bf16";
  return out.empty() ? "none" : out;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t begin = line.find_first_not_of(" \t", colon + 1);
    if (begin != std::string::npos) return line.substr(begin);
    break;
  }
#if defined(__x86_64__)
  unsigned regs[12] = {};
  unsigned top = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0x80000000u, &top, &b, &c, &d) != 0 && top >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i)
      __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    char brand[49] = {};
    std::memcpy(brand, regs, 48);
    std::string s(brand);
    const size_t begin = s.find_first_not_of(' ');
    if (begin != std::string::npos) return s.substr(begin);
  }
#endif
  return "unknown";
}

bool prepare_blas_environment() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return false;
  const std::string core = recommended_openblas_coretype();
  if (core.empty()) return false;
  return setenv("OPENBLAS_CORETYPE", core.c_str(), 0) == 0;
}

void reexec_with_blas_environment(char** argv) {
  if (std::getenv("MESHMUON_BLAS_REEXEC") != nullptr) return;  // already re-executed once
  if (!prepare_blas_environment()) return;
  setenv("MESHMUON_BLAS_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);
  // execv failed: go on with the BLAS as loaded (slower, still correct).
}

namespace {
// Runs when libmeshmuon loads, before any meshmuon code can dlopen the BLAS.
__attribute__((constructor)) void meshmuon_prepare_blas_on_load() { prepare_blas_environment(); }
}  // namespace

}  // namespace meshmuon::detail
