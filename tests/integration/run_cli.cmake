# Runs one command and checks its exit code and output (stdout and stderr together).
#
#   cmake -DEXPECT_RC=<code> [-DEXPECT_RE=<regex>] [-DREJECT_RE=<regex>] [-DEXPECT_FILE=<path>]
#         -P run_cli.cmake -- <program> <args...>
#
# EXPECT_RC: the exit code wanted ("nonzero" accepts any failure code). EXPECT_RE must match the
# output; REJECT_RE must not. EXPECT_FILE must exist afterwards (it is removed first).
cmake_minimum_required(VERSION 3.25)

set(cmd)
set(after_dashes FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE 1 ${last})
  if(after_dashes)
    list(APPEND cmd "${CMAKE_ARGV${i}}")
  elseif("${CMAKE_ARGV${i}}" STREQUAL "--")
    set(after_dashes TRUE)
  endif()
endforeach()
if(NOT cmd)
  message(FATAL_ERROR "run_cli.cmake: no command given after --")
endif()
if(DEFINED EXPECT_FILE)
  file(REMOVE "${EXPECT_FILE}")
endif()

execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
string(REPLACE ";" " " shown "${cmd}")

if(EXPECT_RC STREQUAL "nonzero")
  if(rc STREQUAL "0")
    message(FATAL_ERROR "expected a failure exit code, got 0\ncommand: ${shown}\noutput:\n${all}")
  endif()
elseif(NOT rc STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "expected exit code ${EXPECT_RC}, got ${rc}\ncommand: ${shown}\noutput:\n${all}")
endif()
if(DEFINED EXPECT_RE AND NOT all MATCHES "${EXPECT_RE}")
  message(FATAL_ERROR "output does not match '${EXPECT_RE}'\ncommand: ${shown}\noutput:\n${all}")
endif()
if(DEFINED REJECT_RE AND all MATCHES "${REJECT_RE}")
  message(FATAL_ERROR "output matches '${REJECT_RE}'\ncommand: ${shown}\noutput:\n${all}")
endif()
if(DEFINED EXPECT_FILE AND NOT EXISTS "${EXPECT_FILE}")
  message(FATAL_ERROR "expected file '${EXPECT_FILE}' was not written\ncommand: ${shown}\noutput:\n${all}")
endif()
message(STATUS "ok (exit ${rc}): ${shown}")
