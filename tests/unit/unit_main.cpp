// GoogleTest main for meshmuon's unit tests. Tests link LAPACKE, which loads OpenBLAS at start-up,
// before any meshmuon code runs, so the process re-executes itself once with OPENBLAS_CORETYPE set.
#include <gtest/gtest.h>

#include "core/cpu_features.h"

int main(int argc, char** argv) {
  meshmuon::detail::reexec_with_blas_environment(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
