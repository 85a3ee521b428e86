# Finding dependencies, with a fallback to ASYNCINFER_VENDOR_DIR for machines without Debian's
# packages (see the top-level CMakeLists.txt).

# asyncinfer_find_header_package(<package> <target> <header>): find_package(<package> CONFIG), or
# an imported INTERFACE <target> over ${ASYNCINFER_VENDOR_DIR}/include when <header> is there.
function(asyncinfer_find_header_package package target header)
  find_package(${package} CONFIG QUIET)
  if(${package}_FOUND)
    return()
  endif()
  if(ASYNCINFER_VENDOR_DIR AND EXISTS ${ASYNCINFER_VENDOR_DIR}/include/${header})
    add_library(${target} INTERFACE IMPORTED GLOBAL)
    target_include_directories(${target} SYSTEM INTERFACE ${ASYNCINFER_VENDOR_DIR}/include)
    message(STATUS "asyncinfer: ${package} from ${ASYNCINFER_VENDOR_DIR}/include")
    return()
  endif()
  message(FATAL_ERROR "asyncinfer: ${package} not found (Debian: see scripts/setup.sh), and no "
                      "${header} under ASYNCINFER_VENDOR_DIR")
endfunction()

# asyncinfer_find_gtest(): GoogleTest from the system, or built from
# ${ASYNCINFER_VENDOR_DIR}/googletest sources, as the targets GTest::gtest, GTest::gtest_main.
macro(asyncinfer_find_gtest)
  find_package(GTest QUIET)
  if(NOT GTest_FOUND)
    if(ASYNCINFER_VENDOR_DIR AND EXISTS ${ASYNCINFER_VENDOR_DIR}/googletest/CMakeLists.txt)
      set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
      set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
      add_subdirectory(${ASYNCINFER_VENDOR_DIR}/googletest ${CMAKE_BINARY_DIR}/_googletest
                       EXCLUDE_FROM_ALL)
      if(NOT TARGET GTest::gtest)  # googletest >= 1.11 defines these aliases itself
        add_library(GTest::gtest ALIAS gtest)
        add_library(GTest::gtest_main ALIAS gtest_main)
      endif()
      message(STATUS "asyncinfer: GoogleTest built from ${ASYNCINFER_VENDOR_DIR}/googletest")
    else()
      message(FATAL_ERROR "asyncinfer: GoogleTest not found (Debian: libgtest-dev), and no "
                          "googletest sources under ASYNCINFER_VENDOR_DIR")
    endif()
  endif()
endmacro()
