# One fuzz_<name> test (cmake -P): fuzzes HARNESS for SECONDS from a fresh corpus in WORK_DIR
# seeded with the inputs in SEED_DIRS (read, never written), with the extra libFuzzer
# OPTIONS. Fails when the harness does: a crash, a broken property, a timeout or running
# out of memory, whose input it saves in WORK_DIR as crash-*, timeout-* or oom-*.
foreach(_var HARNESS WORK_DIR SECONDS SEED_DIRS)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "run_fuzz.cmake: ${_var} is not set")
  endif()
endforeach()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR}/corpus)
foreach(_dir IN LISTS SEED_DIRS)
  if(NOT IS_DIRECTORY ${_dir})
    message(FATAL_ERROR "run_fuzz.cmake: seed directory ${_dir} is missing")
  endif()
endforeach()

execute_process(
  COMMAND ${HARNESS} -max_total_time=${SECONDS} -print_final_stats=1
          -artifact_prefix=${WORK_DIR}/ ${OPTIONS} ${WORK_DIR}/corpus ${SEED_DIRS}
  WORKING_DIRECTORY ${WORK_DIR}
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  file(GLOB _found ${WORK_DIR}/crash-* ${WORK_DIR}/timeout-* ${WORK_DIR}/oom-*
       ${WORK_DIR}/leak-*)
  message(FATAL_ERROR "${HARNESS} failed (${_rc}) on the input saved as: ${_found}\n"
                      "The same bytes as a file of the seed directories mean that file's bug is "
                      "back (or not fixed yet). Otherwise minimize it (${HARNESS} "
                      "-minimize_crash=1 -runs=100000 FILE) and keep it in "
                      "tests/fuzz/regressions/<name>/, named by what it found.")
endif()
