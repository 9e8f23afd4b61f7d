# A C++17 program including <rotary/rotary.hpp> fails to compile, and its first error is rotary's
# own: "rotary needs C++20 (-std=c++20)". The same program compiles as C++20.
# In: CXX_COMPILER, INCLUDE_DIR, SOURCE.
execute_process(COMMAND ${CXX_COMPILER} -std=c++17 -fsyntax-only -I${INCLUDE_DIR} ${SOURCE}
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(result EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled as C++17; rotary.hpp must refuse it")
endif()
string(REGEX MATCH "error: [^\n]*" first "${err}")
if(NOT first MATCHES "rotary needs C\\+\\+20 \\(-std=c\\+\\+20\\)")
  message(FATAL_ERROR "the first C++17 error is not rotary's #error but: ${first}\n${err}")
endif()
execute_process(COMMAND ${CXX_COMPILER} -std=c++20 -fsyntax-only -I${INCLUDE_DIR} ${SOURCE}
                RESULT_VARIABLE result ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${SOURCE} does not compile as C++20 either:\n${err}")
endif()
message(STATUS "C++17: ${first}")
