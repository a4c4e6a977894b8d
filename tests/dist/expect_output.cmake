# Runs CMD (a ;-list) and fails unless it exits non-zero and its output (stdout and stderr) matches
# every regex of MATCH (a ;-list) and none of NOMATCH. For tests of how a failing job reports.
# Use: cmake -DCMD="mpiexec;-n;3;prog" -DMATCH="re1;re2" -DNOMATCH="re3" -P expect_output.cmake
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
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
