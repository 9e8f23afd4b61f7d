# Helpers for the cmake -P scripts that install rotary and build programs against it.

# Runs a command; stops the test with the command line when it fails.
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "package test step failed (${result}): ${ARGN}")
  endif()
endfunction()

# Like step, keeping stdout in `out` (stripped).
function(step_output out)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE text
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "package test step failed (${result}): ${ARGN}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# Builds the C program `source` against the rotary installed in `prefix` with only what
#   pkg-config --cflags --libs [--static] rotary
# says (plus -lm, which the program itself uses, and for a shared library an rpath), as a strict
# C11 consumer would; runs it. `mode` is static or shared.
function(pkg_config_consumer prefix source binary mode)
  file(GLOB_RECURSE pc_files ${prefix}/rotary.pc)
  list(LENGTH pc_files found)
  if(NOT found EQUAL 1)
    message(FATAL_ERROR "expected one installed rotary.pc under ${prefix}, found: ${pc_files}")
  endif()
  get_filename_component(pc_dir ${pc_files} DIRECTORY)
  set(query --cflags --libs rotary)
  if(mode STREQUAL "static")
    set(query --static ${query})
  endif()
  step_output(flags ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pc_dir} PKG_CONFIG_LIBDIR=${pc_dir}
              ${PKG_CONFIG} ${query})
  list(JOIN query " " query_text)
  message(STATUS "pkg-config ${query_text}: ${flags}")
  separate_arguments(flags UNIX_COMMAND "${flags}")
  set(extra -lm)
  if(mode STREQUAL "shared")
    get_filename_component(libdir ${pc_dir} DIRECTORY)
    list(APPEND extra -Wl,-rpath,${libdir})
  endif()
  step(${C_COMPILER} -std=c11 -pedantic -Wall -Wextra -Werror ${source} ${flags} ${extra}
       -o ${binary})
  step(${binary})
endfunction()
