# Runs CMD (a ;-list) and fails unless it exits with EXPECT. For jobs that must end through
# meshmuon::abort_all: mpirun returns the code given to MPI_Abort.
# Use: cmake -DCMD="mpiexec;-n;3;prog" -DEXPECT=42 -P expect_exit_code.cmake
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc)
if(NOT rc STREQUAL "${EXPECT}")
  message(FATAL_ERROR "expected exit code ${EXPECT}, got '${rc}' from: ${CMD}")
endif()
message(STATUS "exit code ${rc} as expected")
