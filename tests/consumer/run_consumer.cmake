# Installs meshmuon into ${BUILD_DIR}/consumer-prefix, then builds and runs tests/consumer against it.
# Run by CTest (test `install_consumer`).
set(prefix ${BUILD_DIR}/consumer-prefix)
set(cbuild ${BUILD_DIR}/consumer-build)
file(REMOVE_RECURSE ${prefix} ${cbuild})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} --component Unspecified
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "install failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${cbuild} -G ${GENERATOR}
                        -DCMAKE_PREFIX_PATH=${prefix} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${cbuild} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed (${rc})")
endif()
# Without a user's OPENBLAS_CORETYPE (some machines set one): the installed library must pick the fast core itself.
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=OPENBLAS_CORETYPE ${cbuild}/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "${out}")
if(rc)
  message(FATAL_ERROR "the consumer failed (${rc})")
endif()
