# TRAINSUP_FUZZ: libFuzzer targets for every parser of outside input (fuzz/),
# with AddressSanitizer and UBSan, built by clang as an ExternalProject (the
# main build may use GCC), each run by ctest for TRAINSUP_FUZZ_SECONDS
# (label "fuzz"). On by default when clang can link a fuzzer here (clang and
# libclang-rt-14-dev on Debian 12); docs/building.md says how to fuzz longer.
include(ExternalProject)

find_program(TRAINSUP_FUZZ_CXX NAMES clang++ clang++-16 clang++-15 clang++-14
  DOC "C++ compiler with libFuzzer for the fuzz targets")
if(NOT DEFINED TRAINSUP_FUZZ_AVAILABLE)
  set(available OFF)
  if(TRAINSUP_FUZZ_CXX)
    set(probe_dir ${CMAKE_BINARY_DIR}/fuzz-probe)
    file(WRITE ${probe_dir}/probe.cc
      "#include <cstddef>\n#include <cstdint>\n"
      "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
    execute_process(
      COMMAND ${TRAINSUP_FUZZ_CXX} -fsanitize=fuzzer,address,undefined probe.cc -o probe
      WORKING_DIRECTORY ${probe_dir} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
    if(rc EQUAL 0)
      set(available ON)
    endif()
  endif()
  set(TRAINSUP_FUZZ_AVAILABLE ${available} CACHE INTERNAL "clang links libFuzzer with ASan and UBSan")
endif()

option(TRAINSUP_FUZZ "Build the fuzz targets (clang, libFuzzer, ASan, UBSan) and run them in ctest"
  ${TRAINSUP_FUZZ_AVAILABLE})
set(TRAINSUP_FUZZ_SECONDS 2 CACHE STRING "How long ctest runs each fuzz target")
set(TRAINSUP_FUZZ_BUILD_JOBS 2 CACHE STRING "Parallel compile jobs of the fuzz build")

if(NOT TRAINSUP_FUZZ)
  message(STATUS "trainsup: fuzz targets off (TRAINSUP_FUZZ=OFF or no clang with libFuzzer)")
  return()
endif()
if(NOT TRAINSUP_FUZZ_AVAILABLE)
  message(FATAL_ERROR "TRAINSUP_FUZZ=ON but '${TRAINSUP_FUZZ_CXX}' cannot link "
    "-fsanitize=fuzzer,address,undefined (Debian: apt-get install clang libclang-rt-14-dev)")
endif()
message(STATUS "trainsup: fuzz targets with ${TRAINSUP_FUZZ_CXX}, ${TRAINSUP_FUZZ_SECONDS} s each in ctest")

# The sources of the libraries under test, from their targets, so that a
# file added to one of them is fuzzed as well: a "|"-separated list each.
function(trainsup_fuzz_sources out)
  set(all "")
  foreach(spec ${ARGN})
    string(REPLACE ":" ";" parts ${spec})
    list(GET parts 0 target)
    list(GET parts 1 dir)
    get_target_property(sources ${target} SOURCES)
    list(FILTER sources INCLUDE REGEX "\\.cc$")
    list(TRANSFORM sources PREPEND "${PROJECT_SOURCE_DIR}/${dir}/")
    list(APPEND all ${sources})
  endforeach()
  string(REPLACE ";" "|" all "${all}")
  set(${out} "${all}" PARENT_SCOPE)
endfunction()
trainsup_fuzz_sources(data_sources trainsup_worker_data:worker/data)
trainsup_fuzz_sources(checkpoint_sources trainsup_checkpoint_core:checkpoint)
trainsup_fuzz_sources(spec_sources trainsup_contracts:contracts)

set(fuzz_dir ${CMAKE_BINARY_DIR}/fuzz)
# LibTorch's CMake in the fuzz build needs the same GPU list (no GPU to
# detect); "|" is the list separator below.
string(REPLACE ";" "|" fuzz_cuda_archs "${TORCH_CUDA_ARCH_LIST}")
ExternalProject_Add(trainsup_fuzz
  SOURCE_DIR ${PROJECT_SOURCE_DIR}/fuzz
  BINARY_DIR ${fuzz_dir}
  LIST_SEPARATOR |
  CMAKE_ARGS
    -DCMAKE_CXX_COMPILER=${TRAINSUP_FUZZ_CXX}
    -DCMAKE_CXX_COMPILER_LAUNCHER=${TRAINSUP_CCACHE}
    -DTRAINSUP_TORCH_DIR=${TRAINSUP_TORCH_ROOT}
    -DTORCH_CUDA_ARCH_LIST=${fuzz_cuda_archs}
    -DCMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}
    -DTRAINSUP_SOURCE_DIR=${PROJECT_SOURCE_DIR}
    -DTRAINSUP_DATA_SOURCES=${data_sources}
    -DTRAINSUP_CHECKPOINT_SOURCES=${checkpoint_sources}
    -DTRAINSUP_SPEC_SOURCES=${spec_sources}
    -DTRAINSUP_VERSION=${PROJECT_VERSION}
    -DTRAINSUP_SAFETENSORS_SOURCES=${PROJECT_SOURCE_DIR}/checkpoint/safetensors.cc
    -DTRAINSUP_CLUSTER_SOURCES=${PROJECT_SOURCE_DIR}/supervisor/policy/cluster_protocol.cc|${PROJECT_SOURCE_DIR}/supervisor/policy/restart_policy.cc|${PROJECT_SOURCE_DIR}/supervisor/policy/exit_classify.cc
  BUILD_COMMAND ${CMAKE_COMMAND} --build ${fuzz_dir} -j ${TRAINSUP_FUZZ_BUILD_JOBS}
  BUILD_ALWAYS ON
  INSTALL_COMMAND "")

if(NOT TRAINSUP_BUILD_TESTS)
  return()
endif()
# Each target for a few seconds: the committed seeds (fuzz/corpus/NAME) are
# read, what the run finds goes to the build tree's corpus (kept between
# runs), a crash to fuzz/artifacts/NAME-crash-... in the build tree.
foreach(name ply las semantic_kitti s3dis manifest safetensors exit_file spec config toml
    cluster_records)
  file(MAKE_DIRECTORY ${fuzz_dir}/corpus/${name} ${fuzz_dir}/artifacts)
  add_test(NAME fuzz.${name}
    COMMAND ${fuzz_dir}/${name}_fuzzer -max_total_time=${TRAINSUP_FUZZ_SECONDS} -timeout=10
            -rss_limit_mb=2048 -print_final_stats=1
            -artifact_prefix=${fuzz_dir}/artifacts/${name}-
            ${fuzz_dir}/corpus/${name} ${PROJECT_SOURCE_DIR}/fuzz/corpus/${name})
  set_tests_properties(fuzz.${name} PROPERTIES LABELS fuzz TIMEOUT 120
    ENVIRONMENT "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endforeach()
