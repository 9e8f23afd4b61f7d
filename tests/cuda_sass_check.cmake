# The SASS check of the fast CUDA kernels (src/cuda/fast_body.hpp): what the machine code of each
# kernel whose name matches KERNEL must show for ARCH (the H100/H200's sm_90), read with cuobjdump,
# which needs no GPU —
#   global loads and stores of 16 bytes (LDG.E.128, STG.E.128), and no global store of another
#     width (q and k move as whole vectors; the scalar loads left are positions, tables and the
#     caller's cos/sin in phase A) unless ALLOW_NARROW_STORES (optional: a quantised cache's rows
#     take a vector's codes, 8 or 4 bytes, in one store);
#   no CALL.REL (a subroutine: 64-bit integer division or modulo, a double division), or at most
#     MAX_CALLS of them (optional, default 0: the norm kernels' once-per-head double division and
#     square root, whose slow paths are subroutines);
#   no local memory (LDL/STL, a stack frame or local bytes in cuobjdump's resource usage:
#     registers spilled, or an array indexed at run time);
#   at most MAX_REGISTERS registers (the occupancy the launch bounds promise);
# and exactly EXPECT_KERNELS such kernels. Fails, naming each kernel and rule broken, otherwise;
# also fails when cuobjdump (or the nvdisasm it runs) is missing: CI must run the check, never skip it.
# Usage: cmake -DCUOBJDUMP=cuobjdump -DOBJECTS="a.o|b.o" -DARCH=sm_90 -DKERNEL=regex
#              -DEXPECT_KERNELS=n -DMAX_REGISTERS=n -P cuda_sass_check.cmake
foreach(variable OBJECTS ARCH KERNEL EXPECT_KERNELS MAX_REGISTERS)
  if(NOT DEFINED ${variable} OR "${${variable}}" STREQUAL "")
    message(FATAL_ERROR "${variable} is not set")
  endif()
endforeach()
if(NOT CUOBJDUMP OR NOT EXISTS "${CUOBJDUMP}")
  message(FATAL_ERROR "cuobjdump not found (\"${CUOBJDUMP}\"): `make build` installs it into build/cuda-tools "
                      "(scripts/get-cuobjdump, PyPI nvidia-cuda-cuobjdump); or configure with "
                      "-DROTARY_CUOBJDUMP=<path to cuobjdump>")
endif()

# cuobjdump prints SASS through nvdisasm, looked for beside it first.
get_filename_component(tools "${CUOBJDUMP}" DIRECTORY)
set(ENV{PATH} "${tools}:$ENV{PATH}")

