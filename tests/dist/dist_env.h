// What dist_main.cpp provides to the tests in tests/dist: the communicator under test.
#pragma once

#include <string_view>

#include "meshmuon/comm.h"

namespace meshmuon::test {
Communicator& comm();                  // world communicator of the backend under test
std::string_view expected_backend();   // MESHMUON_TEST_BACKEND, "mpi" by default
}  // namespace meshmuon::test
