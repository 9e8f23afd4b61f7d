# Installs the (static) build into a scratch prefix and builds a C program, examples/01_apply_c.c,
# with `pkg-config --cflags --libs --static rotary` against it; runs it.
# In: ROTARY_BUILD_DIR, WORK_DIR, SOURCE, C_COMPILER, PKG_CONFIG.
include(${CMAKE_CURRENT_LIST_DIR}/steps.cmake)
file(REMOVE_RECURSE ${WORK_DIR})
step(${CMAKE_COMMAND} --install ${ROTARY_BUILD_DIR} --prefix ${WORK_DIR}/prefix)
pkg_config_consumer(${WORK_DIR}/prefix ${SOURCE} ${WORK_DIR}/consumer_c static)