string(REPLACE "|" ";" OBJECTS "${OBJECTS}")
set(failures 0)
set(found 0)
set(summary "")
foreach(object ${OBJECTS})
  execute_process(COMMAND ${CUOBJDUMP} -res-usage -arch ${ARCH} ${object}
                  OUTPUT_VARIABLE usage ERROR_VARIABLE usage_error RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    continue()  # an object without device code (the library's host files)
  endif()
  execute_process(COMMAND ${CUOBJDUMP} -sass -arch ${ARCH} ${object}
                  OUTPUT_VARIABLE sass ERROR_VARIABLE sass_error RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(SEND_ERROR "${object}: cuobjdump -sass failed: ${sass_error}")
    math(EXPR failures "${failures} + 1")
    continue()
  endif()
  # One list item per function: "Function : <name>" up to the next.
  string(REPLACE ";" "," sass "${sass}")
  string(REGEX REPLACE "\n[ \t]*Function : " ";FUNCTION:" functions "${sass}")
  foreach(function IN LISTS functions)
    if(NOT function MATCHES "^FUNCTION:([^\n]+)")
      continue()
    endif()
    set(name "${CMAKE_MATCH_1}")
    string(STRIP "${name}" name)
    if(NOT name MATCHES "${KERNEL}")
      continue()
    endif()
    math(EXPR found "${found} + 1")
    # Resource usage: " Function <name>:\n  REG:n STACK:n SHARED:n LOCAL:n ..."
    string(FIND "${usage}" "Function ${name}:" at)
    if(at LESS 0)
      message(SEND_ERROR "${name}: no resource usage from cuobjdump -res-usage")
      math(EXPR failures "${failures} + 1")
      continue()
    endif()
    string(SUBSTRING "${usage}" ${at} 400 entry)
    string(REGEX MATCH "REG:([0-9]+)" _ "${entry}")
    set(registers "${CMAKE_MATCH_1}")
    string(REGEX MATCH "STACK:([0-9]+)" _ "${entry}")
    set(stack "${CMAKE_MATCH_1}")
    string(REGEX MATCH "LOCAL:([0-9]+)" _ "${entry}")
    set(local "${CMAKE_MATCH_1}")
    # Instructions (opcodes after an optional predicate).
    string(REGEX MATCHALL "[ \t](LDG\\.E[.A-Z0-9_]*)[ \t]" ldg "${function}")
    string(REGEX MATCHALL "[ \t](STG\\.E[.A-Z0-9_]*)[ \t]" stg "${function}")
    string(REGEX MATCHALL "[ \t]CALL\\.REL" calls "${function}")
    string(REGEX MATCHALL "[ \t](LDL|STL)[. \t]" local_ops "${function}")
    set(ldg128 0)
    set(stg128 0)
    set(stg_other 0)
    foreach(op IN LISTS ldg)
      if(op MATCHES "LDG\\.E\\.128")
        math(EXPR ldg128 "${ldg128} + 1")
      endif()
    endforeach()
    foreach(op IN LISTS stg)
      if(op MATCHES "STG\\.E\\.128")
        math(EXPR stg128 "${stg128} + 1")
      else()
        math(EXPR stg_other "${stg_other} + 1")
      endif()
    endforeach()
    list(LENGTH ldg ldg_all)
    list(LENGTH calls call_count)
    list(LENGTH local_ops local_count)
    math(EXPR ldg_other "${ldg_all} - ${ldg128}")
    string(REGEX REPLACE "^.*(fast_rope_kernel|fast_store_kernel|_Z[0-9]+)" "\\1" short "${name}")
    string(APPEND summary "  ${short}: ${registers} registers, stack ${stack}, LDG.E.128 ${ldg128} (other loads "
                          "${ldg_other}), STG.E.128 ${stg128} (other stores ${stg_other}), CALL.REL ${call_count}, "
                          "LDL/STL ${local_count}\n")
    set(broken "")
    if(ldg128 EQUAL 0)
      list(APPEND broken "no 16-byte global load (LDG.E.128)")
    endif()
    if(stg128 EQUAL 0 OR (stg_other GREATER 0 AND NOT ALLOW_NARROW_STORES))
      list(APPEND broken "global stores not all 16 bytes (STG.E.128 ${stg128}, other ${stg_other})")
    endif()
    if(NOT DEFINED MAX_CALLS)
      set(MAX_CALLS 0)
    endif()
    if(call_count GREATER MAX_CALLS)
      list(APPEND broken "${call_count} CALL.REL (a subroutine: 64-bit division or modulo?)")
    endif()
    if(local_count GREATER 0 OR NOT stack EQUAL 0 OR NOT local EQUAL 0)
      list(APPEND broken "local memory (${local_count} LDL/STL, stack ${stack}, local ${local})")
    endif()
    if(registers GREATER MAX_REGISTERS)
      list(APPEND broken "${registers} registers > ${MAX_REGISTERS}")
    endif()
    foreach(rule IN LISTS broken)
      message(SEND_ERROR "${ARCH} ${name}: ${rule}")
      math(EXPR failures "${failures} + 1")
    endforeach()
  endforeach()
endforeach()
message(STATUS "${ARCH} kernels matching ${KERNEL}:\n${summary}")
if(NOT found EQUAL EXPECT_KERNELS)
  message(SEND_ERROR "${found} kernels match ${KERNEL} in ${ARCH} SASS, expected ${EXPECT_KERNELS}")
  math(EXPR failures "${failures} + 1")
endif()
if(failures GREATER 0)
  message(FATAL_ERROR "${failures} problem(s) in the ${ARCH} SASS")
endif()
message(STATUS "SASS: ${found} kernels with 16-byte loads and stores, no CALL.REL, no local memory, at most "
               "${MAX_REGISTERS} registers")
