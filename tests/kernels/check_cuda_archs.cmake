# check_cuda_archs.cmake — kernels.cuda_archs: kernels/cuda/archs.cmake
# (included by the top-level CMakeLists.txt) gives T4 to H100/H200 when the
# build does not choose, and keeps what a build chooses.
# cmake -DARCHS_FILE=.../archs.cmake -P check_cuda_archs.cmake
unset(CMAKE_CUDA_ARCHITECTURES)
include(${ARCHS_FILE})
if(NOT CMAKE_CUDA_ARCHITECTURES STREQUAL "75;80;86;89;90a")
  message(FATAL_ERROR "default architectures: '${CMAKE_CUDA_ARCHITECTURES}'")
endif()
foreach(choice "90a" "80;86")
  set(CMAKE_CUDA_ARCHITECTURES "${choice}")
  include(${ARCHS_FILE})
  if(NOT CMAKE_CUDA_ARCHITECTURES STREQUAL "${choice}")
    message(FATAL_ERROR "override ${choice} became '${CMAKE_CUDA_ARCHITECTURES}'")
  endif()
endforeach()
message(STATUS "ok: default 75;80;86;89;90a, overrides kept")
