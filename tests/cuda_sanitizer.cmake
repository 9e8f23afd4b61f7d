# The device tests (test_cuda_device) under one of compute-sanitizer's tools, when a CUDA device is
# usable. First the program alone asks whether one is (its CudaDevice.RunsOnThisDevice test, which
# skips without one); without a device, or without compute-sanitizer, this prints
# "cuda_device_sanitizer: skipped (<why>)", which ctest shows as skipped (SKIP_REGULAR_EXPRESSION),
# so that the sanitizer is never started on a machine it cannot check (nor reported as failing where
# the tool itself says "Device not supported"). Else the program runs under
# `compute-sanitizer --tool TOOL --error-exitcode 1` (memcheck also checks for leaks), with the
# filter FILTER; any error the tool reports, a failing test or a test skipped under it fails.
# Usage: cmake -DPROGRAM=test_cuda_device -DSANITIZER=compute-sanitizer -DTOOL=memcheck
#              [-DFILTER=gtest-filter] -P cuda_sanitizer.cmake
foreach(variable PROGRAM TOOL)
  if(NOT ${variable})
    message(FATAL_ERROR "${variable} is not set")
  endif()
endforeach()

execute_process(COMMAND ${PROGRAM} --gtest_filter=CudaDevice.RunsOnThisDevice
                OUTPUT_VARIABLE probe ERROR_VARIABLE probe RESULT_VARIABLE status)
if(probe MATCHES "\\[  SKIPPED \\]")
  string(REGEX MATCH "no usable CUDA device \\([^\n]*\\)" why "${probe}")
  message("cuda_device_sanitizer: skipped (${why})")
  return()
endif()
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} failed on the device before the sanitizer ran:\n${probe}")
endif()
if(NOT SANITIZER)
  message("cuda_device_sanitizer: skipped (compute-sanitizer was not found in the CUDA toolkit's bin nor on "
          "the PATH; set ROTARY_COMPUTE_SANITIZER)")
  return()
endif()

set(options --tool ${TOOL} --error-exitcode 1)
if(TOOL STREQUAL "memcheck")
  list(APPEND options --leak-check full)
endif()
if(NOT FILTER)
  set(FILTER "*")
endif()
execute_process(COMMAND ${SANITIZER} ${options} ${PROGRAM} --gtest_filter=${FILTER}
                OUTPUT_VARIABLE output ERROR_VARIABLE output ECHO_OUTPUT_VARIABLE ECHO_ERROR_VARIABLE
                RESULT_VARIABLE status)
# Some sandboxed GPU runtimes (gVisor) give the tool no access to the device: it says so first.
if(output MATCHES "Device not supported")
  message("cuda_device_sanitizer: skipped (compute-sanitizer cannot check this device here: "
          "'Device not supported')")
  return()
endif()
if(NOT status EQUAL 0)
  message(FATAL_ERROR "compute-sanitizer --tool ${TOOL} failed (exit status ${status})")
endif()
if(output MATCHES "\\[  SKIPPED \\]")
  message(FATAL_ERROR "a device test skipped under compute-sanitizer --tool ${TOOL}")
endif()
if(NOT output MATCHES "\\[  PASSED  \\]")
  message(FATAL_ERROR "no test passed under compute-sanitizer --tool ${TOOL}")
endif()
