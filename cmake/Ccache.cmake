# Uses ccache when present. Precompiled headers need the sloppiness settings
# below, or ccache never hits for the torch-heavy targets. Paths under the
# source tree are hashed relative to it (CCACHE_BASEDIR) and the working
# directory is left out of the hash (CCACHE_NOHASHDIR), so a clone in
# another folder (CI's clean clone) hits what an earlier clone compiled;
# the price is that debug info names the folder of the clone that filled
# the cache.
find_program(TRAINSUP_CCACHE ccache)
if(TRAINSUP_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      "CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}" CCACHE_NOHASHDIR=1
      ${TRAINSUP_CCACHE})
  message(STATUS "trainsup: using ccache (${TRAINSUP_CCACHE})")
endif()
