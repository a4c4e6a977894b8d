// The BLAS meshmuon computes with, and how to see and steer it.
//
// meshmuon loads a CBLAS library at run time (OpenBLAS by default; MESHMUON_BLAS_LIBRARY=/path/libx.so
// chooses another) the first time a kernel needs it. Before that, when libmeshmuon itself loads, it sets
// OPENBLAS_CORETYPE for CPUs that Debian's OpenBLAS 0.3.21 misdetects (AVX-512 parts newer than it
// knows, which would otherwise run generic kernels about 8x slower). A value the user set is kept.
// If OpenBLAS was already loaded by someone else before meshmuon (e.g. through LAPACK), blas_info()
// reports the core it chose and `coretype_ok` tells whether it is the fast one.
//
// Threads: meshmuon splits every product into tiles whose shapes depend only on the sizes, runs each
// tile as one single-threaded BLAS call, and spreads the tiles over its own worker threads, so no
// result depends on the thread count (OpenBLAS's own threading changes bits with the count on its
// Haswell and Zen cores). OpenBLAS is therefore set to ONE thread when meshmuon loads it, for the
// whole process (a process using the same OpenBLAS for its own work gets it single-threaded).
#pragma once

#include <string>

#include "meshmuon/export.h"

namespace meshmuon {

struct BlasInfo {
  std::string library;         // path or soname that was loaded
  std::string corename;        // OpenBLAS kernel family, e.g. "SkylakeX"; empty for other BLAS
  std::string config;          // OpenBLAS build configuration string
  std::string coretype_env;    // OPENBLAS_CORETYPE in effect ("" when unset)
  std::string recommended;     // what meshmuon recommends for this CPU ("" when no override is needed)
  bool coretype_ok = true;     // false when OpenBLAS runs a slower core than recommended
  int threads = 1;             // threads of meshmuon's products (blas_set_num_threads)
};

// Loads the BLAS if needed; throws meshmuon::Error when no CBLAS library can be loaded.
MESHMUON_API BlasInfo blas_info();

// The threads meshmuon's products use, process-wide (default: OpenBLAS's thread count when meshmuon loaded
// it, i.e. OPENBLAS_NUM_THREADS or the cores). n >= 1, else std::invalid_argument. Results are the
// same for every value.
MESHMUON_API void blas_set_num_threads(int n);
MESHMUON_API int blas_get_num_threads();

}  // namespace meshmuon
