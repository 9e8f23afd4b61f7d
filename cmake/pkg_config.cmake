# rotary.pc: pkg-config's view of the installed library, for C and C++ consumers.
#   cc app.c $(pkg-config --cflags --libs rotary)            shared library
#   cc app.c $(pkg-config --cflags --libs --static rotary)   static library: adds Libs.private
# Relocatable: the prefix is found from the file's own place (${pcfiledir}), so the package works
# wherever `cmake --install --prefix` put it. Needs ROTARY_LINK_NAMES and ROTARY_CXX_RUNTIME.

function(rotary_pc_path out dir)
  if(IS_ABSOLUTE "${dir}")
    set(${out} "${dir}" PARENT_SCOPE)
  else()
    set(${out} "\${prefix}/${dir}" PARENT_SCOPE)
  endif()
endfunction()

if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(ROTARY_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  # From <prefix>/<libdir>/pkgconfig back up to <prefix>.
  file(RELATIVE_PATH ROTARY_PC_UP "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
  string(REGEX REPLACE "/$" "" ROTARY_PC_UP "${ROTARY_PC_UP}")
  set(ROTARY_PC_PREFIX "\${pcfiledir}/${ROTARY_PC_UP}")
endif()
rotary_pc_path(ROTARY_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
rotary_pc_path(ROTARY_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")

# What the static librotary.a needs: its dependencies, OpenMP, and the C++ runtime for C programs.
set(ROTARY_PC_LIBS_PRIVATE "")
function(rotary_pc_add_libs)
  foreach(lib ${ARGN})
    if(lib MATCHES "^-" OR IS_ABSOLUTE "${lib}")
      string(APPEND ROTARY_PC_LIBS_PRIVATE " ${lib}")
    else()
      string(APPEND ROTARY_PC_LIBS_PRIVATE " -l${lib}")
    endif()
  endforeach()
  set(ROTARY_PC_LIBS_PRIVATE "${ROTARY_PC_LIBS_PRIVATE}" PARENT_SCOPE)
endfunction()
rotary_pc_add_libs(${ROTARY_LINK_NAMES} ${OpenMP_CXX_FLAGS} ${ROTARY_CXX_RUNTIME})

configure_file(${CMAKE_CURRENT_LIST_DIR}/rotary.pc.in ${CMAKE_CURRENT_BINARY_DIR}/rotary.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/rotary.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
