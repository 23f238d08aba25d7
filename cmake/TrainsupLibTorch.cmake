# Finds the one LibTorch the build uses and settles its link hazards
# (docs/building.md, "Which LibTorch"). Included once, from the top-level
# CMakeLists.txt, after Protobuf and gRPC have been found.
#
# Where LibTorch comes from, first match wins:
#   TRAINSUP_TORCH_DIR  a LibTorch root: an unzipped LibTorch, or a wheel's
#                       site-packages/torch;
#   TRAINSUP_PYTHON     a python interpreter: its `torch` package (default:
#                       the set-up script's virtual environment,
#                       /opt/trainsup/venv/bin/python3).
#
# What it settles:
#   - CUDA runtime libraries: the ones next to that LibTorch (the wheel's
#     nvidia/*/lib, a LibTorch zip's lib/), never an older copy of the
#     toolkit's, so CUDA::cudart points there; nvrtc is dropped from what our
#     targets link (libtorch_cuda loads its own through its RPATH).
#   - OpenMP: our -fopenmp code links the libgomp that LibTorch ships, so a
#     process holds one OpenMP runtime.
#   - GPU architectures: TORCH_CUDA_ARCH_LIST (LibTorch's own variable) gets a
#     fixed default, since the build machine may have no GPU to detect.
# It sets TRAINSUP_TORCH_ROOT, TRAINSUP_TORCH_VERSION and TRAINSUP_HAVE_CUDA.

set(TRAINSUP_VENV "/opt/trainsup/venv" CACHE PATH
    "The virtual environment deploy/bootstrap.sh installs torch into")
set(TRAINSUP_TORCH_DIR "" CACHE PATH
    "A LibTorch root (unzipped LibTorch, or site-packages/torch); overrides TRAINSUP_PYTHON")
set(TRAINSUP_PYTHON "" CACHE FILEPATH
    "Python interpreter whose torch the build uses (default: TRAINSUP_VENV's)")
if(NOT TRAINSUP_PYTHON)
  if(EXISTS "${TRAINSUP_VENV}/bin/python3")
    set(TRAINSUP_PYTHON "${TRAINSUP_VENV}/bin/python3" CACHE FILEPATH "" FORCE)
  else()
    find_program(TRAINSUP_PYTHON_ON_PATH python3)
    set(TRAINSUP_PYTHON "${TRAINSUP_PYTHON_ON_PATH}" CACHE FILEPATH "" FORCE)
  endif()
endif()

if(TRAINSUP_TORCH_DIR)
  set(TRAINSUP_TORCH_ROOT "${TRAINSUP_TORCH_DIR}")
