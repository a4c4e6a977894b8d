# The third-party libraries the engine compiles with, as the targets fmt::fmt, spdlog::spdlog,
# nlohmann_json::nlohmann_json, ZLIB::ZLIB and (for the CLI) CLI11::CLI11. Two modes:
#
# - default: the system's packages (Debian: libfmt-dev, libspdlog-dev, nlohmann-json3-dev,
#   zlib1g-dev, libcli11-dev), linked as they are (libfmt.so, libz.so at run time).
# - MESHMUON_PORTABLE=ON (scripts/build_wheel.sh): the manylinux wheel, compiled by zig against
#   glibc 2.28's headers. fmt and spdlog are used header-only, zlib statically, all from
#   MESHMUON_DEPS_DIR (include/ and lib/libz.a, staged by the script from the build machine's
#   packages), so that the wheel's binaries need nothing but glibc at run time and no header of the
#   build machine's glibc (/usr/include) enters a compile.
option(MESHMUON_PORTABLE "Build for a manylinux wheel: header-only fmt/spdlog, static zlib from MESHMUON_DEPS_DIR" OFF)

if(NOT MESHMUON_PORTABLE)
  find_package(fmt REQUIRED)
  find_package(spdlog REQUIRED)
  find_package(nlohmann_json 3.10 REQUIRED)
  find_package(ZLIB REQUIRED)  # CRC-32 of checkpoint files
  return()
endif()

set(MESHMUON_DEPS_DIR "" CACHE PATH "MESHMUON_PORTABLE: folder with include/{fmt,spdlog,nlohmann,CLI,zlib.h} and lib/libz.a")
foreach(required include/fmt/core.h include/spdlog/spdlog.h include/nlohmann/json.hpp include/CLI/CLI.hpp
                 include/zlib.h lib/libz.a)
  if(NOT EXISTS "${MESHMUON_DEPS_DIR}/${required}")
    message(FATAL_ERROR "MESHMUON_PORTABLE=ON needs MESHMUON_DEPS_DIR/${required} (MESHMUON_DEPS_DIR='${MESHMUON_DEPS_DIR}'); "
                        "scripts/build_wheel.sh stages it")
  endif()
endforeach()
set(_deps_include "${MESHMUON_DEPS_DIR}/include")
add_library(fmt::fmt INTERFACE IMPORTED)
set_target_properties(fmt::fmt PROPERTIES INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY=1
                                          INTERFACE_INCLUDE_DIRECTORIES "${_deps_include}")
add_library(spdlog::spdlog INTERFACE IMPORTED)
set_target_properties(spdlog::spdlog PROPERTIES INTERFACE_COMPILE_DEFINITIONS "SPDLOG_HEADER_ONLY;SPDLOG_FMT_EXTERNAL"
                                                INTERFACE_INCLUDE_DIRECTORIES "${_deps_include}"
                                                INTERFACE_LINK_LIBRARIES fmt::fmt)
add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
set_target_properties(nlohmann_json::nlohmann_json PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_deps_include}")
add_library(CLI11::CLI11 INTERFACE IMPORTED)
set_target_properties(CLI11::CLI11 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_deps_include}")
add_library(ZLIB::ZLIB STATIC IMPORTED)
set_target_properties(ZLIB::ZLIB PROPERTIES IMPORTED_LOCATION "${MESHMUON_DEPS_DIR}/lib/libz.a"
                                            INTERFACE_INCLUDE_DIRECTORIES "${_deps_include}")
message(STATUS "meshmuon: portable build (wheel): header-only fmt/spdlog/json/CLI11 and static zlib from ${MESHMUON_DEPS_DIR}")
