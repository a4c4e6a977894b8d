/* Force-included (-include) into the CUDA wheel's .cu files only (VARIANT=cuda scripts/build_wheel.sh).
   Those are compiled with _GNU_SOURCE off, because glibc's GNU math declarations (cospi, sinpi, ...,
   in zig's newer glibc headers) clash with CUDA's math_functions.h; libc++'s <locale> still needs
   these GNU locale functions, declared here with glibc's signatures (all in glibc 2.28). */
#include <stdlib.h>
#include <locale.h>
#ifdef __cplusplus
extern "C" {
long long strtoll_l(const char*, char**, int, locale_t) noexcept;
unsigned long long strtoull_l(const char*, char**, int, locale_t) noexcept;
float strtof_l(const char*, char**, locale_t) noexcept;
double strtod_l(const char*, char**, locale_t) noexcept;
long double strtold_l(const char*, char**, locale_t) noexcept;
}
#endif
