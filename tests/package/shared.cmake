# Builds rotary as a shared library (-DBUILD_SHARED_LIBS=ON, with the CLI) in a scratch directory,
# installs it, and checks what a distribution would ship:
#   - lib/librotary.so -> librotary.so.0 -> librotary.so.<VERSION>, SONAME librotary.so.0;
#   - only rotary's symbols exported (check_exports.cmake, nm -D);
#   - a C program built with `pkg-config --cflags --libs rotary`, and tests/package through
#     find_package(rotary), link librotary.so.0 and run; so does the installed `rotary` CLI.
# In: SOURCE_DIR, WORK_DIR, VERSION, GENERATOR, C_COMPILER, CXX_COMPILER, LAUNCHER (may be empty),
#     PKG_CONFIG, NM, OBJDUMP.
include(${CMAKE_CURRENT_LIST_DIR}/steps.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/check_exports.cmake)
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
set(options -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DROTARY_BUILD_TESTS=OFF
            -DROTARY_BUILD_TOOLS=ON -DROTARY_BUILD_PYTHON=OFF -DROTARY_BUILD_EXAMPLES=OFF
            -DCMAKE_INSTALL_PREFIX=${prefix} -DCMAKE_INSTALL_LIBDIR=lib
            -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
if(LAUNCHER)
  list(APPEND options -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
step(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR} ${options})
step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
step(${CMAKE_COMMAND} --install ${WORK_DIR}/build)

# The versioned names.
string(REGEX MATCH "^[0-9]+" major "${VERSION}")
set(lib ${prefix}/lib)
if(NOT EXISTS ${lib}/librotary.so.${VERSION} OR IS_SYMLINK ${lib}/librotary.so.${VERSION})
  message(FATAL_ERROR "${lib}/librotary.so.${VERSION} is not installed as a file")
endif()
foreach(link_target "librotary.so:librotary.so.${major}"
                    "librotary.so.${major}:librotary.so.${VERSION}")
  string(REPLACE ":" ";" pair "${link_target}")
  list(GET pair 0 link)
  list(GET pair 1 target)
  if(NOT IS_SYMLINK ${lib}/${link})
    message(FATAL_ERROR "${lib}/${link} is not a symbolic link")
  endif()
  file(READ_SYMLINK ${lib}/${link} points_to)
  if(NOT points_to STREQUAL target)
    message(FATAL_ERROR "${lib}/${link} points to ${points_to}, not ${target}")
  endif()
endforeach()
step_output(dynamic ${OBJDUMP} -p ${lib}/librotary.so.${VERSION})
if(NOT dynamic MATCHES "SONAME +librotary\\.so\\.${major}\n")
  message(FATAL_ERROR "librotary.so.${VERSION} has no SONAME librotary.so.${major}:\n${dynamic}")
endif()
if(EXISTS ${lib}/librotary.a)
  message(FATAL_ERROR "a shared build installed librotary.a too")
endif()

rotary_check_exports(${lib}/librotary.so.${VERSION} ${NM})

# Consumers: C through pkg-config, C++ through find_package, and the installed CLI.
pkg_config_consumer(${prefix} ${SOURCE_DIR}/examples/01_apply_c.c ${WORK_DIR}/consumer_c shared)
step_output(needed ${OBJDUMP} -p ${WORK_DIR}/consumer_c)
if(NOT needed MATCHES "NEEDED +librotary\\.so\\.${major}\n")
  message(FATAL_ERROR "the pkg-config consumer does not load librotary.so.${major}:\n${needed}")
endif()
step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package -B ${WORK_DIR}/consumer -G ${GENERATOR}
     -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
     -DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON -DCMAKE_DISABLE_FIND_PACKAGE_hwy=ON
     -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON -DCMAKE_DISABLE_FIND_PACKAGE_OpenMP=ON)
step(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
step(${WORK_DIR}/consumer/consumer)
step(${prefix}/bin/rotary presets)
