# Runs PROG with ARGS (a ;-list) and passes only if it exits with status EXIT (default 0) AND its
# output (stdout, then stderr) matches REGEX. Unlike ctest's PASS_REGULAR_EXPRESSION, which
# ignores the exit status, a program that prints the expected text and then fails (exit 1, a
# crash: a signal) fails the test. NOT_REGEX, when given, must not match. For failures that must name the problem on stderr, see
# expect_fail.cmake.
if(NOT DEFINED EXIT)
  set(EXIT 0)
endif()
execute_process(COMMAND ${PROG} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "${EXIT}")
  message(FATAL_ERROR "expected exit status ${EXIT}, got '${rc}'")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "the output does not match '${REGEX}'")
endif()
if(DEFINED NOT_REGEX AND "${out}${err}" MATCHES "${NOT_REGEX}")
  message(FATAL_ERROR "the output matches '${NOT_REGEX}', which it must not")
endif()
