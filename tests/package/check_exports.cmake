# rotary_check_exports(library nm): the dynamic symbols `library` defines are rotary's own and
# nothing else: the C ABI (rotary_*) and the C++ API (rotary::..., with the typeinfo and vtables
# of its classes), never rotary::detail nor anything of Highway, fmt, nlohmann::json or the
# standard library. Fails listing the first foreign symbols.
function(rotary_check_exports library nm)
  execute_process(COMMAND ${nm} -D --defined-only -C ${library} RESULT_VARIABLE result
                  OUTPUT_VARIABLE text ERROR_VARIABLE error)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${nm} -D --defined-only -C ${library} failed: ${error}")
  endif()
  # Brackets ([abi:cxx11]) and semicolons would confuse CMake's lists.
  string(REPLACE "[" "<" text "${text}")
  string(REPLACE "]" ">" text "${text}")
  string(REPLACE ";" "," text "${text}")
  string(REGEX MATCHALL "[^\n]+" lines "${text}")
  set(prefix "^((typeinfo|typeinfo name|vtable|VTT|construction vtable) for )?")
  set(foreign "")
  set(foreign_count 0)
  set(c_count 0)
  set(cxx_count 0)
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^[0-9a-fA-F]+ [A-Za-z] (.+)$")
      continue()
    endif()
    set(name "${CMAKE_MATCH_1}")
    if(name MATCHES "^rotary_[A-Za-z0-9_]+$")
      math(EXPR c_count "${c_count} + 1")
    elseif(name MATCHES "${prefix}rotary::" AND NOT name MATCHES "${prefix}rotary::detail")
      math(EXPR cxx_count "${cxx_count} + 1")
    else()
      math(EXPR foreign_count "${foreign_count} + 1")
      if(foreign_count LESS_EQUAL 20)
        string(APPEND foreign "\n  ${name}")
      endif()
    endif()
  endforeach()
  if(foreign_count GREATER 0)
    message(FATAL_ERROR "${library} exports ${foreign_count} symbols that are not rotary's "
                        "public API (cmake/rotary.map decides), the first:${foreign}")
  endif()
  if(NOT text MATCHES " rotary_apply\n" OR NOT text MATCHES " rotary::apply\\(" OR
     NOT text MATCHES "typeinfo for rotary::Error")
    message(FATAL_ERROR "${library} lacks rotary_apply, rotary::apply or the typeinfo of "
                        "rotary::Error among its ${c_count} C and ${cxx_count} C++ exports")
  endif()
  message(STATUS "${library}: ${c_count} C and ${cxx_count} C++ symbols exported, nothing else")
endfunction()
