# Generates build_info.c: compiler, flags, CUDA archs and git SHA baked into the
# library so fc_build_info() and every bench JSON can say what was measured.
# FLASHCORE_GIT_SHA, when set, is what gets recorded: a copy of the tree sent
# to another machine may carry a .git that is not its commit (the GPU machine's
# copy has the sending session's first commit, with the later ones as
# uncommitted changes), so scripts/gpu-check.sh passes the sender's .git-sha.
set(FLASHCORE_GIT_SHA "" CACHE STRING "commit to record in the build info (empty: ask git)")
find_package(Git QUIET)
set(FC_GIT_SHA "unknown")
if(FLASHCORE_GIT_SHA)
  set(FC_GIT_SHA "${FLASHCORE_GIT_SHA}")
elseif(GIT_FOUND AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/.git)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR} OUTPUT_VARIABLE FC_GIT_SHA
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  execute_process(COMMAND ${GIT_EXECUTABLE} status --porcelain --untracked-files=no
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR} OUTPUT_VARIABLE FC_GIT_DIRTY
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT FC_GIT_SHA)
    set(FC_GIT_SHA "unknown")
  elseif(FC_GIT_DIRTY)
    set(FC_GIT_SHA "${FC_GIT_SHA}-dirty")
  endif()
endif()
# A copy of the tree without .git (the GPU machine gets one) may carry the SHA
# in .git-sha, written by whoever sent it.
if(FC_GIT_SHA STREQUAL "unknown" AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/.git-sha)
  file(STRINGS ${CMAKE_CURRENT_SOURCE_DIR}/.git-sha FC_GIT_SHA LIMIT_COUNT 1)
endif()
string(TOUPPER "${CMAKE_BUILD_TYPE}" FC_BT)
set(FC_C_FLAGS_ALL "${CMAKE_C_FLAGS} ${CMAKE_C_FLAGS_${FC_BT}}")
if(FC_HAVE_CUDA)
  set(FC_CUDA_DESC "nvcc ${CMAKE_CUDA_COMPILER_VERSION} archs ${FLASHCORE_CUDA_ARCHS}")
else()
  set(FC_CUDA_DESC "none")
endif()
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/cmake/build_info.c.in ${CMAKE_CURRENT_BINARY_DIR}/build_info.c @ONLY)
