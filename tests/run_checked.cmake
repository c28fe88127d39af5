# run_checked.cmake — run(WHAT COMMAND...) for the tests' cmake -P scripts (include() it): runs
# the command, echoes its output, and fails the test, naming WHAT, the exit status and the
# command, unless it exits 0; its stdout is left in LAST_OUT for the script's own checks.
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "${what} failed (exit status ${rc}): ${ARGN}")
  endif()
  set(LAST_OUT "${out}" PARENT_SCOPE)
endfunction()
