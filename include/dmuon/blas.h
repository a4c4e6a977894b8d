// The BLAS dmuon computes with, and how to see and steer it.
//
// dmuon loads a CBLAS library at run time (OpenBLAS by default; DMUON_BLAS_LIBRARY=/path/libx.so
// chooses another) the first time a kernel needs it. Before that, when libdmuon itself loads, it sets
// OPENBLAS_CORETYPE for CPUs that Debian's OpenBLAS 0.3.21 misdetects (AVX-512 parts newer than it
// knows, which would otherwise run generic kernels about 8x slower). A value the user set is kept.
// If OpenBLAS was already loaded by someone else before dmuon (e.g. through LAPACK), blas_info()
// reports the core it chose and `coretype_ok` tells whether it is the fast one.
//
// Threads: dmuon splits every product into tiles whose shapes depend only on the sizes, runs each
// tile as one single-threaded BLAS call, and spreads the tiles over its own worker threads, so no
// result depends on the thread count (OpenBLAS's own threading changes bits with the count on its
// Haswell and Zen cores). OpenBLAS is therefore set to ONE thread when dmuon loads it, for the
// whole process (a process using the same OpenBLAS for its own work gets it single-threaded).
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
  int threads = 1;             // threads of dmuon's products (blas_set_num_threads)
};

// Loads the BLAS if needed; throws dmuon::Error when no CBLAS library can be loaded.
DMUON_API BlasInfo blas_info();

// The threads dmuon's products use, process-wide (default: OpenBLAS's thread count when dmuon loaded
// it, i.e. OPENBLAS_NUM_THREADS or the cores). n >= 1, else std::invalid_argument. Results are the
// same for every value.
DMUON_API void blas_set_num_threads(int n);
DMUON_API int blas_get_num_threads();

}  // namespace dmuon
