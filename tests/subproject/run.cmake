# Configures and builds tests/subproject (a parent taking rotary in with add_subdirectory) in a
# scratch directory, then runs its two programs.
# In: SOURCE_DIR, WORK_DIR, GENERATOR, C_COMPILER, CXX_COMPILER, LAUNCHER (may be empty).
include(${SOURCE_DIR}/tests/package/steps.cmake)
file(REMOVE_RECURSE ${WORK_DIR})
set(options -DCMAKE_BUILD_TYPE=Release -DROTARY_SOURCE_DIR=${SOURCE_DIR}
            -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
if(LAUNCHER)
  list(APPEND options -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/subproject -B ${WORK_DIR} -G ${GENERATOR} ${options})
step(${CMAKE_COMMAND} --build ${WORK_DIR})
step(${WORK_DIR}/parent)
step(${WORK_DIR}/parent_c)
