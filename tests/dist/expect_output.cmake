# Runs CMD (a ;-list) and fails unless it exits non-zero and its output (stdout and stderr) matches
# every regex of MATCH (a ;-list) and none of NOMATCH. For tests of how a failing job reports.
# Use: cmake -DCMD="mpiexec;-n;3;prog" -DMATCH="re1;re2" -DNOMATCH="re3" -P expect_output.cmake
# TIMEOUT: Open MPI 4.1's mpiexec sometimes never returns after its ranks have exited without
# MPI_Finalize (its PMIx server thread stuck in PMIx_server_finalize; seen in ~1 of 10 runs of
# comm_first_failure_np3 with every version of meshmuon's poll, openpmix issue 1244). The job's output is
# complete by then, so a timed-out run is judged by it like any failing exit; a job that hangs
# before printing what it must still fails on MATCH.
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 40)
set(all "${out}\n${err}")
if(rc STREQUAL "0")
  message(FATAL_ERROR "expected a failing exit code, got 0 from: ${CMD}\n${all}")
endif()
foreach(re IN LISTS MATCH)
  if(NOT all MATCHES "${re}")
    message(FATAL_ERROR "output does not match '${re}':\n${all}")
  endif()
endforeach()
foreach(re IN LISTS NOMATCH)
  if(all MATCHES "${re}")
    message(FATAL_ERROR "output matches '${re}', which it must not:\n${all}")
  endif()
endforeach()
message(STATUS "exit code ${rc}; the output says what it must")
