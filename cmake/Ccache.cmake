# Uses ccache when present. Precompiled headers need the sloppiness settings
# below, or ccache never hits for the torch-heavy targets.
find_program(TRAINSUP_CCACHE ccache)
if(TRAINSUP_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      ${TRAINSUP_CCACHE})
  message(STATUS "trainsup: using ccache (${TRAINSUP_CCACHE})")
endif()
