# Registers a GoogleTest binary's tests with CTest as groups, one process per group, at ctest time
# (tests/CMakeLists.txt, pipetrain_add_gtest_groups). Every process of a torch test binary spends
# about half a second of CPU loading LibTorch before its first test: with one process per test
# case that was a sixth of the suite's CPU time. A group is a test suite (Suite.*); a suite of
# more than MAX_PER_GROUP tests is cut into parts of at most that many (Suite.part1, ...), so that
# `ctest -j` still has pieces to spread over the cores. A failing test fails its group; the output
# names it (ctest --output-on-failure), and scripts/slowest-tests reads each test's own time and
# every skipped test back out of the log.
#
# Run by the include file of pipetrain_add_gtest_groups, which calls it when the binary is newer
# than OUT_FILE:
#   cmake -DTEST_EXECUTABLE=... -DOUT_FILE=... -DLABEL=... -DTIMEOUT=... -DMAX_PER_GROUP=...
#         -DWORKING_DIRECTORY=... -P cmake/GTestGroups.cmake
foreach(var TEST_EXECUTABLE OUT_FILE LABEL TIMEOUT MAX_PER_GROUP WORKING_DIRECTORY)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "GTestGroups.cmake needs -D${var}=...")
  endif()
endforeach()

execute_process(COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests
                WORKING_DIRECTORY "${WORKING_DIRECTORY}"
                RESULT_VARIABLE result OUTPUT_VARIABLE listing ERROR_VARIABLE errors TIMEOUT 120)
if(NOT result EQUAL 0)
  # A binary that cannot list its tests is one failing test, not a silently empty directory.
  file(WRITE "${OUT_FILE}"
       "add_test([=[${LABEL}.ListTests]=] [=[${TEST_EXECUTABLE}]=] --gtest_list_tests)\n"
       "set_tests_properties([=[${LABEL}.ListTests]=] PROPERTIES LABELS [=[${LABEL}]=])\n")
  message(WARNING "${TEST_EXECUTABLE} --gtest_list_tests failed (${result}): ${errors}")
  return()
endif()

# The listing: "Suite." lines (with "  # TypeParam = ..." after typed suites), then "  Test"
# lines (with "  # GetParam() = ..." after parameterized ones).
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
set(suite "")
foreach(line IN LISTS lines)
  string(REGEX REPLACE "  #.*$" "" line "${line}")
  if(line MATCHES "^  ([^ ]+)$")
    set(test "${CMAKE_MATCH_1}")
    if(suite STREQUAL "" OR test MATCHES "^DISABLED_" OR suite MATCHES "^DISABLED_")
      continue()
    endif()
    list(APPEND "tests_of_${suite_key}" "${test}")
  elseif(line MATCHES "^([^ ]+)\\.$")
    set(suite "${CMAKE_MATCH_1}")
    string(MAKE_C_IDENTIFIER "${suite}" suite_key)
    if(NOT suite MATCHES "^DISABLED_")
      list(APPEND suites "${suite}")
    endif()
  endif()
endforeach()

set(content "")
foreach(suite IN LISTS suites)
  string(MAKE_C_IDENTIFIER "${suite}" suite_key)
  set(tests ${tests_of_${suite_key}})
  list(LENGTH tests count)
  if(count EQUAL 0)
    continue()
  endif()
  math(EXPR parts "(${count} + ${MAX_PER_GROUP} - 1) / ${MAX_PER_GROUP}")
  math(EXPR last_part "${parts} - 1")
  foreach(part RANGE ${last_part})
    math(EXPR first "${part} * ${count} / ${parts}")
    math(EXPR end "(${part} + 1) * ${count} / ${parts}")
    math(EXPR last "${end} - 1")
    if(parts EQUAL 1)
      set(name "${suite}")
      set(filter "${suite}.*")
    else()
      math(EXPR number "${part} + 1")
      set(name "${suite}.part${number}")
      set(filter "")
      foreach(index RANGE ${first} ${last})
        list(GET tests ${index} test)
        string(APPEND filter ":${suite}.${test}")
      endforeach()
      string(SUBSTRING "${filter}" 1 -1 filter)
    endif()
    math(EXPR size "${end} - ${first}")
    # A group's limit grows with its size, up to three test limits: a hung test still ends it.
    math(EXPR limit "${TIMEOUT} + ${TIMEOUT} * (${size} - 1) / 4")
    math(EXPR cap "${TIMEOUT} * 3")
    if(limit GREATER cap)
      set(limit ${cap})
    endif()
    string(APPEND content
           "add_test([=[${name}]=] [=[${TEST_EXECUTABLE}]=] [=[--gtest_filter=${filter}]=])\n"
           "set_tests_properties([=[${name}]=] PROPERTIES LABELS [=[${LABEL}]=] TIMEOUT ${limit}"
           " WORKING_DIRECTORY [=[${WORKING_DIRECTORY}]=] COST ${size})\n")
  endforeach()
endforeach()
file(WRITE "${OUT_FILE}" "${content}")
