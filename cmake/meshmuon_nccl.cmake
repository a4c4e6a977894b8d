# The nccl communicator (src/comm/nccl/) is compiled in every CUDA build whose NCCL headers are found;
# libnccl itself is dlopen'd at run time (the library never links it).
# nccl.h: MESHMUON_NCCL_INCLUDE_DIR, the toolkit's include dir, or the PyPI wheel nvidia-nccl-cu13
# (site-packages/nvidia/nccl/include, found through python3).
# Outputs: MESHMUON_NCCL_ENABLED, MESHMUON_NCCL_WHY, MESHMUON_NCCL_INCLUDE_DIR, MESHMUON_NCCL_LIBRARY_DIR (the
# wheel's lib dir, baked in as a dlopen fallback).
set(MESHMUON_NCCL_ENABLED OFF)
set(MESHMUON_NCCL_LIBRARY_DIR "")
if(NOT MESHMUON_CUDA_ENABLED)
  set(MESHMUON_NCCL_WHY "no cuda backend in this build")
else()
  set(_meshmuon_nccl_hints ${CUDAToolkit_INCLUDE_DIRS})
  find_program(MESHMUON_NCCL_PYTHON3 NAMES python3 python NO_CACHE)
  if(MESHMUON_NCCL_PYTHON3)
    execute_process(COMMAND "${MESHMUON_NCCL_PYTHON3}" -c
      "import site, sys; print(';'.join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))"
      OUTPUT_VARIABLE _meshmuon_nccl_site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    foreach(_d IN LISTS _meshmuon_nccl_site)
      if(_d AND IS_DIRECTORY "${_d}/nvidia/nccl/include")
        list(APPEND _meshmuon_nccl_hints "${_d}/nvidia/nccl/include")
      endif()
    endforeach()
  endif()
  find_path(MESHMUON_NCCL_INCLUDE_DIR nccl.h HINTS ${_meshmuon_nccl_hints} NO_DEFAULT_PATH)
  if(NOT MESHMUON_NCCL_INCLUDE_DIR)
    find_path(MESHMUON_NCCL_INCLUDE_DIR nccl.h)
  endif()
  if(MESHMUON_NCCL_INCLUDE_DIR AND NOT EXISTS "${MESHMUON_NCCL_INCLUDE_DIR}/nccl.h")
    set(MESHMUON_NCCL_WHY "no nccl.h in MESHMUON_NCCL_INCLUDE_DIR=${MESHMUON_NCCL_INCLUDE_DIR} (pip install nvidia-nccl-cu13)")
  elseif(MESHMUON_NCCL_INCLUDE_DIR)
    file(STRINGS "${MESHMUON_NCCL_INCLUDE_DIR}/nccl.h" _meshmuon_nccl_major REGEX "^#define NCCL_MAJOR ")
    file(STRINGS "${MESHMUON_NCCL_INCLUDE_DIR}/nccl.h" _meshmuon_nccl_minor REGEX "^#define NCCL_MINOR ")
    string(REGEX REPLACE ".* ([0-9]+).*" "\\1" _meshmuon_nccl_major "${_meshmuon_nccl_major}")
    string(REGEX REPLACE ".* ([0-9]+).*" "\\1" _meshmuon_nccl_minor "${_meshmuon_nccl_minor}")
    set(MESHMUON_NCCL_VERSION "${_meshmuon_nccl_major}.${_meshmuon_nccl_minor}")
    if(MESHMUON_NCCL_VERSION VERSION_LESS 2.18)  # ncclCommSplit, non-blocking config, ncclCommGetAsyncError
      set(MESHMUON_NCCL_WHY "nccl.h ${MESHMUON_NCCL_VERSION} at ${MESHMUON_NCCL_INCLUDE_DIR} is older than 2.18 (pip install nvidia-nccl-cu13)")
    else()
      set(MESHMUON_NCCL_ENABLED ON)
      set(MESHMUON_NCCL_WHY "")
      get_filename_component(_meshmuon_nccl_lib "${MESHMUON_NCCL_INCLUDE_DIR}/../lib" ABSOLUTE)
      if(EXISTS "${_meshmuon_nccl_lib}/libnccl.so.2")
        set(MESHMUON_NCCL_LIBRARY_DIR "${_meshmuon_nccl_lib}")
      endif()
    endif()
  else()
    set(MESHMUON_NCCL_WHY "nccl.h not found (pip install nvidia-nccl-cu13, see scripts/requirements.txt, or -DMESHMUON_NCCL_INCLUDE_DIR=...)")
  endif()
endif()
