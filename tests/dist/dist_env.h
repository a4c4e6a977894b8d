// What dist_main.cpp provides to the tests in tests/dist: the communicator under test.
#pragma once

#include <string_view>

#include "dmuon/comm.h"

namespace dmuon::test {
Communicator& comm();                  // world communicator of the backend under test
std::string_view expected_backend();   // DMUON_TEST_BACKEND, "mpi" by default
}  // namespace dmuon::test
