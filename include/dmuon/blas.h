// The BLAS dmuon computes with, and how to see and steer it.
//
// dmuon loads a CBLAS library at run time (OpenBLAS by default; DMUON_BLAS_LIBRARY=/path/libx.so
// chooses another) the first time a kernel needs it. Before that, when libdmuon itself loads, it sets
// OPENBLAS_CORETYPE for CPUs that Debian's OpenBLAS 0.3.21 misdetects (AVX-512 parts newer than it
// knows, which would otherwise run generic kernels about 8x slower). A value the user set is kept.
// If OpenBLAS was already loaded by someone else before dmuon (e.g. through LAPACK), blas_info()
// reports the core it chose and `coretype_ok` tells whether it is the fast one.
#pragma once

#include <string>

#include "dmuon/export.h"

namespace dmuon {

struct BlasInfo {
  std::string library;         // path or soname that was loaded
  std::string corename;        // OpenBLAS kernel family, e.g. "SkylakeX"; empty for other BLAS
  std::string config;          // OpenBLAS build configuration string
  std::string coretype_env;    // OPENBLAS_CORETYPE in effect ("" when unset)
  std::string recommended;     // what dmuon recommends for this CPU ("" when no override is needed)
  bool coretype_ok = true;     // false when OpenBLAS runs a slower core than recommended
  int threads = 1;             // BLAS worker threads
};

// Loads the BLAS if needed; throws dmuon::Error when no CBLAS library can be loaded.
DMUON_API BlasInfo blas_info();

// Sets the number of BLAS threads (OpenBLAS only; a no-op elsewhere). n >= 1.
DMUON_API void blas_set_num_threads(int n);
DMUON_API int blas_get_num_threads();

}  // namespace dmuon