else()
  execute_process(
    COMMAND "${TRAINSUP_PYTHON}" -c "import os, torch; print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE TRAINSUP_TORCH_ROOT OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE torch_found ERROR_VARIABLE torch_error)
  if(NOT torch_found EQUAL 0)
    message(FATAL_ERROR "trainsup: no LibTorch. ${TRAINSUP_PYTHON} cannot import torch "
      "(${torch_error}). Run deploy/bootstrap.sh (it installs the pinned torch into "
      "${TRAINSUP_VENV}), or pass -DTRAINSUP_PYTHON=/path/to/python3 or "
      "-DTRAINSUP_TORCH_DIR=/path/to/libtorch (docs/building.md).")
  endif()
endif()
if(NOT EXISTS "${TRAINSUP_TORCH_ROOT}/share/cmake/Torch/TorchConfig.cmake")
  message(FATAL_ERROR "trainsup: ${TRAINSUP_TORCH_ROOT} is not a LibTorch root "
    "(no share/cmake/Torch/TorchConfig.cmake)")
endif()
# The root first, so TorchConfig's find_library calls take its lib/ before
# any LibTorch installed under /usr.
list(PREPEND CMAKE_PREFIX_PATH "${TRAINSUP_TORCH_ROOT}")
set(Torch_DIR "${TRAINSUP_TORCH_ROOT}/share/cmake/Torch" CACHE PATH "" FORCE)

# The shared libraries that ship with this LibTorch: a wheel's come in
# site-packages/nvidia/*/lib, a LibTorch zip's in its own lib/.
file(GLOB trainsup_torch_lib_dirs LIST_DIRECTORIES true
  "${TRAINSUP_TORCH_ROOT}/lib" "${TRAINSUP_TORCH_ROOT}/../nvidia/*/lib")

# Every GPU generation CUDA 13 builds for, and PTX of the newest for the
# ones after it. LibTorch's CMake reads TORCH_CUDA_ARCH_LIST and ignores
# CMAKE_CUDA_ARCHITECTURES.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX")
endif()
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
# A CUDA LibTorch's CMake files need the CUDA toolkit to be found at all
# (Caffe2's public/cuda.cmake), even for a build without our CUDA code. A
# training box often has a CUDA torch wheel and a driver but no toolkit:
# say so plainly, before Caffe2's "cannot find the CUDA libraries".
file(STRINGS "${TRAINSUP_TORCH_ROOT}/share/cmake/Caffe2/Caffe2Config.cmake" trainsup_torch_cuda
  REGEX "set\\(CAFFE2_USE_CUDA 1\\)")
if(trainsup_torch_cuda AND NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(TRAINSUP_NVCC nvcc)
  if(NOT TRAINSUP_NVCC)
    set(trainsup_torch_cuda_version "")
    if(EXISTS "${TRAINSUP_TORCH_ROOT}/version.py")
      file(STRINGS "${TRAINSUP_TORCH_ROOT}/version.py" trainsup_torch_cuda_version
        REGEX "^cuda.*= *'[0-9.]+'")
      string(REGEX REPLACE ".*'([0-9.]+)'.*" " \\1" trainsup_torch_cuda_version
        "${trainsup_torch_cuda_version}")
    endif()
    message(FATAL_ERROR "trainsup: the LibTorch at ${TRAINSUP_TORCH_ROOT} is built with "
      "CUDA${trainsup_torch_cuda_version}, and building against it needs the CUDA toolkit "
      "(nvcc) of that major version: there is no nvcc on PATH or in /usr/local/cuda/bin. "
      "Install the toolkit, set CUDACXX to its nvcc, or build against a CPU LibTorch "
      "(docs/operations.md, \"The worker\").")
  endif()
endif()

find_package(Torch REQUIRED)
set(TRAINSUP_TORCH_VERSION "${Torch_VERSION}")

# The wheels ship the protobuf headers LibTorch was built with under
# include/google/ (3.13 in torch 2.11, 3.21 in 2.15). First on the include
# path, they would shadow the system protobuf that our generated code and
# libprotobuf belong to: against torch 2.11 the worker does not compile
# ("generated by an older version of protoc"), against 2.15 it compiles by
# the versions' coincidence. Our targets see LibTorch's include folder
# through a folder of links to its entries, google/ left out; nothing we
# include from LibTorch reaches for protobuf.
file(REAL_PATH "${TRAINSUP_TORCH_ROOT}/include" trainsup_torch_include)
if(IS_DIRECTORY "${trainsup_torch_include}/google")
  set(trainsup_torch_headers "${CMAKE_BINARY_DIR}/torch-include")
  file(REMOVE_RECURSE "${trainsup_torch_headers}")
  file(MAKE_DIRECTORY "${trainsup_torch_headers}")
  file(GLOB trainsup_entries RELATIVE "${trainsup_torch_include}" "${trainsup_torch_include}/*")
  list(REMOVE_ITEM trainsup_entries google)
  foreach(entry IN LISTS trainsup_entries)
    file(CREATE_LINK "${trainsup_torch_include}/${entry}" "${trainsup_torch_headers}/${entry}"
      SYMBOLIC)
  endforeach()
  # In a list of include folders: LibTorch's include folder by its links.
  function(trainsup_map_torch_include var)
    set(mapped "")
    foreach(dir IN LISTS ${var})
      if(IS_DIRECTORY "${dir}")
        file(REAL_PATH "${dir}" real)
        if(real STREQUAL trainsup_torch_include)
          set(dir "${trainsup_torch_headers}")
        endif()
      endif()
      list(APPEND mapped "${dir}")
    endforeach()
    set(${var} "${mapped}" PARENT_SCOPE)
  endfunction()
  foreach(target headeronly c10 c10_cuda torch_cpu torch_cuda torch torch_nvshmem)
    foreach(property INTERFACE_INCLUDE_DIRECTORIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES)
      if(TARGET ${target})
        get_target_property(dirs ${target} ${property})
        if(dirs)
          trainsup_map_torch_include(dirs)
          set_target_properties(${target} PROPERTIES ${property} "${dirs}")
        endif()
      endif()
    endforeach()
  endforeach()
  trainsup_map_torch_include(TORCH_INCLUDE_DIRS)
endif()
# The wheel's MKL is inside libtorch_cpu; its CMake still names MKL's
# folders under an empty prefix (/lib/intel64, ...), which would land on
# every RUNPATH.
if(TARGET caffe2::mkl)
  set_property(TARGET caffe2::mkl PROPERTY INTERFACE_LINK_DIRECTORIES "")
endif()
if(TRAINSUP_TORCH_VERSION VERSION_LESS 2.4)
  message(FATAL_ERROR "trainsup: LibTorch ${TRAINSUP_TORCH_VERSION} at ${TRAINSUP_TORCH_ROOT} "
    "is older than 2.4, the oldest this code supports (docs/building.md)")
endif()

set(TRAINSUP_HAVE_CUDA OFF)
if(TRAINSUP_CUDA AND (TORCH_CUDA_LIBRARIES OR CAFFE2_USE_CUDA))
  enable_language(CUDA)
  set(TRAINSUP_HAVE_CUDA ON)
  # Our targets do not call nvrtc; linking the toolkit's would load it
  # before libtorch_cuda's own.
  list(FILTER TORCH_LIBRARIES EXCLUDE REGEX "nvrtc")
  find_library(TRAINSUP_TORCH_CUDART NAMES libcudart.so.13 libcudart.so.12 cudart
    PATHS ${trainsup_torch_lib_dirs} NO_DEFAULT_PATH)
  if(TRAINSUP_TORCH_CUDART AND TARGET CUDA::cudart)
    set_target_properties(CUDA::cudart PROPERTIES IMPORTED_LOCATION "${TRAINSUP_TORCH_CUDART}")
  elseif(NOT TRAINSUP_TORCH_CUDART)
    message(STATUS "trainsup: no CUDA runtime next to LibTorch; the toolkit's is linked")
  endif()
  # nccl.h for ProcessGroupNCCL.hpp: the one LibTorch was built with (its
  # Options hold an ncclConfig_t by value), before the toolkit's.
  find_path(TRAINSUP_NCCL_INCLUDE_DIR nccl.h
    PATHS "${TRAINSUP_TORCH_ROOT}/../nvidia/nccl/include" "${TRAINSUP_TORCH_ROOT}/include"
    NO_DEFAULT_PATH)
  find_path(TRAINSUP_NCCL_INCLUDE_DIR nccl.h PATHS /usr/local/cuda/include)
endif()

# One OpenMP runtime: the libgomp LibTorch ships, where it ships one.
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_library(TRAINSUP_TORCH_GOMP NAMES libgomp.so.1 PATHS "${TRAINSUP_TORCH_ROOT}/lib"
  NO_DEFAULT_PATH)
if(TRAINSUP_TORCH_GOMP)
  set_target_properties(OpenMP::OpenMP_CXX PROPERTIES
    INTERFACE_LINK_LIBRARIES "${TRAINSUP_TORCH_GOMP};Threads::Threads")
endif()

message(STATUS "trainsup: LibTorch ${TRAINSUP_TORCH_VERSION} at ${TRAINSUP_TORCH_ROOT}, "
  "CUDA backend: ${TRAINSUP_HAVE_CUDA}, CUDA runtime: ${TRAINSUP_TORCH_CUDART}, "
  "OpenMP: ${TRAINSUP_TORCH_GOMP}")
