# The nccl communicator (src/comm/nccl/) is compiled in every CUDA build whose NCCL headers are found;
# libnccl itself is dlopen'd at run time (the library never links it).
# nccl.h: DMUON_NCCL_INCLUDE_DIR, the toolkit's include dir, or the PyPI wheel nvidia-nccl-cu13
# (site-packages/nvidia/nccl/include, found through python3).
# Outputs: DMUON_NCCL_ENABLED, DMUON_NCCL_WHY, DMUON_NCCL_INCLUDE_DIR, DMUON_NCCL_LIBRARY_DIR (the
# wheel's lib dir, baked in as a dlopen fallback).
set(DMUON_NCCL_ENABLED OFF)
set(DMUON_NCCL_LIBRARY_DIR "")
if(NOT DMUON_CUDA_ENABLED)
  set(DMUON_NCCL_WHY "no cuda backend in this build")
else()
  set(_dmuon_nccl_hints ${CUDAToolkit_INCLUDE_DIRS})
  find_program(DMUON_NCCL_PYTHON3 NAMES python3 python NO_CACHE)
  if(DMUON_NCCL_PYTHON3)
    execute_process(COMMAND "${DMUON_NCCL_PYTHON3}" -c
      "import site, sys; print(';'.join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))"
      OUTPUT_VARIABLE _dmuon_nccl_site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    foreach(_d IN LISTS _dmuon_nccl_site)
      if(_d AND IS_DIRECTORY "${_d}/nvidia/nccl/include")
        list(APPEND _dmuon_nccl_hints "${_d}/nvidia/nccl/include")
      endif()
    endforeach()
  endif()
  find_path(DMUON_NCCL_INCLUDE_DIR nccl.h HINTS ${_dmuon_nccl_hints} NO_DEFAULT_PATH)
  if(NOT DMUON_NCCL_INCLUDE_DIR)
    find_path(DMUON_NCCL_INCLUDE_DIR nccl.h)
  endif()
  if(DMUON_NCCL_INCLUDE_DIR AND NOT EXISTS "${DMUON_NCCL_INCLUDE_DIR}/nccl.h")
    set(DMUON_NCCL_WHY "no nccl.h in DMUON_NCCL_INCLUDE_DIR=${DMUON_NCCL_INCLUDE_DIR} (pip install nvidia-nccl-cu13)")
  elseif(DMUON_NCCL_INCLUDE_DIR)
    file(STRINGS "${DMUON_NCCL_INCLUDE_DIR}/nccl.h" _dmuon_nccl_major REGEX "^#define NCCL_MAJOR ")
    file(STRINGS "${DMUON_NCCL_INCLUDE_DIR}/nccl.h" _dmuon_nccl_minor REGEX "^#define NCCL_MINOR ")
    string(REGEX REPLACE ".* ([0-9]+).*" "\\1" _dmuon_nccl_major "${_dmuon_nccl_major}")
    string(REGEX REPLACE ".* ([0-9]+).*" "\\1" _dmuon_nccl_minor "${_dmuon_nccl_minor}")
    set(DMUON_NCCL_VERSION "${_dmuon_nccl_major}.${_dmuon_nccl_minor}")
    if(DMUON_NCCL_VERSION VERSION_LESS 2.18)  # ncclCommSplit, non-blocking config, ncclCommGetAsyncError
      set(DMUON_NCCL_WHY "nccl.h ${DMUON_NCCL_VERSION} at ${DMUON_NCCL_INCLUDE_DIR} is older than 2.18 (pip install nvidia-nccl-cu13)")
    else()
      set(DMUON_NCCL_ENABLED ON)
      set(DMUON_NCCL_WHY "")
      get_filename_component(_dmuon_nccl_lib "${DMUON_NCCL_INCLUDE_DIR}/../lib" ABSOLUTE)
      if(EXISTS "${_dmuon_nccl_lib}/libnccl.so.2")
        set(DMUON_NCCL_LIBRARY_DIR "${_dmuon_nccl_lib}")
      endif()
    endif()
  else()
    set(DMUON_NCCL_WHY "nccl.h not found (pip install nvidia-nccl-cu13, see scripts/requirements.txt, or -DDMUON_NCCL_INCLUDE_DIR=...)")
  endif()
endif()
